// Qwen3 (Qwen3ForCausalLM): no q/k/v biases; RMSNorm over each head of q and
// k (q_norm, k_norm: [head_dim]) after the projections and before RoPE;
// head_dim is explicit (128 even where hidden / heads differs).
#include "core/error.h"
#include "model/family.h"

namespace shardlm {

FamilyGraph qwen3_graph(const ModelSpec& spec) {
  FamilyGraph g;
  g.name = "qwen3";
  g.qk_norm = true;
  g.qkv_bias = spec.qkv_bias;  // attention_bias: false in every released config
  g.rope = rope_config(spec);
  return g;
}

}  // namespace shardlm
