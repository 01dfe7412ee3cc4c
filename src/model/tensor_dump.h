// Intermediates named by (name, layer), llama.cpp's habit: a family's graph
// hands each intermediate to the dump as it computes it (LayerContext::name in
// model/layers.h), so `generate --dump-tensors NAME` can print it and a debug
// session can compare it with the reference. When no dump is attached, or it
// does not want the name, nothing is copied.
//
// Names (per decoder layer unless noted; under TP, the recording rank's
// slice of head- and column-split tensors):
//   embd (layer -1)          [n_tokens, hidden]      embeddings
//   attn_norm                [n_tokens, hidden]      pre-attention norm
//   q, k, v                  [n_tokens, heads, head_dim] after the projections (and biases)
//   q_norm, k_norm           [n_tokens, heads, head_dim] after the per-head norms (Qwen3)
//   q_rope, k_rope           [n_tokens, heads, head_dim] after RoPE
//   kqv                      [n_tokens, q_heads × head_dim] attention output, before o_proj
//   attn_out                 [n_tokens, hidden]      o_proj output, summed over TP
//   ffn_inp                  [n_tokens, hidden]      residual stream after attention
//   ffn_norm                 [n_tokens, hidden]      pre-MLP norm
//   ffn_gate, ffn_up         [n_tokens, inter]       dense MLP projections
//   ffn_act                  [n_tokens, inter]       silu(gate) × up
//   ffn_moe_logits           [n_tokens, n_experts]   router logits
//   ffn_moe_topk             [n_tokens, top_k]       chosen experts, best first (ids)
//   ffn_moe_weights          [n_tokens, top_k]       their routing weights
//   ffn_out                  [n_tokens, hidden]      MLP / MoE output, summed over TP
//   l_out                    [n_tokens, hidden]      residual stream after the layer
//   result_norm (layer -1)   [n_logits, hidden]      final norm of the rows that make logits
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.h"

namespace shardlm {

struct DumpedTensor {
  std::string name;
  int64_t layer = -1;          // -1: outside the decoder layers
  std::vector<int64_t> shape;
  std::vector<float> values;   // row-major, widened to f32 (ids: their value)
};

class TensorDump {
 public:
  // names: the intermediates to keep ("all" keeps every one). Throws
  // kInvalidArgument naming an unknown name and listing the known ones.
  explicit TensorDump(std::vector<std::string> names);
  bool wants(std::string_view name) const;
  // Copies t (on the backend's device) to the host when wanted.
  void record(backend::Backend& b, std::string_view name, int64_t layer, const Tensor& t);
  const std::vector<DumpedTensor>& tensors() const { return tensors_; }
  // Every name a graph records.
  static const std::vector<std::string>& known_names();

 private:
  bool all_ = false;
  std::vector<std::string> names_;
  std::vector<DumpedTensor> tensors_;
};

}  // namespace shardlm
