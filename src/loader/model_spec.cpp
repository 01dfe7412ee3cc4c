#include "loader/model_spec.h"

#include <fstream>
#include <sstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace shardlm {

using nlohmann::json;

const char* family_name(Family family) {
  switch (family) {
    case Family::kQwen2: return "qwen2";
    case Family::kQwen3: return "qwen3";
    case Family::kLlama: return "llama";
    case Family::kMistral: return "mistral";
    case Family::kMixtral: return "mixtral";
    case Family::kQwen3Moe: return "qwen3_moe";
  }
  return "?";
}

namespace {

struct ArchitectureInfo {
  const char* architecture;
  Family family;
};

constexpr ArchitectureInfo kArchitectures[] = {
    {"Qwen2ForCausalLM", Family::kQwen2},     {"Qwen3ForCausalLM", Family::kQwen3},
    {"LlamaForCausalLM", Family::kLlama},     {"MistralForCausalLM", Family::kMistral},
    {"MixtralForCausalLM", Family::kMixtral}, {"Qwen3MoeForCausalLM", Family::kQwen3Moe},
};

std::string supported_list() {
  std::string out;
  for (const auto& a : kArchitectures) out += (out.empty() ? "" : ", ") + std::string(a.architecture);
  return out;
}

// A required positive integer field.
int64_t required_int(const json& config, const char* field, const std::string& source) {
  auto it = config.find(field);
  if (it == config.end() || it->is_null())
    fail(ErrorCode::kInvalidArgument, source, ": field \"", field, "\" is missing; config.json of this architecture must set it");
  if (!it->is_number_integer() || it->get<int64_t>() <= 0)
    fail(ErrorCode::kInvalidArgument, source, ": field \"", field, "\" must be a positive integer, found ", it->dump());
  return it->get<int64_t>();
}

int64_t optional_int(const json& config, const char* field, int64_t fallback, const std::string& source) {
  auto it = config.find(field);
  if (it == config.end() || it->is_null()) return fallback;
  if (!it->is_number_integer() || it->get<int64_t>() < 0)
    fail(ErrorCode::kInvalidArgument, source, ": field \"", field, "\" must be a non-negative integer, found ", it->dump());
  return it->get<int64_t>();
}

double optional_number(const json& config, const char* field, double fallback, const std::string& source) {
  auto it = config.find(field);
  if (it == config.end() || it->is_null()) return fallback;
  if (!it->is_number())
    fail(ErrorCode::kInvalidArgument, source, ": field \"", field, "\" must be a number, found ", it->dump());
  return it->get<double>();
}

bool optional_bool(const json& config, const char* field, bool fallback, const std::string& source) {
  auto it = config.find(field);
  if (it == config.end() || it->is_null()) return fallback;
  if (!it->is_boolean())
    fail(ErrorCode::kInvalidArgument, source, ": field \"", field, "\" must be true or false, found ", it->dump());
  return it->get<bool>();
}

// Sliding-window attention is not implemented: refuse every config that
// would use it, naming the field, instead of silently computing full attention.
// Qwen2/Qwen3 switch it on with use_sliding_window (sliding_window alone is
// inert there); Mistral and Mixtral apply sliding_window whenever it is set,
// which only changes the result when it is below max_position_embeddings.
void check_sliding_window(const json& config, const ModelSpec& spec, const std::string& source) {
  const bool qwen = spec.family == Family::kQwen2 || spec.family == Family::kQwen3 || spec.family == Family::kQwen3Moe;
  if (qwen) {
    if (optional_bool(config, "use_sliding_window", false, source))
      fail(ErrorCode::kUnsupported, source, ": use_sliding_window=true (sliding-window attention on layers from max_window_layers) is not "
           "supported; shardlm computes full attention only. Set use_sliding_window to false (every released Qwen2.5/Qwen3 config does)");
    return;
  }
  if (spec.family != Family::kMistral && spec.family != Family::kMixtral) return;  // Llama has no window
  auto w = config.find("sliding_window");
  if (w == config.end() || w->is_null()) return;
  if (!w->is_number_integer() || w->get<int64_t>() <= 0)
    fail(ErrorCode::kInvalidArgument, source, ": field \"sliding_window\" must be null or a positive integer, found ", w->dump());
  const int64_t max_pos = optional_int(config, "max_position_embeddings", 4096, source);
  if (w->get<int64_t>() < max_pos)
    fail(ErrorCode::kUnsupported, source, ": sliding_window=", w->get<int64_t>(), " (each token attends to the last ",
         w->get<int64_t>(), " positions only) is not supported; shardlm computes full attention only, which differs beyond ",
         w->get<int64_t>(), " tokens. Mistral v0.3 and Mixtral set sliding_window to null");
}

}  // namespace

