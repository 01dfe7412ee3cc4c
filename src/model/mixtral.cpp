// Mixtral (MixtralForCausalLM: Mixtral-8x7B): the Llama/Mistral attention
// (no biases, no q/k norms) and, on every layer, a sparse MLP:
// block_sparse_moe.gate [num_local_experts, hidden]; the top
// num_experts_per_tok experts by logit, weighted by the softmax over their
// logits alone (HF computes softmax over all, takes the top-k and divides by
// their sum: the same numbers); experts block_sparse_moe.experts.E.w1 (gate),
// w3 (up), w2 (down) of intermediate_size.
#include "core/error.h"
#include "model/family.h"

namespace shardlm {

FamilyGraph mixtral_graph(const ModelSpec& spec) {
  FamilyGraph g;
  g.name = "mixtral";
  g.qkv_bias = false;
  g.rope = rope_config(spec);
  g.moe.enabled = true;
  g.moe.block = "block_sparse_moe";
  g.moe.gate = "w1";
  g.moe.up = "w3";
  g.moe.down = "w2";
  g.moe.n_experts = spec.n_experts;
  g.moe.top_k = spec.n_experts_per_token;
  g.moe.renormalize = true;
  return g;
}

}  // namespace shardlm
