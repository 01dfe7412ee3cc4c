// The step buffers a rank's model allocates, measured by its backend's
// allocator, against plan's workspace_breakdown (the figure plan and serve's
// memory budget subtract before sizing the KV cache). The host-side sampler's
// part (WorkspaceBreakdown::sampler) is not the backend's and is left out.
#include <gtest/gtest.h>

#include <mutex>
#include <vector>

#include "model/causal_lm.h"
#include "model/rank_group.h"
#include "plan/memory_budget.h"
#include "random_weights.h"

namespace shardlm {
namespace {

struct Measured {
  int64_t bytes = 0;
  int tp_rank = 0, pp_rank = 0;
};

std::vector<Measured> measure_step_buffers(const ModelSpec& spec, const Layout& layout, int64_t n_tokens,
                                           int64_t n_seqs) {
  auto w = testing::random_weights(spec, 11);
  std::vector<Measured> out;
  std::mutex mu;
  run_rank_group(layout, Device{}, 1, [&](RankContext& r) {
    auto model = CausalLM::load(spec, w, layout, r.tp_rank, r.pp_rank, *r.comms.tp, *r.comms.pp, r.backend);
    const int64_t block = 16, per_seq = (n_tokens / n_seqs + block) / block;
    KvCache cache = model->make_kv_cache(n_seqs * per_seq, block, DType::kF32);
    const int64_t before = r.backend->allocated_bytes();
    // One step of n_tokens over n_seqs sequences, each wanting logits: the
    // largest step serve runs at max_num_batched_tokens / max_num_seqs.
    ForwardBatch batch;
    for (int64_t s = 0; s < n_seqs; ++s) {
      SequenceChunk& c = batch.seqs.emplace_back();
      c.n_tokens = static_cast<int32_t>(n_tokens / n_seqs);
      c.need_logits = true;
      for (int64_t b = 0; b < per_seq; ++b) c.block_table.push_back(static_cast<int32_t>(s * per_seq + b));
    }
    for (int64_t t = 0; t < n_tokens; ++t) batch.token_ids.push_back(static_cast<int32_t>((t * 31 + 7) % spec.vocab_size));
    std::vector<float> logits(static_cast<size_t>(n_seqs * spec.vocab_size));
    model->forward(batch, cache, model->is_driver() ? logits.data() : nullptr);
    std::lock_guard<std::mutex> lock(mu);
    out.push_back({r.backend->allocated_bytes() - before, r.tp_rank, r.pp_rank});
  });
  return out;
}

void expect_plan_matches(const ModelSpec& spec, const Layout& layout) {
  MemoryBudgetOptions o;
  o.max_num_batched_tokens = 96;
  o.max_num_seqs = 4;
  for (const Measured& m : measure_step_buffers(spec, layout, o.max_num_batched_tokens, o.max_num_seqs)) {
    const WorkspaceBreakdown w = workspace_breakdown(spec, layout, m.tp_rank, m.pp_rank, o);
    EXPECT_EQ(m.bytes, w.total() - w.sampler)
        << layout.to_string() << " rank tp " << m.tp_rank << " pp " << m.pp_rank << ": hidden " << w.hidden
        << ", attention " << w.attention << ", mlp " << w.mlp << ", logits " << w.logits;
  }
}

TEST(WorkspaceAccounting, DenseModelAtTp1Tp3AndPp2) {
  const ModelSpec spec = testing::qwen25_7b_like(256, 2, 320, 500);
  expect_plan_matches(spec, Layout{});
  Layout tp3;
  tp3.tp = 3;  // 28 Q heads over 3 (10, 9, 9); 4 KV heads replicated
  expect_plan_matches(spec, tp3);
  Layout pp2;
  pp2.pp = 2;
  expect_plan_matches(spec, pp2);
}

}  // namespace
}  // namespace shardlm
