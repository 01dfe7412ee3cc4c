// The pieces every family's decoder layer is built from (model/families/):
// norm, qkv, qk-norm, rope+cache, attend+project, gated MLP, MoE, residual
// add; and the vocab-parallel embedding and lm_head around the layers. They
// run on a tensor-parallel rank's slices, written once against
// backend::Backend (the ops) and Communicator (the collectives, visible here
// where they happen). Each names what it computes (model/tensor_dump.h).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "loader/model_spec.h"
#include "model/tensor_dump.h"
#include "plan/sharding.h"

namespace shardlm {

using backend::ExpertLinears;
using backend::Linear;

// One decoder layer as held by a rank (local slices, checkpoint dtype),
// placed by the slots of its family's tensor table (loader/families/).
struct DecoderLayerWeights {
  int64_t layer = 0;             // global index
  Tensor attn_norm;              // [hidden]
  Tensor mlp_norm;               // [hidden]
  Tensor post_attn_norm;         // [hidden] over attention's output (Gemma); undefined otherwise
  Tensor post_mlp_norm;          // [hidden] over the MLP's output (Gemma); undefined otherwise
  int64_t attention_window = 0;  // > 0: a sliding-window layer, attending to that many positions
  bool local_rope = false;       // rope with StepContext::inv_freq_local (Gemma's local layers)
  Linear q, k, v;                // q: [n_q_local × head_dim, hidden]; k, v: [n_kv_local × head_dim, hidden] (+ biases)
  Tensor q_norm, k_norm;         // [head_dim] (Qwen3); undefined otherwise
  Linear o;                      // [hidden, n_q_local × head_dim] (row-parallel: input slice)
  Linear gate, up;               // dense MLP: [inter_local, hidden]
  Linear down;                   // dense MLP: [hidden, inter_local] (row-parallel)
  // Sparse (MoE) layers instead of gate/up/down: the router, replicated on
  // every rank, and the experts this rank holds.
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
  float norm_offset = 0.0f;  // every norm multiplies by (norm_offset + w): 1 for Gemma
  float rope_mscale = 1.0f;  // rope's cos and sin times this (LongRoPE's attention factor)
  MlpActivation activation = MlpActivation::kSilu;
  backend::AttentionHeads heads;  // window 0; a sliding layer sets its own
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
  const Tensor& inv_freq;        // [rotary_dim / 2] f32 (LongRoPE: [2, rotary_dim / 2], Backend::rope)
  const Tensor& inv_freq_local;  // [head_dim / 2] f32 of local layers (Gemma 3); undefined otherwise
};

// What every piece of a layer reads: the backend, this rank's sizes, the
// step, the TP group, the activation buffers, and the dump (nullptr: none).
struct LayerContext {
  backend::Backend& b;
  const RankDims& dims;
  const StepContext& step;
  Communicator& tp;
  Workspace& ws;
  TensorDump* dump = nullptr;
  int64_t n_tokens() const { return step.meta.n_tokens(); }
  // Hands intermediate (name, layer) to the dump, if one wants it.
  void name(std::string_view name, int64_t layer, const Tensor& t) const {
    if (dump) dump->record(b, name, layer, t);
  }
};

// The attention projections of a layer: views into the workspace.
struct Qkv {
  Tensor q;  // [n_tokens, n_q_local, head_dim]
  Tensor k;  // [n_tokens, n_kv_local, head_dim]
  Tensor v;  // [n_tokens, n_kv_local, head_dim]
};

// x[n_tokens, hidden] = rms_norm(hidden) × weight, into the workspace; named `name`.
Tensor norm(const LayerContext& c, const Tensor& hidden, const Tensor& weight, std::string_view name, int64_t layer);
// x = rms_norm(x) × weight in place (Gemma's post-attention and post-MLP norms); named `name`.
void norm_in_place(const LayerContext& c, Tensor& x, const Tensor& weight, std::string_view name, int64_t layer);
// q, k, v = x × Wᵀ (+ bias where the Linear has one).
Qkv qkv(const LayerContext& c, const DecoderLayerWeights& w, const Tensor& x);
// RMSNorm over each head of q and k (q_norm, k_norm [head_dim]), in place.
void qk_norm(const LayerContext& c, const DecoderLayerWeights& w, const Qkv& a);
// RoPE on q and k in place (the step's positions; the local table on a
// layer with local_rope), then k and v into the cache.
void rope_and_cache(const LayerContext& c, const DecoderLayerWeights& w, const backend::KvLayerView& cache,
                    const Qkv& a);
// Paged attention of q over the cache (the last w.attention_window
// positions on a sliding layer), then o_proj, summed over the TP group:
// [n_tokens, hidden] (the workspace's projection buffer).
Tensor attend_and_project(const LayerContext& c, const DecoderLayerWeights& w, const backend::KvLayerView& cache,
                          const Qkv& a);
// down(act(gate(x)) × up(x)) summed over the TP group, act = silu or
// gelu_tanh (dims.activation): [n_tokens, hidden].
Tensor gated_mlp(const LayerContext& c, const DecoderLayerWeights& w, const Tensor& x);
// The mixture-of-experts MLP, the sparse variant of gated_mlp:
//   logits = x × routerᵀ                            [n_tokens, n_experts] (router replicated)
//   ids, weights = top_k(softmax(logits)) (renormalised when dims.renormalize)  [n_tokens, top_k]
//   partial = Σ_{j: ids[t,j] held here} weights[t,j] × expert_{ids[t,j]}(x_t)
// summed over the TP group: [n_tokens, hidden]. Every rank of a stage holds
// every token (attention is tensor-parallel), so each computes the partial
// output of the experts it holds (whole experts under expert parallelism, a
// column slice of every expert without) for all tokens, and the all-reduce
// combines them: no all_to_all dispatch is needed.
Tensor moe(const LayerContext& c, const DecoderLayerWeights& w, const Tensor& x);
// hidden += delta; the new residual stream is named `name`.
void residual_add(const LayerContext& c, Tensor& hidden, const Tensor& delta, std::string_view name, int64_t layer);

// The rope config of a spec: theta, and "linear"/"llama3" scaling. Throws
// kUnsupported for another rope_scaling type.
backend::RopeConfig rope_config(const ModelSpec& spec);
// The rope config of a local (sliding-window) layer when the spec gives it
// its own base (rope_local_theta > 0): that base, no scaling.
backend::RopeConfig local_rope_config(const ModelSpec& spec);

// out[n_tokens, hidden]: embeddings of the step's ids, each looked up on the
// rank whose vocab range holds it, then summed over the TP group, times
// `scale` (Gemma's sqrt(hidden); 1 for every other family).
// emb: [vocab.size(), hidden]. Throws kInvalidArgument for an id outside [0, vocab_size).
void embed_tokens(backend::Backend& b, const Tensor& emb, Range vocab, int64_t vocab_size,
                  const backend::StepMetadata& meta, Tensor& out, Communicator& tp, float scale);

// logits[n, vocab_size] on every TP rank: local slice x × head_localᵀ, then
// all_gather of the slices; vocab_ranges[r] is TP rank r's vocabulary range.
// local, gathered: the rank's [n, vocab_local] and [n, vocab_size] scratch (TP > 1).
// head: [vocab_local, hidden] in the checkpoint dtype, or a quantized Linear
// (GPTQ "lm_head": true) that matmul runs with the decoder's kernels.
void lm_head_logits(backend::Backend& b, const Tensor& x, const Linear& head, const std::vector<Range>& vocab_ranges,
                    Tensor& logits, Tensor& local, Tensor& gathered, Communicator& tp);

}  // namespace shardlm
