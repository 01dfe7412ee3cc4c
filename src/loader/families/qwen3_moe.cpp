// Qwen3-MoE (Qwen3MoeForCausalLM: Qwen3-30B-A3B, Qwen3-235B-A22B): the Qwen3
// attention and, on every layer l with (l + 1) % decoder_sparse_step == 0
// outside mlp_only_layers, a sparse MLP: router mlp.gate [num_experts,
// hidden]; softmax over all experts, the top num_experts_per_tok,
// renormalised when norm_topk_prob; experts mlp.experts.E.{gate,up,down}_proj
// of moe_intermediate_size. Other layers carry the dense Qwen3 MLP.
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "loader/config_fields.h"
#include "loader/families/family.h"

namespace shardlm {

void qwen3_parse_attention(const nlohmann::json& config, ModelSpec& spec, const std::string& source);  // qwen3.cpp

namespace {

void parse(const nlohmann::json& config, ModelSpec& spec, const std::string& source) {
  qwen3_parse_attention(config, spec, source);
  require_silu(config, spec, source);
  refuse_mlp_bias(config, source);
  spec.n_experts = required_int(config, "num_experts", source);
  spec.n_experts_per_token = required_int(config, "num_experts_per_tok", source);
  spec.moe_intermediate_size = required_int(config, "moe_intermediate_size", source);
  spec.norm_topk_prob = optional_bool(config, "norm_topk_prob", false, source);  // HF Qwen3MoeConfig default
  spec.decoder_sparse_step = optional_int(config, "decoder_sparse_step", 1, source);
  if (spec.decoder_sparse_step <= 0)
    fail(ErrorCode::kInvalidArgument, source, ": field \"decoder_sparse_step\" must be a positive integer, found ",
         spec.decoder_sparse_step);
  if (auto m = config.find("mlp_only_layers"); m != config.end() && !m->is_null()) {
    if (!m->is_array())
      fail(ErrorCode::kInvalidArgument, source, ": field \"mlp_only_layers\" must be a list of layer indices, found ", m->dump());
    for (const auto& l : *m) {
      if (!l.is_number_integer() || l.get<int64_t>() < 0 || l.get<int64_t>() >= spec.n_layers)
        fail(ErrorCode::kInvalidArgument, source, ": field \"mlp_only_layers\" entries must be layer indices in [0, ",
             spec.n_layers, "), found ", l.dump());
      spec.mlp_only_layers.push_back(l.get<int64_t>());
    }
  }
  if (optional_bool(config, "output_router_logits", false, source))
    fail(ErrorCode::kUnsupported, source, ": output_router_logits=true asks for router logits as an output; shardlm does not return them");
}

void write(const ModelSpec& spec, nlohmann::json& c) {
  c["attention_bias"] = false;
  c["num_experts"] = spec.n_experts;
  c["num_experts_per_tok"] = spec.n_experts_per_token;
  c["moe_intermediate_size"] = spec.moe_intermediate_size;
  c["norm_topk_prob"] = spec.norm_topk_prob;
  c["decoder_sparse_step"] = spec.decoder_sparse_step;
  c["mlp_only_layers"] = spec.mlp_only_layers;
}

void tensors(const ModelSpec& s, int64_t layer, std::vector<TensorSpec>& out) {
  LayerTable t(s, layer, out);
  llama_attention_tensors(t);
  if (!s.is_moe_layer(layer)) return llama_mlp_tensors(t);
  const int64_t h = s.hidden_size, i = s.moe_intermediate_size;
  t.add("post_attention_layernorm.weight", {h}, TensorSlot::kMlpNorm);
  t.add("mlp.gate.weight", {s.n_experts, h}, TensorSlot::kRouter, ShardRole::kRouter);
  for (int64_t e = 0; e < s.n_experts; ++e) {
    const std::string ep = "mlp.experts." + std::to_string(e) + ".";
    t.linear(ep + "gate_proj", i, h, TensorSlot::kExpertGate, ShardRole::kExpertColumn, ShardSpace::kNone, e);
    t.linear(ep + "up_proj", i, h, TensorSlot::kExpertUp, ShardRole::kExpertColumn, ShardSpace::kNone, e);
    t.linear(ep + "down_proj", h, i, TensorSlot::kExpertDown, ShardRole::kExpertRow, ShardSpace::kNone, e);
  }
}

}  // namespace

extern const FamilyDef kQwen3MoeFamily{Family::kQwen3Moe, "qwen3_moe", "Qwen3MoeForCausalLM", parse, write, tensors, nullptr};

}  // namespace shardlm
