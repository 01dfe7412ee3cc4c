// Mixtral (MixtralForCausalLM: Mixtral-8x7B): the Mistral attention and, on
// every layer, a sparse MLP: router block_sparse_moe.gate [num_local_experts,
// hidden]; the top num_experts_per_tok experts by logit, weighted by the
// softmax over their logits alone; experts block_sparse_moe.experts.E.w1
// (gate), w3 (up), w2 (down) of intermediate_size.
#include <nlohmann/json.hpp>

#include "loader/config_fields.h"
#include "loader/families/family.h"

namespace shardlm {

namespace {

void parse(const nlohmann::json& config, ModelSpec& spec, const std::string& source) {
  mistral_sliding_window(config, spec, source);
  require_silu(config, spec, source);
  refuse_mlp_bias(config, source);
  spec.n_experts = required_int(config, "num_local_experts", source);
  spec.n_experts_per_token = required_int(config, "num_experts_per_tok", source);
  spec.moe_intermediate_size = spec.intermediate_size;
  spec.norm_topk_prob = true;  // softmax over the selected experts' logits
}

void write(const ModelSpec& spec, nlohmann::json& c) {
  c["num_local_experts"] = spec.n_experts;
  c["num_experts_per_tok"] = spec.n_experts_per_token;
  write_mistral_sliding_window(spec, c);
}

void tensors(const ModelSpec& s, int64_t layer, std::vector<TensorSpec>& out) {
  LayerTable t(s, layer, out);
  llama_attention_tensors(t);
  const int64_t h = s.hidden_size, i = s.moe_intermediate_size;
  t.add("post_attention_layernorm.weight", {h}, TensorSlot::kMlpNorm);
  t.add("block_sparse_moe.gate.weight", {s.n_experts, h}, TensorSlot::kRouter, ShardRole::kRouter);
  for (int64_t e = 0; e < s.n_experts; ++e) {
    const std::string ep = "block_sparse_moe.experts." + std::to_string(e) + ".";
    t.linear(ep + "w1", i, h, TensorSlot::kExpertGate, ShardRole::kExpertColumn, ShardSpace::kNone, e);
    t.linear(ep + "w2", h, i, TensorSlot::kExpertDown, ShardRole::kExpertRow, ShardSpace::kNone, e);
    t.linear(ep + "w3", i, h, TensorSlot::kExpertUp, ShardRole::kExpertColumn, ShardSpace::kNone, e);
  }
}

}  // namespace

extern const FamilyDef kMixtralFamily{Family::kMixtral, "mixtral", "MixtralForCausalLM", parse, write, tensors, nullptr};

}  // namespace shardlm
