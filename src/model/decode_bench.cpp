#include "model/decode_bench.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "model/causal_lm.h"
#include "model/rank_group.h"

namespace shardlm {

std::vector<DecodeBenchResult> decode_bench_batches(const ModelSpec& spec, std::shared_ptr<const WeightSource> weights,
                                                    const DecodeBenchOptions& o, const std::vector<int64_t>& batches) {
  int64_t max_batch = 0;
  for (int64_t b : batches) max_batch = std::max(max_batch, b);
  const int64_t min_batch = batches.empty() ? 0 : *std::min_element(batches.begin(), batches.end());
  if (min_batch < 1 || o.context < 1 || o.n_steps < 1 || o.n_warmup < 0 || o.block_size < 1)
    fail(ErrorCode::kInvalidArgument, "decode bench: batch, context, steps and block size must be >= 1, got batch ",
         min_batch, ", context ", o.context, ", steps ", o.n_steps, ", block size ", o.block_size);
  const int64_t last = o.context + o.n_warmup + o.n_steps;
  if (last > spec.max_position_embeddings)
    fail(ErrorCode::kInvalidArgument, "decode bench: context ", o.context, " + ", o.n_warmup + o.n_steps,
         " steps exceeds the model's ", spec.max_position_embeddings, " positions");
  validate_layout(spec, o.layout);
  const int n_ranks = o.layout.tp * o.layout.pp;
  const int64_t blocks_per_seq = (last + o.block_size - 1) / o.block_size;
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  std::vector<DecodeBenchResult> results(batches.size());
  std::mutex mu;
  int64_t weight_bytes = 0, embedding_only_bytes = 0, kv_bytes_per_token = 0;
  double prefill_seconds = 0.0;
  run_rank_group(o.layout, o.device, std::max(1, static_cast<int>(hw) / n_ranks), [&](RankContext& r) {
    auto model = CausalLM::load(spec, weights, o.layout, r.tp_rank, r.pp_rank, *r.comms.tp, *r.comms.pp, r.backend);
    KvCache cache = model->make_kv_cache(max_batch * blocks_per_seq, o.block_size, o.kv_dtype);
    {
      std::lock_guard<std::mutex> lock(mu);
      weight_bytes += model->weight_bytes();
      embedding_only_bytes += model->embedding_only_bytes();
      kv_bytes_per_token += model->kv_block_bytes(o.block_size, o.kv_dtype) / o.block_size;
    }
    std::string graphs;
    if (o.graphs.enabled) {
      backend::DecodeGraphOptions g = o.graphs;
      g.max_batch = std::min(max_batch, std::max<int64_t>(g.max_batch, 1));
      g.max_context = last;
      graphs = model->enable_decode_graphs(g);
    }
    std::vector<float> logits(static_cast<size_t>(max_batch * spec.vocab_size));
    {
      // Prefill: sequence 0's `context` tokens in one chunk (eager, as the
      // engine runs prefill), once to warm up, then timed.
      ForwardBatch prefill;
      SequenceChunk& c = prefill.seqs.emplace_back();
      c.n_tokens = static_cast<int32_t>(o.context);
      c.n_past = 0;
      c.need_logits = true;
      for (int64_t b = 0; b < blocks_per_seq; ++b) c.block_table.push_back(static_cast<int32_t>(b));
      for (int64_t t = 0; t < o.context; ++t)
        prefill.token_ids.push_back(static_cast<int32_t>((t * 104729 + 3) % spec.vocab_size));
      model->forward(prefill, cache, model->is_driver() ? logits.data() : nullptr);
      r.backend->synchronize();
      r.world.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      model->forward(prefill, cache, model->is_driver() ? logits.data() : nullptr);
      r.backend->synchronize();
      r.world.barrier();
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (model->is_driver()) {
        std::lock_guard<std::mutex> lock(mu);
        prefill_seconds = seconds;
      }
    }
    for (size_t k = 0; k < batches.size(); ++k) {
      // Sequence s owns blocks [s × blocks_per_seq, (s + 1) × blocks_per_seq);
      // its cached keys and values are whatever the cache holds: the work of
      // a step does not depend on them.
      const int64_t n = batches[k];
      ForwardBatch batch;
      batch.seqs.resize(static_cast<size_t>(n));
      batch.token_ids.resize(static_cast<size_t>(n));
      for (int64_t s = 0; s < n; ++s) {
        SequenceChunk& c = batch.seqs[static_cast<size_t>(s)];
        c.n_tokens = 1;
        c.need_logits = true;
        for (int64_t b = 0; b < blocks_per_seq; ++b) c.block_table.push_back(static_cast<int32_t>(s * blocks_per_seq + b));
        batch.token_ids[static_cast<size_t>(s)] = static_cast<int32_t>((s * 7919 + 1) % spec.vocab_size);
      }
      const backend::DecodeGraphs* dg = model->decode_graphs();
      const int64_t replays_before = dg ? dg->cache().n_replays() : 0;
      auto step = [&](int64_t i) {
        for (auto& c : batch.seqs) c.n_past = static_cast<int32_t>(o.context + i);
        model->forward(batch, cache, model->is_driver() ? logits.data() : nullptr);
      };
      for (int64_t i = 0; i < o.n_warmup; ++i) step(i);
      r.backend->synchronize();
      r.world.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t i = 0; i < o.n_steps; ++i) step(o.n_warmup + i);
      r.backend->synchronize();
      r.world.barrier();
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (model->is_driver()) {
        std::lock_guard<std::mutex> lock(mu);
        results[k].seconds = seconds;
        results[k].graphs = graphs;
        results[k].graph_replays = dg ? dg->cache().n_replays() - replays_before : 0;
      }
    }
  }, o.batch_invariant);
  // Mean context over the timed steps: context + warmup + (steps + 1) / 2 positions.
  const int64_t mean_positions = o.context + o.n_warmup + (o.n_steps + 1) / 2;
  for (size_t k = 0; k < batches.size(); ++k) {
    DecodeBenchResult& res = results[k];
    res.n_steps = o.n_steps;
    res.tokens_per_second = static_cast<double>(batches[k] * o.n_steps) / std::max(res.seconds, 1e-12);
    res.weight_bytes = weight_bytes;
    // An unstreamed table: one row of it per sequence (held by one TP rank).
    res.weight_bytes_read = weight_bytes - embedding_only_bytes;
    if (embedding_only_bytes > 0) res.weight_bytes_read += batches[k] * spec.hidden_size * dtype_size(spec.dtype);
    res.kv_bytes_read = batches[k] * mean_positions * kv_bytes_per_token;
    res.prefill_tokens = o.context;
    res.prefill_seconds = prefill_seconds;
  }
  return results;
}

DecodeBenchResult decode_bench(const ModelSpec& spec, std::shared_ptr<const WeightSource> weights,
                               const DecodeBenchOptions& o) {
  return decode_bench_batches(spec, std::move(weights), o, {o.batch}).front();
}

}  // namespace shardlm
