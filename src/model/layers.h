// Layers shared by every family: pre-norm attention and SwiGLU MLP blocks
// on a tensor-parallel rank's slices, vocab-parallel embedding and lm_head.
// They are written once against backend::Backend (the ops) and Communicator
// (the collectives, visible here where they happen).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "plan/sharding.h"

namespace shardlm {

using backend::ExpertLinears;
using backend::Linear;

// One decoder layer as held by a rank (local slices, checkpoint dtype).
struct DecoderLayerWeights {
  int64_t layer = 0;             // global index
  Tensor input_norm;             // [hidden]
  Tensor post_norm;              // [hidden]
  Linear q, k, v;                // q: [n_q_local × head_dim, hidden]; k, v: [n_kv_local × head_dim, hidden]
  Tensor q_norm, k_norm;         // Qwen3: [head_dim]; undefined otherwise
  Linear o;                      // [hidden, n_q_local × head_dim] (column slice)
  Linear gate, up;               // dense MLP: [inter_local, hidden]
  Linear down;                   // dense MLP: [hidden, inter_local] (column slice)
  // Sparse (MoE) layers instead of gate/up/down: the router, replicated on
  // every rank, and the experts this rank holds (model/moe_block.h).
  Linear router;                       // [n_experts, hidden]; undefined on a dense layer
  std::vector<ExpertLinears> experts;  // [n_experts_local]: global ids expert_begin ..
  int64_t expert_begin = 0;
  bool sparse() const { return router.weight.defined(); }
};

// Sizes on this rank, fixed at load.
struct RankDims {
  int64_t hidden = 0;
  int64_t head_dim = 0;
  int64_t n_q_local = 0;
  int64_t n_kv_local = 0;
  int64_t inter_local = 0;
  int64_t n_experts = 0;  // MoE: router width (0 for a dense model)
  int64_t top_k = 0;      // MoE: experts per token
  bool renormalize = false;
  float eps = 1e-6f;
  backend::AttentionHeads heads;
};

// Activation buffers of one rank, from the backend, grown when a step has
// more tokens than any before it (so steady-state steps allocate nothing).
// Each view is [n_tokens, ...] of the current step.
class Workspace {
 public:
  // Sizes every buffer for n_tokens (no-op when already large enough).
  void reserve(backend::Backend& b, const RankDims& d, int64_t n_tokens);
  // [n, hidden] etc. views of the current step's first n rows.
  Tensor normed(int64_t n) const { return rows(normed_, n); }   // [n, hidden]
  Tensor q(int64_t n) const { return rows(q_, n); }             // [n, n_q_local, head_dim]
  Tensor k(int64_t n) const { return rows(k_, n); }             // [n, n_kv_local, head_dim]
  Tensor v(int64_t n) const { return rows(v_, n); }             // [n, n_kv_local, head_dim]
  Tensor attn(int64_t n) const { return rows(attn_, n); }       // [n, n_q_local × head_dim]
  Tensor proj(int64_t n) const { return rows(proj_, n); }       // [n, hidden], this rank's partial sum
  Tensor gate(int64_t n) const { return rows(gate_, n); }       // [n, inter_local]
  Tensor up(int64_t n) const { return rows(up_, n); }           // [n, inter_local]
  Tensor router_logits(int64_t n) const { return rows(router_logits_, n); }  // [n, n_experts]
  Tensor route_ids(int64_t n) const { return rows(route_ids_, n); }          // [n, top_k] i32
  Tensor route_weights(int64_t n) const { return rows(route_weights_, n); }  // [n, top_k] f32

 private:
  static Tensor rows(const Tensor& t, int64_t n) { return t.slice_rows(0, n); }
  int64_t capacity_ = 0;
  Tensor normed_, q_, k_, v_, attn_, proj_, gate_, up_;
  Tensor router_logits_, route_ids_, route_weights_;  // MoE models only
};

// The step every layer sees: the packed metadata and the rope table.
struct StepContext {
  const backend::StepMetadata& meta;
  const Tensor& inv_freq;  // [head_dim / 2] f32
};

// hidden[n_tokens, hidden] += o_proj(attention(...)) summed over the TP group.
void attention_block(backend::Backend& b, const RankDims& dims, const DecoderLayerWeights& w,
                     const backend::KvLayerView& cache, const StepContext& step, Tensor& hidden, Communicator& tp,
                     Workspace& ws);

// hidden[n_tokens, hidden] += down(silu(gate(x)) × up(x)), x = post_norm(hidden), summed over the TP group.
void mlp_block(backend::Backend& b, const RankDims& dims, const DecoderLayerWeights& w, const StepContext& step,
               Tensor& hidden, Communicator& tp, Workspace& ws);

// out[n_tokens, hidden]: embeddings of the step's ids, each looked up on the
// rank whose vocab range holds it, then summed over the TP group.
// emb: [vocab.size(), hidden]. Throws kInvalidArgument for an id outside [0, vocab_size).
void embed_tokens(backend::Backend& b, const Tensor& emb, Range vocab, int64_t vocab_size,
                  const backend::StepMetadata& meta, Tensor& out, Communicator& tp);

// logits[n, vocab_size] on every TP rank: local slice x × head_localᵀ, then
// all_gather of the slices; vocab_ranges[r] is TP rank r's vocabulary range.
// local, gathered: the rank's [n, vocab_local] and [n, vocab_size] scratch (TP > 1).
void lm_head_logits(backend::Backend& b, const Tensor& x, const Linear& head, const std::vector<Range>& vocab_ranges,
                    Tensor& logits, Tensor& local, Tensor& gathered, Communicator& tp);

}  // namespace shardlm