ModelSpec parse_model_config(const json& config, const std::string& source) {
  if (!config.is_object()) fail(ErrorCode::kInvalidArgument, source, ": expected a JSON object at the top level");
  ModelSpec spec;
  auto arch = config.find("architectures");
  if (arch == config.end() || !arch->is_array() || arch->empty() || !(*arch)[0].is_string())
    fail(ErrorCode::kInvalidArgument, source, ": field \"architectures\" must be a non-empty list of names, e.g. [\"Qwen2ForCausalLM\"]");
  spec.architecture = (*arch)[0].get<std::string>();
  bool known = false;
  for (const auto& a : kArchitectures) {
    if (spec.architecture == a.architecture) {
      spec.family = a.family;
      known = true;
    }
  }
  if (!known)
    fail(ErrorCode::kUnsupported, source, ": architecture \"", spec.architecture, "\" is not supported; supported: ", supported_list());
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
  // Qwen2 always has q/k/v biases and no o_proj bias (no field says so). In the
  // Llama, Qwen3 and Qwen3-MoE graphs attention_bias puts a bias on q, k, v *and*
  // o_proj; shardlm has no o_proj bias, so it refuses rather than drop it.
  // (Mistral and Mixtral have no attention biases whatever the field says.)
  spec.qkv_bias = spec.family == Family::kQwen2;
  const bool bias_field = spec.family == Family::kLlama || spec.family == Family::kQwen3 || spec.family == Family::kQwen3Moe;
  if (bias_field && optional_bool(config, "attention_bias", false, source))
    fail(ErrorCode::kUnsupported, source, ": attention_bias=true (biases on q_proj, k_proj, v_proj and o_proj) is not supported for ",
         spec.architecture, "; shardlm runs these models without attention biases (every released Llama 3, Mistral and Qwen3 config sets false)");
  check_sliding_window(config, spec, source);
  spec.qk_norm = spec.family == Family::kQwen3 || spec.family == Family::kQwen3Moe;
  // Every family's MLP (dense and each expert) is SwiGLU: silu(gate) × up.
  if (auto act = config.find("hidden_act"); act != config.end() && !act->is_null()) {
    if (!act->is_string() || act->get<std::string>() != "silu")
      fail(ErrorCode::kUnsupported, source, ": hidden_act ", act->dump(), " is not supported; shardlm's MLPs and experts are "
           "SwiGLU with silu (every Qwen, Llama, Mistral and Mixtral config says \"silu\")");
  }
  if (optional_bool(config, "mlp_bias", false, source))
    fail(ErrorCode::kUnsupported, source, ": mlp_bias=true is not supported");

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
    if (!spec.rope_scaling.type.empty() && spec.rope_scaling.type != "llama3")
      fail(ErrorCode::kUnsupported, source, ": rope_scaling type \"", spec.rope_scaling.type,
           "\" is not supported (supported: llama3, or none)");
  }

  if (spec.family == Family::kMixtral) {
    spec.n_experts = required_int(config, "num_local_experts", source);
    spec.n_experts_per_token = required_int(config, "num_experts_per_tok", source);
    spec.moe_intermediate_size = spec.intermediate_size;
    spec.norm_topk_prob = true;  // softmax over the selected experts' logits
  } else if (spec.family == Family::kQwen3Moe) {
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

ModelSpec load_model_config(const std::filesystem::path& config_json) {
  std::ifstream in(config_json);
  if (!in) fail(ErrorCode::kNotFound, config_json.string(), ": cannot open (does the model directory hold a config.json?)");
  json config;
  try {
    config = json::parse(in);
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
      q = json::parse(qin);
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
  c["hidden_act"] = "silu";
  c["rms_norm_eps"] = spec.rms_norm_eps;
  c["rope_theta"] = spec.rope_theta;
  c["max_position_embeddings"] = spec.max_position_embeddings;
  c["tie_word_embeddings"] = spec.tie_word_embeddings;
  if (spec.family == Family::kLlama || spec.family == Family::kQwen3 || spec.family == Family::kQwen3Moe)
    c["attention_bias"] = false;
  if (spec.rope_scaling.type.empty()) {
    c["rope_scaling"] = nullptr;
  } else {
    c["rope_scaling"] = {{"rope_type", spec.rope_scaling.type},
                         {"factor", spec.rope_scaling.factor},
                         {"low_freq_factor", spec.rope_scaling.low_freq_factor},
                         {"high_freq_factor", spec.rope_scaling.high_freq_factor},
                         {"original_max_position_embeddings", spec.rope_scaling.original_max_position_embeddings}};
  }
  if (spec.family == Family::kMixtral) {
    c["num_local_experts"] = spec.n_experts;
    c["num_experts_per_tok"] = spec.n_experts_per_token;
  } else if (spec.family == Family::kQwen3Moe) {
    c["num_experts"] = spec.n_experts;
    c["num_experts_per_tok"] = spec.n_experts_per_token;
    c["moe_intermediate_size"] = spec.moe_intermediate_size;
    c["norm_topk_prob"] = spec.norm_topk_prob;
    c["decoder_sparse_step"] = spec.decoder_sparse_step;
    c["mlp_only_layers"] = spec.mlp_only_layers;
  }
  c["torch_dtype"] = dtype_torch_name(spec.dtype);
  if (spec.quant.enabled()) c["quantization_config"] = quantization_config_json(spec.quant);
  if (spec.bos_token_id >= 0) c["bos_token_id"] = spec.bos_token_id;
  if (spec.eos_token_ids.size() == 1) c["eos_token_id"] = spec.eos_token_ids[0];
  else if (!spec.eos_token_ids.empty()) c["eos_token_id"] = spec.eos_token_ids;
  return c;
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

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The tensors of one Linear [n_out, n_in] named `module`, as the spec's
// quantization stores it (loader/quant_config.h).
void add_linear(const ModelSpec& s, const std::string& module, int64_t n_out, int64_t n_in, int64_t layer,
                std::vector<TensorSpec>* out) {
  const QuantConfig& q = s.quant;
  if (!q.quantizes(module)) {
    out->push_back({module + ".weight", {n_out, n_in}, false, layer});
    return;
  }
  auto part = [&](QuantPart p, std::vector<int64_t> shape, std::vector<DType> dtypes) {
    TensorSpec t{module + "." + quant_part_name(p), std::move(shape), false, layer};
    t.dtypes = std::move(dtypes);
    t.part = p;
    t.module = module;
    t.out_features = n_out;
    t.in_features = n_in;
    out->push_back(std::move(t));
    return &out->back();
  };
  const int64_t pf = q.pack_factor();
  // Accepted scale dtypes, the one this checkpoint uses first (plan counts it).
  const DType other = q.scales_dtype == DType::kF16 || q.scales_dtype == DType::kBF16
                          ? (q.scales_dtype == DType::kF16 ? DType::kBF16 : DType::kF16)
                          : DType::kBF16;
  std::vector<DType> scale_dtypes = {q.scales_dtype, other};
  if (q.method == QuantMethod::kFp8) {
    scale_dtypes = {q.scales_dtype, q.scales_dtype == DType::kF32 ? DType::kBF16 : DType::kF32};
  }
  switch (q.method) {
    case QuantMethod::kAwq:
      part(QuantPart::kQWeight, {n_in, n_out / pf}, {DType::kI32});
      part(QuantPart::kQZeros, {q.n_groups(n_in), n_out / pf}, {DType::kI32});
      part(QuantPart::kScales, {q.n_groups(n_in), n_out}, scale_dtypes);
      break;
    case QuantMethod::kGptq:
      part(QuantPart::kQWeight, {n_in / pf, n_out}, {DType::kI32});
      part(QuantPart::kQZeros, {q.n_groups(n_in), n_out / pf}, {DType::kI32});
      part(QuantPart::kScales, {q.n_groups(n_in), n_out}, scale_dtypes);
      part(QuantPart::kGIdx, {n_in}, {DType::kI32});
      break;
    case QuantMethod::kFp8: {
      part(QuantPart::kFp8Weight, {n_out, n_in}, {DType::kF8E4M3});
      if (q.weight_block_size.empty()) {
        TensorSpec* t = part(QuantPart::kScaleInv, {}, scale_dtypes);
        t->other_shapes = {{1}, {n_out}, {n_out, 1}};
      } else {
        part(QuantPart::kScaleInv, {ceil_div(n_out, q.weight_block_size[0]), ceil_div(n_in, q.weight_block_size[1])},
             scale_dtypes);
      }
      break;
    }
    case QuantMethod::kNone: break;
  }
}

}  // namespace

void check_quantized_shapes(const ModelSpec& spec, const std::string& source) {
  const QuantConfig& q = spec.quant;
  if (q.method != QuantMethod::kAwq && q.method != QuantMethod::kGptq) return;
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
  out.push_back({"model.embed_tokens.weight", {s.vocab_size, h}, false, -1});
  for (int64_t l = 0; l < s.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    auto add = [&](const std::string& name, std::vector<int64_t> shape) { out.push_back({p + name, std::move(shape), false, l}); };
    auto linear = [&](const std::string& module, int64_t n_out, int64_t n_in) { add_linear(s, p + module, n_out, n_in, l, &out); };
    add("input_layernorm.weight", {h});
    linear("self_attn.q_proj", s.q_dim(), h);
    linear("self_attn.k_proj", s.kv_dim(), h);
    linear("self_attn.v_proj", s.kv_dim(), h);
    if (s.qkv_bias) {
      add("self_attn.q_proj.bias", {s.q_dim()});
      add("self_attn.k_proj.bias", {s.kv_dim()});
      add("self_attn.v_proj.bias", {s.kv_dim()});
    }
    if (s.qk_norm) {
      add("self_attn.q_norm.weight", {s.head_dim});
      add("self_attn.k_norm.weight", {s.head_dim});
    }
    linear("self_attn.o_proj", h, s.q_dim());
    add("post_attention_layernorm.weight", {h});
    if (s.family == Family::kMixtral && s.is_moe_layer(l)) {
      add("block_sparse_moe.gate.weight", {s.n_experts, h});
      for (int64_t e = 0; e < s.n_experts; ++e) {
        const std::string ep = "block_sparse_moe.experts." + std::to_string(e) + ".";
        linear(ep + "w1", s.moe_intermediate_size, h);
        linear(ep + "w2", h, s.moe_intermediate_size);
        linear(ep + "w3", s.moe_intermediate_size, h);
      }
    } else if (s.family == Family::kQwen3Moe && s.is_moe_layer(l)) {
      add("mlp.gate.weight", {s.n_experts, h});
      for (int64_t e = 0; e < s.n_experts; ++e) {
        const std::string ep = "mlp.experts." + std::to_string(e) + ".";
        linear(ep + "gate_proj", s.moe_intermediate_size, h);
        linear(ep + "up_proj", s.moe_intermediate_size, h);
        linear(ep + "down_proj", h, s.moe_intermediate_size);
      }
    } else {
      linear("mlp.gate_proj", s.intermediate_size, h);
      linear("mlp.up_proj", s.intermediate_size, h);
      linear("mlp.down_proj", h, s.intermediate_size);
    }
  }
  out.push_back({"model.norm.weight", {h}, false, -1});
  out.push_back({"lm_head.weight", {s.vocab_size, h}, s.tie_word_embeddings, -1});
  return out;
}

}  // namespace shardlm
