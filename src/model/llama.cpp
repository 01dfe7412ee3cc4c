// Llama 3.x (LlamaForCausalLM) and Mistral (MistralForCausalLM, the same
// graph): no biases, no q/k norm; RoPE may use llama3 frequency scaling
// (Llama 3.1+: factor 8, low/high freq factors 1 and 4, original 8192).
#include "core/error.h"
#include "model/family.h"

namespace shardlm {

FamilyGraph llama_graph(const ModelSpec& spec) {
  FamilyGraph g;
  g.name = spec.family == Family::kMistral ? "mistral" : "llama";
  g.qkv_bias = spec.qkv_bias;  // attention_bias (false for Llama 3 / Mistral)
  g.rope = rope_config(spec);
  return g;
}

}  // namespace shardlm
