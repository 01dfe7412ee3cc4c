// CPU kernels of a mixture-of-experts block: routing (softmax, top-k,
// renormalisation) and the experts' SwiGLU MLPs over the tokens routed to
// them. Each has a scalar reference (namespace ref) the grouped version is
// tested against; Backend::moe_route / moe_experts call these on the CPU.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cpu/ops.h"

namespace shardlm::backend {

// ids[t, j], weights[t, j] for j < top_k: the top_k experts of token t by
// router logit (ties: the lower id first), in decreasing order, and their
// softmax probabilities over all n_experts; with renormalize, divided by their
// sum (Qwen3-MoE norm_topk_prob; Mixtral, whose softmax over the selected
// logits is the same thing). logits: [n, n_experts].
void moe_route(const float* logits, int64_t n, int64_t n_experts, int64_t top_k, bool renormalize, int32_t* ids,
               float* weights);

// One expert as a rank holds it: gate, up [inter, hidden] and down
// [hidden, inter] (inter: this rank's columns of the expert).
struct ExpertMatrices {
  MatrixView gate, up, down;
};

// Reusable buffers of moe_experts, grown when a step routes more rows than
// any before (so steady-state steps allocate nothing).
struct MoeScratch {
  std::vector<int32_t> counts, offsets, token, slot;  // [n_local + 1], [n_local + 1], [rows], [rows]
  std::vector<float> route_weight;                    // [rows]
  std::vector<float> xs, gate, up, ys;                // one expert's rows: [≤ n, hidden], [≤ n, inter] ×2, [≤ n, hidden]
};

// out[t, :] = Σ_j weights[t, j] × down_e(silu(gate_e(x_t)) × up_e(x_t)) over
// the j whose expert e = ids[t, j] lies in [expert_begin, expert_begin +
// n_local) (experts[e - expert_begin]); other experts contribute nothing (a
// rank holding part of the experts computes its partial sum). Tokens are
// grouped by expert: the rows routed to an expert are gathered and its three
// matrices run once over them, so each active expert's weights are read once.
// x, out: [n, hidden]; ids, weights: [n, top_k].
void moe_experts(const float* x, int64_t n, int64_t hidden, const int32_t* ids, const float* weights, int64_t top_k,
                 const ExpertMatrices* experts, int64_t expert_begin, int64_t n_local, float* out,
                 MoeScratch& scratch);

namespace ref {
void moe_route(const float* logits, int64_t n, int64_t n_experts, int64_t top_k, bool renormalize, int32_t* ids,
               float* weights);
// Token by token, expert by expert, with ref::matmul on single rows.
void moe_experts(const float* x, int64_t n, int64_t hidden, const int32_t* ids, const float* weights, int64_t top_k,
                 const ExpertMatrices* experts, int64_t expert_begin, int64_t n_local, float* out);
}  // namespace ref

}  // namespace shardlm::backend
