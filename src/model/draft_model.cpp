#include "model/draft_model.h"

#include <algorithm>
#include <fstream>

#include <nlohmann/json.hpp>

#include "comm/local_comm.h"
#include "core/error.h"
#include "model/weight_source.h"
#include "model/forward_batch.h"
#include "model/generate.h"

namespace shardlm {
namespace {

// tokenizer.json's id map: model.vocab (token -> id) and added_tokens (id, content).
struct TokenizerIds {
  nlohmann::json vocab;
  std::vector<std::pair<int64_t, std::string>> added;
};

TokenizerIds tokenizer_ids(const std::filesystem::path& file) {
  std::ifstream in(file);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    fail(ErrorCode::kInvalidArgument, file.string(), ": not a JSON object (a tokenizer.json was expected)");
  TokenizerIds ids;
  if (j.contains("model") && j["model"].is_object() && j["model"].contains("vocab")) ids.vocab = j["model"]["vocab"];
  if (j.contains("added_tokens") && j["added_tokens"].is_array())
    for (const auto& t : j["added_tokens"])
      if (t.is_object() && t.contains("id") && t["id"].is_number_integer() && t.contains("content") &&
          t["content"].is_string())
        ids.added.emplace_back(t["id"].get<int64_t>(), t["content"].get<std::string>());
  std::sort(ids.added.begin(), ids.added.end());
  return ids;
}

}  // namespace

void check_draft_vocabulary(const std::filesystem::path& target_dir, const ModelSpec& target,
                            const std::filesystem::path& draft_dir, const ModelSpec& draft) {
  const std::filesystem::path tt = target_dir / "tokenizer.json", dt = draft_dir / "tokenizer.json";
  const bool t_has = std::filesystem::exists(tt), d_has = std::filesystem::exists(dt);
  const std::string names = " (target " + target_dir.string() + ", draft " + draft_dir.string() + ")";
  if (t_has && d_has) {
    const TokenizerIds a = tokenizer_ids(tt), b = tokenizer_ids(dt);
    if (a.vocab != b.vocab || a.added != b.added)
      fail(ErrorCode::kInvalidArgument, "--speculative-config \"model\": the draft's tokenizer is not the target's",
           names, ": ", dt.string(), " maps tokens to other ids than ", tt.string(),
           "; a draft must share the target's vocabulary (the same tokenizer family and version)");
    return;
  }
  if (t_has != d_has)
    fail(ErrorCode::kInvalidArgument, "--speculative-config \"model\": only the ", t_has ? "target" : "draft",
         " has a tokenizer.json", names, ", so the two vocabularies cannot be compared; add the draft's tokenizer");
  if (target.vocab_size != draft.vocab_size)
    fail(ErrorCode::kInvalidArgument, "--speculative-config \"model\": the draft's vocab_size ", draft.vocab_size,
         " is not the target's ", target.vocab_size, names, "; a draft must share the target's vocabulary");
}

DraftModel::DraftModel(const std::filesystem::path& dir, int64_t target_vocab,
                       std::shared_ptr<backend::Backend> backend, int64_t max_len, int64_t block_size,
                       DType kv_dtype)
    : spec_(load_model_config(dir / "config.json")),
      vocab_(std::min(target_vocab, spec_.vocab_size)),
      max_len_(std::min<int64_t>(max_len, spec_.max_position_embeddings)) {
  for (int i = 0; i < 2; ++i) comms_.push_back(std::move(LocalComm::create_world(1)[0]));
  model_ = CausalLM::load(spec_, open_checkpoint(dir), Layout{}, 0, 0, *comms_[0], *comms_[1], std::move(backend));
  const int64_t n_blocks = (max_len_ + block_size) / block_size;  // max_len_ positions, and one spare
  cache_ = model_->make_kv_cache(n_blocks, block_size, kv_dtype);
  table_.resize(static_cast<size_t>(n_blocks));
  for (int64_t b = 0; b < n_blocks; ++b) table_[static_cast<size_t>(b)] = static_cast<int32_t>(b);
  logits_.resize(static_cast<size_t>(spec_.vocab_size));
}

DraftModel::~DraftModel() = default;

int64_t DraftModel::weight_bytes() const { return model_->weight_bytes(); }

std::vector<int32_t> DraftModel::propose(std::span<const int32_t> context, int64_t max_draft) {
  // Past its own context length the draft has nothing to say.
  const int64_t k = std::min<int64_t>(max_draft, max_len_ - static_cast<int64_t>(context.size()));
  if (k <= 0 || context.empty()) return {};
  // Keep the KV of the longest prefix fed before that the context still has
  // (the prompt, the accepted drafts); a rejected draft's slots are overwritten.
  size_t keep = 0;
  while (keep < fed_.size() && keep < context.size() && fed_[keep] == context[keep]) ++keep;
  if (keep == context.size()) --keep;  // the last token is fed again: its logits propose the first draft
  fed_.resize(keep);
  auto feed = [&](std::span<const int32_t> tokens) {
    ForwardBatch batch;
    batch.token_ids.assign(tokens.begin(), tokens.end());
    SequenceChunk c;
    c.n_tokens = static_cast<int32_t>(tokens.size());
    c.n_past = static_cast<int32_t>(fed_.size());
    c.block_table = table_;
    c.need_logits = true;
    batch.seqs.push_back(c);
    model_->forward(batch, cache_, logits_.data());
    fed_.insert(fed_.end(), tokens.begin(), tokens.end());
    return argmax_token(logits_.data(), vocab_);
  };
  std::vector<int32_t> draft;
  draft.push_back(feed(context.subspan(keep)));
  while (static_cast<int64_t>(draft.size()) < k) draft.push_back(feed(std::span<const int32_t>(&draft.back(), 1)));
  return draft;
}

}  // namespace shardlm
