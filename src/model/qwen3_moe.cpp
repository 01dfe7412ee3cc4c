// Qwen3-MoE (Qwen3MoeForCausalLM: Qwen3-30B-A3B, Qwen3-235B-A22B): the Qwen3
// attention (q/k norms per head, explicit head_dim, no biases) and, on every
// layer l with (l + 1) % decoder_sparse_step == 0 outside mlp_only_layers, a
// sparse MLP: router mlp.gate [num_experts, hidden]; softmax over all
// experts, the top num_experts_per_tok, renormalised when norm_topk_prob;
// experts mlp.experts.E.{gate,up,down}_proj of moe_intermediate_size.
// Other layers carry the dense Qwen3 MLP of intermediate_size.
#include "core/error.h"
#include "model/family.h"

namespace shardlm {

FamilyGraph qwen3_moe_graph(const ModelSpec& spec) {
  FamilyGraph g = qwen3_graph(spec);
  g.name = "qwen3_moe";
  g.moe.enabled = true;
  g.moe.block = "mlp";
  g.moe.gate = "gate_proj";
  g.moe.up = "up_proj";
  g.moe.down = "down_proj";
  g.moe.n_experts = spec.n_experts;
  g.moe.top_k = spec.n_experts_per_token;
  g.moe.renormalize = spec.norm_topk_prob;
  return g;
}

}  // namespace shardlm
