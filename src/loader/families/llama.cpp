// Llama 3.x (LlamaForCausalLM) and Mistral (MistralForCausalLM, the same
// layer): pre-norm attention without biases or q/k norms, SwiGLU MLP.
// Llama's attention_bias would put biases on q, k, v and o_proj (refused);
// Mistral has none whatever the field says, and applies sliding_window to
// every layer whenever it is set (Mistral-7B-v0.1: 4096 of 32768).
#include <nlohmann/json.hpp>

#include "loader/families/family.h"

namespace shardlm {

namespace {

void parse_llama(const nlohmann::json& config, ModelSpec& spec, const std::string& source) {
  refuse_attention_bias(config, spec, source);
  refuse_sliding_window_field(config, spec, source);
  require_silu(config, spec, source);
  refuse_mlp_bias(config, source);
}

void parse_mistral(const nlohmann::json& config, ModelSpec& spec, const std::string& source) {
  mistral_sliding_window(config, spec, source);
  require_silu(config, spec, source);
  refuse_mlp_bias(config, source);
}

void write_llama(const ModelSpec&, nlohmann::json& c) { c["attention_bias"] = false; }
void write_mistral(const ModelSpec& spec, nlohmann::json& c) { write_mistral_sliding_window(spec, c); }

void tensors(const ModelSpec& spec, int64_t layer, std::vector<TensorSpec>& out) {
  LayerTable t(spec, layer, out);
  llama_attention_tensors(t);
  llama_mlp_tensors(t);
}

}  // namespace

extern const FamilyDef kLlamaFamily{Family::kLlama, "llama", "LlamaForCausalLM", parse_llama, write_llama, tensors, nullptr};
extern const FamilyDef kMistralFamily{Family::kMistral, "mistral", "MistralForCausalLM", parse_mistral, write_mistral,
                                      tensors, nullptr};

}  // namespace shardlm
