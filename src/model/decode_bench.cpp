#include "model/decode_bench.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "model/causal_lm.h"
#include "model/rank_group.h"

namespace shardlm {

DecodeBenchResult decode_bench(const ModelSpec& spec, std::shared_ptr<const WeightSource> weights,
                               const DecodeBenchOptions& o) {
  if (o.batch < 1 || o.context < 1 || o.n_steps < 1 || o.n_warmup < 0 || o.block_size < 1)
    fail(ErrorCode::kInvalidArgument, "decode bench: batch, context, steps and block size must be >= 1, got batch ",
         o.batch, ", context ", o.context, ", steps ", o.n_steps, ", block size ", o.block_size);
  const int64_t last = o.context + o.n_warmup + o.n_steps;
  if (last > spec.max_position_embeddings)
    fail(ErrorCode::kInvalidArgument, "decode bench: context ", o.context, " + ", o.n_warmup + o.n_steps,
         " steps exceeds the model's ", spec.max_position_embeddings, " positions");
  validate_layout(spec, o.layout);
  const int n_ranks = o.layout.tp * o.layout.pp;
  const int64_t blocks_per_seq = (last + o.block_size - 1) / o.block_size;
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  DecodeBenchResult result;
  std::mutex mu;
  int64_t weight_bytes = 0, kv_bytes_per_token = 0;
  run_rank_group(o.layout, o.device, std::max(1, static_cast<int>(hw) / n_ranks), [&](RankContext& r) {
    auto model = CausalLM::load(spec, weights, o.layout, r.tp_rank, r.pp_rank, *r.comms.tp, *r.comms.pp, r.backend);
    KvCache cache = model->make_kv_cache(o.batch * blocks_per_seq, o.block_size, o.kv_dtype);
    {
      std::lock_guard<std::mutex> lock(mu);
      weight_bytes += model->weight_bytes();
      kv_bytes_per_token += model->kv_block_bytes(o.block_size, o.kv_dtype) / o.block_size;
    }
    // Sequence s owns blocks [s × blocks_per_seq, (s + 1) × blocks_per_seq);
    // its cached keys and values are whatever the cache holds (zeros): the
    // work per step does not depend on them.
    ForwardBatch batch;
    batch.seqs.resize(static_cast<size_t>(o.batch));
    batch.token_ids.resize(static_cast<size_t>(o.batch));
    for (int64_t s = 0; s < o.batch; ++s) {
      SequenceChunk& c = batch.seqs[static_cast<size_t>(s)];
      c.n_tokens = 1;
      c.need_logits = true;
      for (int64_t b = 0; b < blocks_per_seq; ++b) c.block_table.push_back(static_cast<int32_t>(s * blocks_per_seq + b));
      batch.token_ids[static_cast<size_t>(s)] = static_cast<int32_t>((s * 7919 + 1) % spec.vocab_size);
    }
    std::vector<float> logits(static_cast<size_t>(o.batch * spec.vocab_size));
    auto step = [&](int64_t i) {
      for (auto& c : batch.seqs) c.n_past = static_cast<int32_t>(o.context + i);
      model->forward(batch, cache, model->is_driver() ? logits.data() : nullptr);
    };
    for (int64_t i = 0; i < o.n_warmup; ++i) step(i);
    r.world.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < o.n_steps; ++i) step(o.n_warmup + i);
    r.backend->synchronize();
    r.world.barrier();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (model->is_driver()) {
      std::lock_guard<std::mutex> lock(mu);
      result.seconds = seconds;
    }
  });
  result.n_steps = o.n_steps;
  result.tokens_per_second = static_cast<double>(o.batch * o.n_steps) / std::max(result.seconds, 1e-12);
  result.weight_bytes = weight_bytes;
  // Mean context over the timed steps: context + warmup + (steps + 1) / 2 positions.
  const int64_t mean_positions = o.context + o.n_warmup + (o.n_steps + 1) / 2;
  result.kv_bytes_read = o.batch * mean_positions * kv_bytes_per_token;
  return result;
}

}  // namespace shardlm
