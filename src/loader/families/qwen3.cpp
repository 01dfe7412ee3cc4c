// Qwen3 (Qwen3ForCausalLM): the Llama layer with RMSNorm over each head of q
// and k (q_norm, k_norm: [head_dim]) and an explicit head_dim; no biases
// (attention_bias false in every released config).
#include <nlohmann/json.hpp>

#include "loader/families/family.h"

namespace shardlm {

void qwen3_parse_attention(const nlohmann::json& config, ModelSpec& spec, const std::string& source) {
  spec.qk_norm = true;
  refuse_attention_bias(config, spec, source);
  refuse_qwen_sliding_window(config, source);
}

namespace {

void parse(const nlohmann::json& config, ModelSpec& spec, const std::string& source) {
  qwen3_parse_attention(config, spec, source);
  require_silu(config, spec, source);
  refuse_mlp_bias(config, source);
}

void write(const ModelSpec&, nlohmann::json& c) { c["attention_bias"] = false; }

void tensors(const ModelSpec& spec, int64_t layer, std::vector<TensorSpec>& out) {
  LayerTable t(spec, layer, out);
  llama_attention_tensors(t);
  llama_mlp_tensors(t);
}

}  // namespace

extern const FamilyDef kQwen3Family{Family::kQwen3, "qwen3", "Qwen3ForCausalLM", parse, write, tensors, nullptr};

}  // namespace shardlm
