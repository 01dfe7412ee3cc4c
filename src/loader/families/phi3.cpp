// Phi-3 / Phi-4 (Phi3ForCausalLM): the Llama layer with q, k and v stacked in
// one self_attn.qkv_proj [q_dim + 2 × kv_dim, hidden] and gate and up in one
// mlp.gate_up_proj [2 × intermediate, hidden] (gate first, as transformers'
// Phi3MLP chunks it). Each fused Linear is sharded by its parts: a rank holds
// its Q heads' rows, its KV heads' rows of k and of v, and its intermediate
// columns of gate and of up, under any TP degree.
//
// Runs as released: Phi-4 (full rotary, no rope scaling, no window),
// Phi-3-mini-4k (sliding_window 2047 on every layer, as Mistral's), and
// Phi-3-mini-128k and Phi-4-mini (partial_rotary_factor 0.75: rope on the
// first 96 of 128 dims) up to original_max_position_embeddings (4096): their
// LongRoPE short factors and attention factor, not yet the long factors.
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "loader/config_fields.h"
#include "loader/families/family.h"

namespace shardlm {

namespace {

void parse(const nlohmann::json& config, ModelSpec& spec, const std::string& source) {
  require_silu(config, spec, source);
  mistral_sliding_window(config, spec, source);
  spec.partial_rotary_factor = optional_number(config, "partial_rotary_factor", 1.0, source);
  const int64_t rot = spec.rotary_dim();
  if (!(spec.partial_rotary_factor > 0.0 && spec.partial_rotary_factor <= 1.0) || rot < 2 || rot % 2 != 0)
    fail(ErrorCode::kInvalidArgument, source, ": partial_rotary_factor=", spec.partial_rotary_factor,
         " gives ", rot, " rotary dims of head_dim ", spec.head_dim, "; it must be in (0, 1] and give an even count");
}

void write(const ModelSpec& spec, nlohmann::json& c) {
  write_mistral_sliding_window(spec, c);
  if (spec.partial_rotary_factor != 1.0) c["partial_rotary_factor"] = spec.partial_rotary_factor;
}

void tensors(const ModelSpec& s, int64_t layer, std::vector<TensorSpec>& out) {
  LayerTable t(s, layer, out);
  const int64_t h = s.hidden_size, i = s.intermediate_size;
  t.add("input_layernorm.weight", {h}, TensorSlot::kAttnNorm);
  t.fused_linear("self_attn.qkv_proj",
                 {{TensorSlot::kQ, ShardSpace::kQHeads, s.q_dim()},
                  {TensorSlot::kK, ShardSpace::kKvHeads, s.kv_dim()},
                  {TensorSlot::kV, ShardSpace::kKvHeads, s.kv_dim()}},
                 h);
  t.linear("self_attn.o_proj", h, s.q_dim(), TensorSlot::kO, ShardRole::kRow, ShardSpace::kQHeads);
  t.add("post_attention_layernorm.weight", {h}, TensorSlot::kMlpNorm);
  t.fused_linear("mlp.gate_up_proj",
                 {{TensorSlot::kGate, ShardSpace::kIntermediate, i}, {TensorSlot::kUp, ShardSpace::kIntermediate, i}}, h);
  t.linear("mlp.down_proj", h, i, TensorSlot::kDown, ShardRole::kRow, ShardSpace::kIntermediate);
}

}  // namespace

extern const FamilyDef kPhi3Family{Family::kPhi3, "phi3", "Phi3ForCausalLM", parse, write, tensors, nullptr};

}  // namespace shardlm
