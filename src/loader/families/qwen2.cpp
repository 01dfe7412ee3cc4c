// Qwen2 / Qwen2.5 (Qwen2ForCausalLM): the Llama layer plus biases on q, k
// and v, always present (config.json has no field for them). Qwen2.5 configs
// carry sliding-window fields with use_sliding_window false.
#include <nlohmann/json.hpp>

#include "loader/families/family.h"

namespace shardlm {

namespace {

void parse(const nlohmann::json& config, ModelSpec& spec, const std::string& source) {
  spec.qkv_bias = true;
  require_silu(config, spec, source);
  refuse_mlp_bias(config, source);
  refuse_qwen_sliding_window(config, source);
}

void write(const ModelSpec&, nlohmann::json&) {}

void tensors(const ModelSpec& spec, int64_t layer, std::vector<TensorSpec>& out) {
  LayerTable t(spec, layer, out);
  llama_attention_tensors(t);
  llama_mlp_tensors(t);
}

}  // namespace

extern const FamilyDef kQwen2Family{Family::kQwen2, "qwen2", "Qwen2ForCausalLM", parse, write, tensors, nullptr};

}  // namespace shardlm
