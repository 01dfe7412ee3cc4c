#include "backend/device/decode_graphs.h"

#include "core/error.h"

namespace shardlm::backend {

bool parse_cuda_graphs_flag(const std::string& value, bool device_is_gpu) {
  if (value.empty()) return device_is_gpu;
  if (value != "on" && value != "off")
    fail(ErrorCode::kInvalidArgument, "--cuda-graphs ", value, ": expected on or off");
  if (value == "on" && !device_is_gpu)
    fail(ErrorCode::kInvalidArgument, "--cuda-graphs on needs a GPU (--device cuda): the CPU backend runs its ops as "
         "they are called and has no graphs to capture; drop the flag or use --cuda-graphs off");
  return value == "on";
}

const char* graph_skip_name(GraphSkip skip) {
  switch (skip) {
    case GraphSkip::kNone: return "none";
    case GraphSkip::kOff: return "graphs off";
    case GraphSkip::kNotAllDecode: return "not every sequence decodes one token with logits";
    case GraphSkip::kTooManyRows: return "more sequences than the largest bucket";
    case GraphSkip::kContextTooLong: return "a context longer than the graphs' bound";
  }
  return "?";
}

GraphSkip graph_skip_reason(const DecodeGraphOptions& options, int64_t n_seqs, bool all_decode_with_logits,
                            int64_t max_context) {
  if (!options.enabled) return GraphSkip::kOff;
  if (n_seqs < 1 || !all_decode_with_logits) return GraphSkip::kNotAllDecode;
  if (n_seqs > options.max_batch) return GraphSkip::kTooManyRows;
  if (max_context > options.max_context) return GraphSkip::kContextTooLong;
  return GraphSkip::kNone;
}

namespace {
DecodeGraphCache make_cache(const DecodeGraphOptions& o) {
  if (o.max_batch < 1 || o.max_batch > (1 << 20))
    fail(ErrorCode::kInvalidArgument, "CUDA graphs: the largest decode batch ", o.max_batch, " must be in [1, 2^20]");
  if (o.max_context < 1)
    fail(ErrorCode::kInvalidArgument, "CUDA graphs: the context bound ", o.max_context, " must be >= 1");
  return DecodeGraphCache(default_graph_buckets(static_cast<int>(o.max_batch)), /*warmup_steps=*/1);
}
}  // namespace

DecodeGraphs::DecodeGraphs(DecodeGraphOptions options, std::unique_ptr<GraphStepRunner> runner,
                           std::function<void(const std::string&)> log)
    : options_(options), runner_(std::move(runner)), log_(std::move(log)), cache_(make_cache(options)) {
  SHARDLM_CHECK(runner_ != nullptr, "DecodeGraphs needs the backend's graph runner");
}

int DecodeGraphs::bucket_for(int64_t n_seqs, bool all_decode_with_logits, int64_t max_context) const {
  if (graph_skip_reason(options_, n_seqs, all_decode_with_logits, max_context) != GraphSkip::kNone) return -1;
  return choose_graph_bucket(cache_.buckets(), static_cast<int>(n_seqs));
}

void DecodeGraphs::invalidate() {
  cache_.invalidate();
  runner_->clear();
  have_key_ = false;
  ++n_invalidations_;
}

GraphAction DecodeGraphs::run(int bucket, const GraphBufferKey& key) {
  SHARDLM_CHECK(choose_graph_bucket(cache_.buckets(), bucket) == bucket, "CUDA graphs: ", bucket, " is not a bucket");
  if (have_key_ && !(key == key_)) invalidate();
  key_ = key;
  have_key_ = true;
  const GraphAction action = cache_.step(bucket, *runner_);
  if (cache_.state(bucket) == GraphState::kFailed && failures_logged_.insert(bucket).second && log_)
    log_(str_cat("CUDA graphs: capturing the decode step of batch ", bucket, " failed (", cache_.failure(bucket),
                 "); steps of that batch size run eagerly"));
  return action;
}

std::string DecodeGraphs::describe() const {
  const std::vector<int>& b = cache_.buckets();
  std::string list;
  for (size_t i = 0; i < b.size(); ++i) {
    if (b.size() > 8 && i == 5) {
      list += " ...";
      i = b.size() - 2;
      continue;
    }
    if (i) list += ' ';
    list += std::to_string(b[i]);
  }
  return str_cat("on: decode batches 1 to ", b.back(), " in ", b.size(), " buckets (", list, "), contexts up to ",
                 options_.max_context, " tokens");
}

}  // namespace shardlm::backend
