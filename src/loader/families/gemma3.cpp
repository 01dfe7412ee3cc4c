// Gemma 3, text only: Gemma3ForCausalLM (model_type gemma3_text: 1B) and the
// language model of Gemma3ForConditionalGeneration (4B/12B/27B, its weights
// under language_model.). Its decoder layer:
//   input_layernorm → q/k/v (per-head q_norm, k_norm) → rope → attention →
//   post_attention_layernorm → residual; pre_feedforward_layernorm → GeGLU
//   (gelu_pytorch_tanh) → post_feedforward_layernorm → residual.
// Every RMSNorm multiplies by (1 + w); the embeddings are scaled by
// sqrt(hidden_size); q·k by query_pre_attn_scalar^-0.5. Local layers attend
// to the last sliding_window positions with rope base rope_local_base_freq;
// global layers (every sliding_window_pattern-th, or as layer_types says) to
// the whole past with rope_theta and rope_scaling. Defaults are
// Gemma3TextConfig's: a released config.json leaves out what equals them.
#include <cmath>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "loader/config_fields.h"
#include "loader/families/family.h"

namespace shardlm {

namespace {

void refuse_attention_softcap(const nlohmann::json& config, const std::string& source) {
  auto it = config.find("attn_logit_softcapping");
  if (it != config.end() && !it->is_null())
    fail(ErrorCode::kUnsupported, source, ": attn_logit_softcapping=", it->dump(),
         " (tanh soft-capping of attention scores, Gemma 2's) is not supported; every released Gemma 3 config sets "
         "it to null");
}

// final_logit_softcapping: null (none) or a positive number c.
double final_softcap(const nlohmann::json& config, const std::string& source) {
  auto it = config.find("final_logit_softcapping");
  if (it == config.end() || it->is_null()) return 0.0;
  if (!it->is_number() || !(it->get<double>() > 0.0) || !std::isfinite(it->get<double>()))
    fail(ErrorCode::kInvalidArgument, source, ": final_logit_softcapping must be null or a positive number, found ",
         it->dump());
  return it->get<double>();
}

void parse(const nlohmann::json& config, ModelSpec& spec, const std::string& source) {
  spec.qk_norm = true;
  spec.norm_weight_offset = 1.0f;
  spec.scale_embeddings = true;
  spec.tie_word_embeddings = optional_bool(config, "tie_word_embeddings", true, source);
  if (!config.contains("max_position_embeddings")) spec.max_position_embeddings = 131072;
  refuse_attention_bias(config, spec, source);
  refuse_mlp_bias(config, source);
  refuse_attention_softcap(config, source);
  spec.final_logit_softcapping = final_softcap(config, source);
  // transformers reads hidden_activation (hidden_act is Gemma 1's field).
  const char* act_field = config.contains("hidden_activation") ? "hidden_activation" : "hidden_act";
  auto act = config.find(act_field);
  const std::string activation = act == config.end() || act->is_null() ? "gelu_pytorch_tanh"
                                 : act->is_string()                     ? act->get<std::string>()
                                                                        : act->dump();
  if (activation != "gelu_pytorch_tanh")
    fail(ErrorCode::kUnsupported, source, ": ", act_field, " \"", activation, "\" is not supported for ",
         spec.architecture, "; shardlm runs Gemma's GeGLU with gelu_pytorch_tanh (every released config)");
  spec.mlp_activation = MlpActivation::kGeluTanh;
  spec.query_pre_attn_scalar = optional_number(config, "query_pre_attn_scalar", 256.0, source);
  if (!(spec.query_pre_attn_scalar > 0.0))
    fail(ErrorCode::kInvalidArgument, source, ": query_pre_attn_scalar must be positive, found ",
         spec.query_pre_attn_scalar);
  spec.rope_local_theta = optional_number(config, "rope_local_base_freq", 10000.0, source);
  if (!(spec.rope_local_theta > 0.0))
    fail(ErrorCode::kInvalidArgument, source, ": rope_local_base_freq must be positive, found ", spec.rope_local_theta);
  spec.sliding_window = optional_int(config, "sliding_window", 4096, source);
  if (spec.sliding_window <= 0)
    fail(ErrorCode::kInvalidArgument, source, ": sliding_window must be a positive number of positions, found ",
         spec.sliding_window);
  spec.sliding_layers.assign(static_cast<size_t>(spec.n_layers), false);
  if (auto types = config.find("layer_types"); types != config.end() && !types->is_null()) {
    if (!types->is_array() || static_cast<int64_t>(types->size()) != spec.n_layers)
      fail(ErrorCode::kInvalidArgument, source, ": layer_types must list one entry per layer (num_hidden_layers=",
           spec.n_layers, "), found ", types->is_array() ? std::to_string(types->size()) + " entries" : types->type_name());
    for (int64_t l = 0; l < spec.n_layers; ++l) {
      const nlohmann::json& t = (*types)[static_cast<size_t>(l)];
      const std::string v = t.is_string() ? t.get<std::string>() : t.dump();
      if (v != "sliding_attention" && v != "full_attention")
        fail(ErrorCode::kInvalidArgument, source, ": layer_types[", l, "] is \"", v,
             "\"; expected \"sliding_attention\" or \"full_attention\"");
      spec.sliding_layers[static_cast<size_t>(l)] = v == "sliding_attention";
    }
  } else {
    const int64_t pattern = optional_int(config, "sliding_window_pattern", 6, source);
    if (pattern <= 0)
      fail(ErrorCode::kInvalidArgument, source, ": sliding_window_pattern must be positive, found ", pattern);
    for (int64_t l = 0; l < spec.n_layers; ++l) spec.sliding_layers[static_cast<size_t>(l)] = (l + 1) % pattern != 0;
  }
}

void write(const ModelSpec& s, nlohmann::json& c) {
  c.erase("hidden_act");
  c["hidden_activation"] = "gelu_pytorch_tanh";
  c["attention_bias"] = false;
  c["query_pre_attn_scalar"] = s.query_pre_attn_scalar;
  c["rope_local_base_freq"] = s.rope_local_theta;
  c["sliding_window"] = s.sliding_window;
  c["attn_logit_softcapping"] = nullptr;
  c["final_logit_softcapping"] =
      s.final_logit_softcapping > 0.0 ? nlohmann::json(s.final_logit_softcapping) : nlohmann::json(nullptr);
  // Gemma 3's own rule (every 6th layer global) when the layers follow it,
  // so that make-model --layers keeps it; the explicit list otherwise.
  bool pattern = !s.sliding_layers.empty();
  for (size_t l = 0; l < s.sliding_layers.size(); ++l) pattern = pattern && s.sliding_layers[l] == ((l + 1) % 6 != 0);
  if (pattern) {
    c["sliding_window_pattern"] = 6;
  } else {
    nlohmann::json types = nlohmann::json::array();
    for (bool sliding : s.sliding_layers) types.push_back(sliding ? "sliding_attention" : "full_attention");
    c["layer_types"] = std::move(types);
  }
}

void tensors(const ModelSpec& s, int64_t layer, std::vector<TensorSpec>& out) {
  LayerTable t(s, layer, out);
  const int64_t h = s.hidden_size, i = s.intermediate_size;
  t.add("input_layernorm.weight", {h}, TensorSlot::kAttnNorm);
  t.linear("self_attn.q_proj", s.q_dim(), h, TensorSlot::kQ, ShardRole::kColumn, ShardSpace::kQHeads);
  t.linear("self_attn.k_proj", s.kv_dim(), h, TensorSlot::kK, ShardRole::kColumn, ShardSpace::kKvHeads);
  t.linear("self_attn.v_proj", s.kv_dim(), h, TensorSlot::kV, ShardRole::kColumn, ShardSpace::kKvHeads);
  t.add("self_attn.q_norm.weight", {s.head_dim}, TensorSlot::kQNorm);
  t.add("self_attn.k_norm.weight", {s.head_dim}, TensorSlot::kKNorm);
  t.linear("self_attn.o_proj", h, s.q_dim(), TensorSlot::kO, ShardRole::kRow, ShardSpace::kQHeads);
  t.add("post_attention_layernorm.weight", {h}, TensorSlot::kPostAttnNorm);
  t.add("pre_feedforward_layernorm.weight", {h}, TensorSlot::kMlpNorm);
  t.linear("mlp.gate_proj", i, h, TensorSlot::kGate, ShardRole::kColumn, ShardSpace::kIntermediate);
  t.linear("mlp.up_proj", i, h, TensorSlot::kUp, ShardRole::kColumn, ShardSpace::kIntermediate);
  t.linear("mlp.down_proj", h, i, TensorSlot::kDown, ShardRole::kRow, ShardSpace::kIntermediate);
  t.add("post_feedforward_layernorm.weight", {h}, TensorSlot::kPostMlpNorm);
}

// ---- Gemma3ForConditionalGeneration (4B, 12B, 27B): its language model ----

// Gemma3TextConfig's defaults (transformers): a released text_config lists
// only what differs from them.
nlohmann::json text_config_defaults() {
  return {{"model_type", "gemma3_text"},   {"vocab_size", 262208},
          {"hidden_size", 2304},            {"intermediate_size", 9216},
          {"num_hidden_layers", 26},        {"num_attention_heads", 8},
          {"num_key_value_heads", 4},       {"head_dim", 256},
          {"hidden_activation", "gelu_pytorch_tanh"},
          {"max_position_embeddings", 131072}, {"rms_norm_eps", 1e-6},
          {"rope_theta", 1000000.0},        {"rope_local_base_freq", 10000.0},
          {"query_pre_attn_scalar", 256},   {"sliding_window", 4096},
          {"sliding_window_pattern", 6},    {"tie_word_embeddings", true},
          {"attention_bias", false},        {"rope_scaling", nullptr},
          {"bos_token_id", 2},
          {"attn_logit_softcapping", nullptr}, {"final_logit_softcapping", nullptr}};
}

nlohmann::json language_model_config(const nlohmann::json& config, const std::string& source) {
  auto text = config.find("text_config");
  if (text == config.end() || !text->is_object())
    fail(ErrorCode::kInvalidArgument, source, ": a Gemma3ForConditionalGeneration config.json needs a \"text_config\" ",
         "object (its language model's fields)");
  nlohmann::json flat = text_config_defaults();
  for (auto it = text->begin(); it != text->end(); ++it) flat[it.key()] = it.value();
  // The checkpoint's dtype and token ids are the top level's.
  for (const char* key : {"torch_dtype", "dtype", "bos_token_id", "eos_token_id", "quantization_config"})
    if (config.contains(key)) flat[key] = config[key];
  flat["architectures"] = config["architectures"];
  return flat;
}

void parse_multimodal(const nlohmann::json& config, ModelSpec& spec, const std::string& source) {
  parse(config, spec, source);
  spec.tensor_prefix = "language_model.";
  spec.ignored_tensor_prefixes = {"vision_tower.", "multi_modal_projector."};
}

// config.json as the multimodal checkpoints have it: the language model's
// fields under text_config; the top level gets the dtype and token ids after.
void write_multimodal(const ModelSpec& spec, nlohmann::json& c) {
  write(spec, c);
  nlohmann::json top = {{"architectures", c["architectures"]}, {"model_type", "gemma3"}};
  nlohmann::json text = std::move(c);
  text.erase("architectures");
  text["model_type"] = "gemma3_text";
  top["text_config"] = std::move(text);
  c = std::move(top);
}

}  // namespace

extern const FamilyDef kGemma3Family{Family::kGemma3, "gemma3_text", "Gemma3ForCausalLM", parse, write, tensors, nullptr};
// Text only: the vision tower and projector are left in the checkpoint, unread.
extern const FamilyDef kGemma3MultimodalFamily{Family::kGemma3, "gemma3", "Gemma3ForConditionalGeneration",
                                               parse_multimodal, write_multimodal, tensors, language_model_config};

}  // namespace shardlm
