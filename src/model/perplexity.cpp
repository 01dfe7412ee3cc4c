#include "model/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <mutex>
#include <thread>

#include "backend/backend.h"
#include "comm/local_comm.h"
#include "core/error.h"
#include "model/causal_lm.h"
#include "model/rank_group.h"
#include "model/generate.h"

namespace shardlm {

double PerplexityResult::perplexity() const { return std::exp(mean_nll()); }

namespace {

// -log softmax(logits)[target], in double.
double token_nll(const float* logits, int64_t vocab, int32_t target) {
  float max = logits[0];
  for (int64_t i = 1; i < vocab; ++i) max = std::max(max, logits[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - max);
  return std::log(sum) - (static_cast<double>(logits[target]) - max);
}

}  // namespace

PerplexityResult perplexity_local(const ModelSpec& spec, std::shared_ptr<const WeightSource> weights,
                                  const std::vector<int32_t>& ids, const PerplexityOptions& opt) {
  const int64_t context = opt.context > 0 ? opt.context : spec.max_position_embeddings;
  if (context < 1 || context > spec.max_position_embeddings)
    fail(ErrorCode::kInvalidArgument, "perplexity: --context ", opt.context, " is outside [1, ",
         spec.max_position_embeddings, "] (", spec.max_position_source(), ")");
  if (ids.size() < 2) fail(ErrorCode::kInvalidArgument, "perplexity: the text encodes to ", ids.size(),
                           " token(s); it needs at least 2 (one to predict from, one to score)");
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= spec.vocab_size)
      fail(ErrorCode::kInvalidArgument, "perplexity: token ", i, " is id ", ids[i], ", outside the vocabulary [0, ",
           spec.vocab_size, ")");
  validate_layout(spec, opt.layout);
  if (opt.layout.dp != 1) fail(ErrorCode::kInvalidArgument, "perplexity runs one replica; use --dp 1");

  // Windows [begin, end] inclusive: end - begin scored tokens each.
  std::vector<std::pair<int64_t, int64_t>> windows;
  int64_t budget = opt.max_scored > 0 ? opt.max_scored : static_cast<int64_t>(ids.size());
  for (int64_t b = 0; b + 1 < static_cast<int64_t>(ids.size()) && budget > 0; b += context) {
    const int64_t n = std::min({context, static_cast<int64_t>(ids.size()) - 1 - b, budget});
    windows.push_back({b, b + n});
    budget -= n;
  }

  GenerateOptions g;
  g.layout = opt.layout;
  g.kv_dtype = opt.kv_dtype;
  g.block_size = opt.block_size;
  const int64_t n_blocks = (context + 1 + opt.block_size - 1) / opt.block_size;
  const int n_ranks = opt.layout.tp * opt.layout.pp;
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  PerplexityResult result;
  std::mutex mu;
  const auto t0 = std::chrono::steady_clock::now();
  run_rank_group(opt.layout, opt.device, std::max(1, static_cast<int>(hw) / n_ranks), [&](RankContext& r) {
    Communicator& world = r.world;
    auto model = CausalLM::load(spec, weights, opt.layout, r.tp_rank, r.pp_rank, *r.comms.tp, *r.comms.pp, r.backend);
    KvCache cache = model->make_kv_cache(n_blocks, opt.block_size, opt.kv_dtype);
    auto step = [&](const ForwardBatch& batch, float* logits) { model->forward(batch, cache, logits); };
    double nll = 0.0;
    int64_t scored = 0;
    std::vector<int32_t> top1;
    for (const auto& [begin, end] : windows) {
      GenerateOptions w = g;
      w.max_tokens = end - begin;
      w.long_context = spec.long_context(end - begin);
      // The driver scores the true next token and feeds it instead of a sampled one.
      w.pick = [&, begin = begin](const float* logits, int64_t vocab, const std::vector<int32_t>& generated) {
        const int32_t target = ids[static_cast<size_t>(begin + 1) + generated.size()];
        nll += token_nll(logits, vocab, target);
        top1.push_back(argmax_token(logits, vocab));
        ++scored;
        return target;
      };
      generate_steps(step, spec.vocab_size, n_blocks, {ids[static_cast<size_t>(begin)]}, w, false, &world,
                     model->is_driver());
    }
    if (model->is_driver()) {
      std::lock_guard<std::mutex> lock(mu);
      result.nll_sum = nll;
      result.n_scored = scored;
      result.top1 = std::move(top1);
    }
  });
  result.n_windows = static_cast<int64_t>(windows.size());
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

}  // namespace shardlm
