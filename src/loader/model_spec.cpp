#include "loader/model_spec.h"

#include <cmath>
#include <fstream>
#include <sstream>
#include <nlohmann/json.hpp>

#include "core/bounded_json_file.h"
#include "core/error.h"
#include "loader/config_fields.h"
#include "loader/families/family.h"

namespace shardlm {

using nlohmann::json;

const char* family_name(Family family) { return family_def(family).name; }

const char* shard_role_name(ShardRole role) {
  switch (role) {
    case ShardRole::kReplicated: return "replicated";
    case ShardRole::kColumn: return "column";
    case ShardRole::kRow: return "row";
    case ShardRole::kVocab: return "vocab";
    case ShardRole::kExpertColumn: return "expert-column";
    case ShardRole::kExpertRow: return "expert-row";
    case ShardRole::kRouter: return "router";
    case ShardRole::kFusedParts: return "fused-parts";
  }
  return "?";
}

const char* tensor_slot_name(TensorSlot slot) {
  switch (slot) {
    case TensorSlot::kEmbedding: return "embedding";
    case TensorSlot::kFinalNorm: return "final_norm";
    case TensorSlot::kLmHead: return "lm_head";
    case TensorSlot::kAttnNorm: return "attn_norm";
    case TensorSlot::kPostAttnNorm: return "post_attn_norm";
    case TensorSlot::kPostMlpNorm: return "post_mlp_norm";
    case TensorSlot::kQ: return "q";
    case TensorSlot::kK: return "k";
    case TensorSlot::kV: return "v";
    case TensorSlot::kQBias: return "q_bias";
    case TensorSlot::kKBias: return "k_bias";
    case TensorSlot::kVBias: return "v_bias";
    case TensorSlot::kQNorm: return "q_norm";
    case TensorSlot::kKNorm: return "k_norm";
    case TensorSlot::kO: return "o";
    case TensorSlot::kMlpNorm: return "mlp_norm";
    case TensorSlot::kGate: return "gate";
    case TensorSlot::kUp: return "up";
    case TensorSlot::kDown: return "down";
    case TensorSlot::kRouter: return "router";
    case TensorSlot::kExpertGate: return "expert_gate";
    case TensorSlot::kExpertUp: return "expert_up";
    case TensorSlot::kExpertDown: return "expert_down";
  }
  return "?";
}

namespace {

std::string supported_list() {
  std::string out;
  for (const FamilyDef* d : family_defs()) out += (out.empty() ? "" : ", ") + std::string(d->architecture);
  return out;
}

}  // namespace

namespace {
ModelSpec parse_flat_config(const json& config, const FamilyDef& family, const std::string& source);
}  // namespace

ModelSpec parse_model_config(const json& config, const std::string& source) {
  if (!config.is_object()) fail(ErrorCode::kInvalidArgument, source, ": expected a JSON object at the top level");
  auto arch = config.find("architectures");
  if (arch == config.end() || !arch->is_array() || arch->empty() || !(*arch)[0].is_string())
    fail(ErrorCode::kInvalidArgument, source, ": field \"architectures\" must be a non-empty list of names, e.g. [\"Qwen2ForCausalLM\"]");
  const std::string architecture = (*arch)[0].get<std::string>();
  const FamilyDef* def = find_family(architecture);
  if (!def)
    fail(ErrorCode::kUnsupported, source, ": architecture \"", architecture, "\" is not supported; supported: ", supported_list());
  if (def->language_model_config) return parse_flat_config(def->language_model_config(config, source), *def, source);
  return parse_flat_config(config, *def, source);
}

namespace {

// LongRoPE (Phi-3-mini-128k, Phi-4-mini): short_factor / long_factor, one
// per rotary frequency; attention_factor as transformers derives it;
// original_max_position_embeddings at the top level (as Phi-3 writes it) or
// in rope_scaling. Which factors a position takes: ModelSpec::long_context.
void parse_longrope(const json& config, const json& rs, ModelSpec& spec, const std::string& source) {
  RopeScaling& r = spec.rope_scaling;
  const int64_t half = spec.rotary_dim() / 2;
  for (auto [key, out] : {std::pair{"short_factor", &r.short_factor}, std::pair{"long_factor", &r.long_factor}}) {
    auto f = rs.find(key);
    if (f == rs.end() || !f->is_array() || static_cast<int64_t>(f->size()) != half)
      fail(ErrorCode::kInvalidArgument, source, ": rope_scaling.", key, " must list ", half,
           " numbers (one per rotary frequency: rotary dims ", spec.rotary_dim(), " / 2)");
    for (const json& v : *f) {
      if (!v.is_number() || !(v.get<double>() > 0.0))
        fail(ErrorCode::kInvalidArgument, source, ": rope_scaling.", key, " entries must be positive numbers, found ",
             v.dump());
      out->push_back(v.get<double>());
    }
  }
  const int64_t original = optional_int(config, "original_max_position_embeddings",
                                        optional_int(rs, "original_max_position_embeddings", 0, source), source);
  if (original <= 0)
    fail(ErrorCode::kInvalidArgument, source, ": rope_scaling longrope needs original_max_position_embeddings");
  r.original_max_position_embeddings = original;
  const double factor = static_cast<double>(spec.max_position_embeddings) / static_cast<double>(original);
  r.factor = factor;
  r.attention_factor = optional_number(
      rs, "attention_factor",
      factor <= 1.0 ? 1.0 : std::sqrt(1.0 + std::log(factor) / std::log(static_cast<double>(original))),
      source + " rope_scaling");
}

// The fields of a flat config.json (a causal LM's, or the language model's of
// a multimodal one) into a spec of `family`.
ModelSpec parse_flat_config(const json& config, const FamilyDef& family, const std::string& source) {
  const FamilyDef* def = &family;
  ModelSpec spec;
  spec.architecture = def->architecture;
  spec.family = def->family;
  if (auto mt = config.find("model_type"); mt != config.end() && mt->is_string()) spec.model_type = mt->get<std::string>();

  spec.vocab_size = required_int(config, "vocab_size", source);
  spec.hidden_size = required_int(config, "hidden_size", source);
  spec.intermediate_size = required_int(config, "intermediate_size", source);
  spec.n_layers = required_int(config, "num_hidden_layers", source);
  spec.n_heads = required_int(config, "num_attention_heads", source);
  spec.n_kv_heads = optional_int(config, "num_key_value_heads", spec.n_heads, source);
  if (spec.n_kv_heads <= 0 || spec.n_heads % spec.n_kv_heads != 0)
    fail(ErrorCode::kInvalidArgument, source, ": num_attention_heads (", spec.n_heads,
         ") must be a multiple of num_key_value_heads (", spec.n_kv_heads, ")");
  int64_t default_head_dim = spec.hidden_size / spec.n_heads;
  spec.head_dim = optional_int(config, "head_dim", default_head_dim, source);
  if (spec.head_dim == 0) spec.head_dim = default_head_dim;
  if (spec.head_dim % 2 != 0)
    fail(ErrorCode::kInvalidArgument, source, ": head_dim must be even for rotary embeddings, found ", spec.head_dim);
  spec.rms_norm_eps = optional_number(config, "rms_norm_eps", 1e-6, source);
  spec.rope_theta = optional_number(config, "rope_theta", 10000.0, source);
  spec.max_position_embeddings = optional_int(config, "max_position_embeddings", 4096, source);
  spec.tie_word_embeddings = optional_bool(config, "tie_word_embeddings", false, source);
  // The family's own fields: biases, norms, experts, and what it refuses (loader/families/).
  def->parse_config(config, spec, source);

  if (auto rs = config.find("rope_scaling"); rs != config.end() && !rs->is_null()) {
    if (!rs->is_object()) fail(ErrorCode::kInvalidArgument, source, ": field \"rope_scaling\" must be an object or null");
    std::string type;
    if (auto t = rs->find("rope_type"); t != rs->end() && t->is_string()) type = t->get<std::string>();
    else if (auto t2 = rs->find("type"); t2 != rs->end() && t2->is_string()) type = t2->get<std::string>();
    if (type != "default") spec.rope_scaling.type = type;
    spec.rope_scaling.factor = optional_number(*rs, "factor", 1.0, source + " rope_scaling");
    spec.rope_scaling.low_freq_factor = optional_number(*rs, "low_freq_factor", 1.0, source + " rope_scaling");
    spec.rope_scaling.high_freq_factor = optional_number(*rs, "high_freq_factor", 4.0, source + " rope_scaling");
    spec.rope_scaling.original_max_position_embeddings =
        optional_int(*rs, "original_max_position_embeddings", 8192, source + " rope_scaling");
    if (spec.rope_scaling.type == "su") spec.rope_scaling.type = "longrope";  // Phi-3's first name for it
    if (!spec.rope_scaling.type.empty() && spec.rope_scaling.type != "llama3" && spec.rope_scaling.type != "linear" &&
        spec.rope_scaling.type != "longrope")
      fail(ErrorCode::kUnsupported, source, ": rope_scaling type \"", spec.rope_scaling.type,
           "\" is not supported (supported: llama3, linear, longrope, or none)");
    if (spec.rope_scaling.type == "longrope") parse_longrope(config, *rs, spec, source);
    if (spec.rope_scaling.type == "linear" && !(spec.rope_scaling.factor > 0.0))
      fail(ErrorCode::kInvalidArgument, source, ": rope_scaling.factor must be positive for linear scaling, found ",
           spec.rope_scaling.factor);
  }

  if (spec.is_moe()) {
    if (spec.n_experts_per_token > spec.n_experts)
      fail(ErrorCode::kInvalidArgument, source, ": num_experts_per_tok (", spec.n_experts_per_token,
           ") must not exceed the number of experts (", spec.n_experts, ")");
    if (auto q = config.find("shared_expert_intermediate_size"); q != config.end() && q->is_number() && q->get<double>() > 0)
      fail(ErrorCode::kUnsupported, source, ": shared_expert_intermediate_size (a shared expert, Qwen2-MoE style) is not supported for ",
           spec.architecture);
  }

  std::string dtype_text = "bfloat16";
  if (auto d = config.find("torch_dtype"); d != config.end() && d->is_string()) dtype_text = d->get<std::string>();
  else if (auto d2 = config.find("dtype"); d2 != config.end() && d2->is_string()) dtype_text = d2->get<std::string>();
  if (!parse_dtype(dtype_text, &spec.dtype))
    fail(ErrorCode::kUnsupported, source, ": torch_dtype \"", dtype_text, "\" is not supported (bfloat16, float16, float32)");

  if (auto q = config.find("quantization_config"); q != config.end() && !q->is_null()) {
    spec.quant = parse_quantization_config(*q, source + " quantization_config", false);
    check_quantized_shapes(spec, source);
  }

  spec.bos_token_id = optional_int(config, "bos_token_id", -1, source);
  if (auto eos = config.find("eos_token_id"); eos != config.end() && !eos->is_null()) {
    if (eos->is_number_integer()) {
      spec.eos_token_ids.push_back(eos->get<int64_t>());
    } else if (eos->is_array()) {
      for (const auto& e : *eos) {
        if (!e.is_number_integer()) fail(ErrorCode::kInvalidArgument, source, ": eos_token_id entries must be integers, found ", e.dump());
        spec.eos_token_ids.push_back(e.get<int64_t>());
      }
    } else {
      fail(ErrorCode::kInvalidArgument, source, ": eos_token_id must be an integer or a list of integers, found ", eos->dump());
    }
  }
  // The sampler writes -inf at logits[row * vocab + eos] (min_tokens): an id
  // outside the vocabulary would be a write outside the buffer.
  for (int64_t id : spec.eos_token_ids)
    if (id < 0 || id >= spec.vocab_size)
      fail(ErrorCode::kInvalidArgument, source, ": eos_token_id ", id, " is outside the vocabulary [0, ", spec.vocab_size,
           ") of vocab_size");
  return spec;
}

}  // namespace

ModelSpec load_model_config(const std::filesystem::path& config_json) {
  std::ifstream in(config_json);
  if (!in) fail(ErrorCode::kNotFound, config_json.string(), ": cannot open (does the model directory hold a config.json?)");
  json config;
  try {
    config = parse_json_file(in, config_json.string());
  } catch (const json::parse_error& e) {
    fail(ErrorCode::kCorruptFile, config_json.string(), ": not valid JSON: ", e.what());
  }
  // Older GPTQ checkpoints keep their settings beside config.json.
  const std::filesystem::path separate = config_json.parent_path() / "quantize_config.json";
  std::error_code ec;
  if (!config.contains("quantization_config") && std::filesystem::is_regular_file(separate, ec)) {
    std::ifstream qin(separate);
    json q;
    try {
      q = parse_json_file(qin, separate.string());
    } catch (const json::parse_error& e) {
      fail(ErrorCode::kCorruptFile, separate.string(), ": not valid JSON: ", e.what());
    }
    ModelSpec spec = parse_model_config(config, config_json.string());
    spec.quant = parse_quantization_config(q, separate.string(), true);
    check_quantized_shapes(spec, separate.string());
    return spec;
  }
  return parse_model_config(config, config_json.string());
}

json model_config_json(const ModelSpec& spec) {
  json c;
  c["architectures"] = json::array({spec.architecture});
  c["model_type"] = spec.model_type.empty() ? family_name(spec.family) : spec.model_type;
  c["vocab_size"] = spec.vocab_size;
  c["hidden_size"] = spec.hidden_size;
  c["intermediate_size"] = spec.intermediate_size;
  c["num_hidden_layers"] = spec.n_layers;
  c["num_attention_heads"] = spec.n_heads;
  c["num_key_value_heads"] = spec.n_kv_heads;
  c["head_dim"] = spec.head_dim;
  c["hidden_act"] = "silu";  // every family shardlm reads
  c["rms_norm_eps"] = spec.rms_norm_eps;
  c["rope_theta"] = spec.rope_theta;
  c["max_position_embeddings"] = spec.max_position_embeddings;
  c["tie_word_embeddings"] = spec.tie_word_embeddings;
  if (spec.rope_scaling.type.empty()) {
    c["rope_scaling"] = nullptr;
  } else if (spec.rope_scaling.type == "linear") {
    c["rope_scaling"] = {{"rope_type", "linear"}, {"factor", spec.rope_scaling.factor}};
  } else if (spec.rope_scaling.type == "longrope") {
    // max_position_embeddings as the model was trained for (factor × original).
    const RopeScaling& r = spec.rope_scaling;
    c["rope_scaling"] = {{"type", "longrope"}, {"short_factor", r.short_factor}, {"long_factor", r.long_factor}};
    c["original_max_position_embeddings"] = r.original_max_position_embeddings;
    c["max_position_embeddings"] =
        static_cast<int64_t>(std::llround(r.factor * static_cast<double>(r.original_max_position_embeddings)));
  } else {
    c["rope_scaling"] = {{"rope_type", spec.rope_scaling.type},
                         {"factor", spec.rope_scaling.factor},
                         {"low_freq_factor", spec.rope_scaling.low_freq_factor},
                         {"high_freq_factor", spec.rope_scaling.high_freq_factor},
                         {"original_max_position_embeddings", spec.rope_scaling.original_max_position_embeddings}};
  }
  const FamilyDef* def = find_family(spec.architecture);
  (def ? *def : family_def(spec.family)).write_config(spec, c);
  c["torch_dtype"] = dtype_torch_name(spec.dtype);
  if (spec.quant.enabled()) c["quantization_config"] = quantization_config_json(spec.quant);
  if (spec.bos_token_id >= 0) c["bos_token_id"] = spec.bos_token_id;
  if (spec.eos_token_ids.size() == 1) c["eos_token_id"] = spec.eos_token_ids[0];
  else if (!spec.eos_token_ids.empty()) c["eos_token_id"] = spec.eos_token_ids;
  return c;
}

std::string ModelSpec::max_position_source() const {
  return "max_position_embeddings in config.json";
}

bool ModelSpec::is_moe_layer(int64_t layer) const {
  if (!is_moe()) return false;
  for (int64_t l : mlp_only_layers)
    if (l == layer) return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

int64_t ModelSpec::n_moe_layers() const {
  int64_t n = 0;
  for (int64_t l = 0; l < n_layers; ++l) n += is_moe_layer(l) ? 1 : 0;
  return n;
}

int64_t shape_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

const char* quant_part_name(QuantPart part) {
  switch (part) {
    case QuantPart::kNone: return "weight";
    case QuantPart::kQWeight: return "qweight";
    case QuantPart::kQZeros: return "qzeros";
    case QuantPart::kScales: return "scales";
    case QuantPart::kGIdx: return "g_idx";
    case QuantPart::kFp8Weight: return "weight";
    case QuantPart::kScaleInv: return "weight_scale_inv";
  }
  return "?";
}

void check_quantized_shapes(const ModelSpec& spec, const std::string& source) {
  const QuantConfig& q = spec.quant;
  if (q.method != QuantMethod::kAwq && q.method != QuantMethod::kGptq) return;
  // GPTQModel refuses to quantize a tied lm_head, and vLLM reads a tied
  // model's lm_head from the float embed_tokens: a checkpoint claiming both
  // has no one reading that shardlm could match.
  if (q.lm_head && spec.tie_word_embeddings)
    fail(ErrorCode::kUnsupported, q.source.empty() ? source : q.source, ": field \"lm_head\" is true (a quantized lm_head) but config.json has "
         "tie_word_embeddings=true, so the lm_head is the embedding table, which stays unquantized; GPTQModel "
         "quantizes the lm_head of untied models only. Set tie_word_embeddings to false in config.json if the "
         "checkpoint carries lm_head.qweight, or \"lm_head\" to false");
  for (const TensorSpec& t : expected_tensors(spec)) {
    if (t.part != QuantPart::kQWeight) continue;
    const int64_t pf = q.pack_factor();
    const bool awq = q.method == QuantMethod::kAwq;
    // AWQ packs output channels; GPTQ packs input rows (qweight) and output channels (qzeros).
    if (t.out_features % pf != 0)
      fail(ErrorCode::kUnsupported, source, ": ", t.module, " has ", t.out_features, " output features, not a multiple of ",
           pf, " (the ", q.bits, "-bit values per int32 word of quantization_config bits=", q.bits, ")");
    if (!awq && t.in_features % pf != 0)
      fail(ErrorCode::kUnsupported, source, ": ", t.module, " has ", t.in_features, " input features, not a multiple of ",
           pf, " (the ", q.bits, "-bit values per int32 word of quantization_config bits=", q.bits, ")");
    if (q.group_size > 0 && t.in_features % q.group_size != 0)
      fail(ErrorCode::kUnsupported, source, ": ", t.module, " has ", t.in_features,
           " input features, not a multiple of quantization_config group_size=", q.group_size,
           " (shardlm needs whole groups)");
  }
}

std::vector<TensorSpec> expected_tensors(const ModelSpec& s) {
  std::vector<TensorSpec> out;
  const int64_t h = s.hidden_size;
  auto global = [&](const std::string& name, std::vector<int64_t> shape, bool optional, TensorSlot slot,
                    ShardRole role) {
    TensorSpec t{name, std::move(shape), optional, -1};
    t.slot = slot;
    t.role = role;
    out.push_back(std::move(t));
  };
  const std::string& p = s.tensor_prefix;
  global(p + "model.embed_tokens.weight", {s.vocab_size, h}, false, TensorSlot::kEmbedding, ShardRole::kVocab);
  const FamilyDef& family = family_def(s.family);
  for (int64_t l = 0; l < s.n_layers; ++l) family.layer_tensors(s, l, out);
  global(p + "model.norm.weight", {h}, false, TensorSlot::kFinalNorm, ShardRole::kReplicated);
  if (s.quant.quantizes(p + "lm_head")) {
    // GPTQ "lm_head": true: the decoder's layout, rows of the vocabulary per rank.
    append_linear_tensors(s, p + "lm_head", s.vocab_size, h, TensorSlot::kLmHead, ShardRole::kVocab, ShardSpace::kNone,
                          -1, -1, out);
  } else {
    global(p + "lm_head.weight", {s.vocab_size, h}, s.tie_word_embeddings, TensorSlot::kLmHead, ShardRole::kVocab);
  }
  return out;
}

}  // namespace shardlm
