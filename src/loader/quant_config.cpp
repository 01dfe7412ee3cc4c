#include "loader/quant_config.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"

namespace shardlm {

using nlohmann::json;

const char* quant_method_name(QuantMethod method) {
  switch (method) {
    case QuantMethod::kNone: return "none";
    case QuantMethod::kAwq: return "awq";
    case QuantMethod::kGptq: return "gptq";
    case QuantMethod::kFp8: return "fp8";
  }
  return "?";
}

bool QuantConfig::quantizes(const std::string& module) const {
  if (method == QuantMethod::kNone) return false;
  if (module.find("embed_tokens") != std::string::npos) return false;
  const bool head = module == "lm_head" ||
                    (module.size() > 8 && module.compare(module.size() - 8, 8, ".lm_head") == 0);  // language_model.lm_head
  if (head && !lm_head) return false;
  for (const std::string& skip : modules_to_not_convert)
    if (!skip.empty() && module.find(skip) != std::string::npos) return false;
  return true;
}

int64_t QuantConfig::group_rows(int64_t in_features) const {
  return group_size == -1 ? in_features : group_size;
}

int64_t QuantConfig::n_groups(int64_t in_features) const {
  const int64_t g = group_rows(in_features);
  return g > 0 ? (in_features + g - 1) / g : 0;
}

std::string QuantConfig::describe() const {
  switch (method) {
    case QuantMethod::kNone: return "unquantized";
    case QuantMethod::kAwq: return str_cat("awq ", bits, "-bit group ", group_size);
    case QuantMethod::kGptq:
      return str_cat("gptq ", bits, "-bit group ", group_size, sym ? " sym" : " asym", desc_act ? " desc_act" : "",
                     lm_head ? " lm_head" : "");
    case QuantMethod::kFp8:
      return weight_block_size.empty()
                 ? std::string("fp8 e4m3 per-tensor/per-channel scales")
                 : str_cat("fp8 e4m3 block [", weight_block_size[0], ", ", weight_block_size[1], "]");
  }
  return "?";
}

namespace {

// Reads one field of a quantization_config with its checks; every field the
// config holds must be claimed by exactly one reader (else it is unknown).
class Fields {
 public:
  Fields(const json& config, std::string source, std::string method)
      : config_(config), source_(std::move(source)), method_(std::move(method)) {}

  const json* get(const char* field) {
    claimed_.insert(field);
    auto it = config_.find(field);
    if (it == config_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  int64_t integer(const char* field, int64_t fallback, bool required) {
    const json* v = get(field);
    if (v == nullptr) {
      if (required) fail(ErrorCode::kInvalidArgument, source_, ": field \"", field, "\" is missing; ", method_, " needs it");
      return fallback;
    }
    if (!v->is_number_integer())
      fail(ErrorCode::kInvalidArgument, source_, ": field \"", field, "\" must be an integer, found ", v->dump());
    return v->get<int64_t>();
  }

  bool boolean(const char* field, bool fallback) {
    const json* v = get(field);
    if (v == nullptr) return fallback;
    if (!v->is_boolean())
      fail(ErrorCode::kInvalidArgument, source_, ": field \"", field, "\" must be true or false, found ", v->dump());
    return v->get<bool>();
  }

  std::string text(const char* field, const std::string& fallback) {
    const json* v = get(field);
    if (v == nullptr) return fallback;
    if (!v->is_string())
      fail(ErrorCode::kInvalidArgument, source_, ": field \"", field, "\" must be a string, found ", v->dump());
    return v->get<std::string>();
  }

  // The value must be one of `supported`.
  template <typename T>
  void require_one_of(const char* field, const T& found, std::initializer_list<T> supported, const char* why = "") {
    if (std::find(supported.begin(), supported.end(), found) != supported.end()) return;
    std::string list;
    for (const T& s : supported) list += (list.empty() ? "" : ", ") + json(s).dump();
    fail(ErrorCode::kUnsupported, source_, ": field \"", field, "\" is ", json(found).dump(), "; shardlm runs ", method_,
         " with ", field, " ", list, why);
  }

  std::vector<std::string> string_list(const char* field) {
    const json* v = get(field);
    std::vector<std::string> out;
    if (v == nullptr) return out;
    if (!v->is_array())
      fail(ErrorCode::kInvalidArgument, source_, ": field \"", field, "\" must be a list of module names or null, found ",
           v->dump());
    for (const json& e : *v) {
      if (!e.is_string())
        fail(ErrorCode::kInvalidArgument, source_, ": field \"", field, "\" must list module names (strings), found ",
             e.dump());
      out.push_back(e.get<std::string>());
    }
    return out;
  }

  // Fields that only describe calibration or a GPU runtime option: they do
  // not change the stored weights or their meaning, so any value is accepted.
  void accept(std::initializer_list<const char*> fields) {
    for (const char* f : fields) claimed_.insert(f);
  }

  // Refuses any field no reader claimed.
  void refuse_unknown() const {
    for (const auto& [key, value] : config_.items()) {
      if (claimed_.count(key)) continue;
      std::string known;
      for (const std::string& k : claimed_) known += (known.empty() ? "" : ", ") + k;
      fail(ErrorCode::kUnsupported, source_, ": field \"", key, "\" (", value.dump(), ") is not a ", method_,
           " field shardlm knows, so it cannot tell what it changes; known fields: ", known);
    }
  }

 private:
  const json& config_;
  std::string source_;
  std::string method_;
  std::set<std::string> claimed_;
};

void parse_awq(Fields& f, QuantConfig* q) {
  q->bits = static_cast<int>(f.integer("bits", 0, true));
  f.require_one_of<int64_t>("bits", q->bits, {4});
  q->group_size = f.integer("group_size", 0, true);
  f.require_one_of<int64_t>("group_size", q->group_size, {64, 128});
  q->zero_point = f.boolean("zero_point", true);
  f.require_one_of("zero_point", q->zero_point, {true});
  std::string version = f.text("version", "gemm");
  std::transform(version.begin(), version.end(), version.begin(), [](unsigned char c) { return std::tolower(c); });
  f.require_one_of<std::string>("version", version, {"gemm"},
                                " (the GEMV, Marlin and ExLlama variants pack their words differently)");
  const std::string backend = f.text("backend", "autoawq");
  f.require_one_of<std::string>("backend", backend, {"autoawq"});
  q->modules_to_not_convert = f.string_list("modules_to_not_convert");
  // AutoAWQ has no quantized lm_head layout (it skips lm_head when it
  // quantizes, and vLLM's AWQ reads lm_head unquantized): refuse one by name.
  f.require_one_of("lm_head", f.boolean("lm_head", false), {false},
                   " (AutoAWQ keeps lm_head in the checkpoint dtype: there is no published AWQ layout of a quantized"
                   " lm_head; GPTQ checkpoints can carry one)");
  // Runtime fusing options of transformers' AwqConfig: no effect on the weights.
  f.accept({"do_fuse", "fuse_max_seq_len", "modules_to_fuse", "exllama_config"});
}

void parse_gptq(Fields& f, QuantConfig* q) {
  q->bits = static_cast<int>(f.integer("bits", 0, true));
  f.require_one_of<int64_t>("bits", q->bits, {4, 8});
  q->group_size = f.integer("group_size", 128, false);
  f.require_one_of<int64_t>("group_size", q->group_size, {-1, 32, 64, 128});
  q->sym = f.boolean("sym", true);
  q->desc_act = f.boolean("desc_act", false);
  q->checkpoint_format = f.text("checkpoint_format", "gptq");
  f.require_one_of<std::string>("checkpoint_format", q->checkpoint_format, {"gptq", "gptq_v2"},
                                " (Marlin and BitBLAS repack the words)");
  q->zero_offset = q->checkpoint_format == "gptq" ? 1 : 0;
  const std::string format = f.text("format", q->checkpoint_format);
  f.require_one_of<std::string>("format", format, {"gptq", "gptq_v2"});
  f.require_one_of("is_marlin_format", f.boolean("is_marlin_format", false), {false});
  q->lm_head = f.boolean("lm_head", false);  // lm_head.{qweight,qzeros,scales,g_idx}, the decoder's layout
  const std::string pack_dtype = f.text("pack_dtype", "int32");
  f.require_one_of<std::string>("pack_dtype", pack_dtype, {"int32"});
  if (const json* v = f.get("modules_in_block_to_quantize"); v != nullptr)
    fail(ErrorCode::kUnsupported, q->source, ": field \"modules_in_block_to_quantize\" is ", v->dump(),
         "; shardlm runs GPTQ checkpoints whose every decoder Linear is quantized (null)");
  const std::string block = f.text("block_name_to_quantize", "model.layers");
  f.require_one_of<std::string>("block_name_to_quantize", block, {"model.layers"});
  q->modules_to_not_convert = f.string_list("modules_to_not_convert");
  // Calibration settings and GPU kernel choices: they do not change what the
  // stored words mean. static_groups only fixes the groups before act-order;
  // g_idx records them either way.
  f.accept({"damp_percent", "damp_auto_increment", "true_sequential", "static_groups", "dataset", "tokenizer",
            "batch_size", "cache_block_outputs", "use_cuda_fp16", "use_exllama", "exllama_config", "max_input_length",
            "model_seqlen", "module_name_preceding_first_block", "pad_token_id", "model_name_or_path",
            "model_file_base_name", "meta", "quantizer", "mse", "use_marlin", "backend", "disable_exllama", "v2",
            "v2_alpha", "damp", "hyb_act", "mock_quantization", "desc_act_group_size"});
}

void parse_fp8(Fields& f, QuantConfig* q) {
  q->bits = 8;
  const std::string fmt = f.text("fmt", "e4m3");
  f.require_one_of<std::string>("fmt", fmt, {"e4m3"});
  const std::string act = f.text("activation_scheme", "dynamic");
  f.require_one_of<std::string>("activation_scheme", act, {"dynamic"},
                                " (static needs per-layer input scales, which shardlm does not read)");
  if (const json* v = f.get("weight_block_size"); v != nullptr) {
    if (!v->is_array() || v->size() != 2 || !(*v)[0].is_number_integer() || !(*v)[1].is_number_integer() ||
        (*v)[0].get<int64_t>() <= 0 || (*v)[1].get<int64_t>() <= 0)
      fail(ErrorCode::kInvalidArgument, q->source, ": field \"weight_block_size\" must be two positive integers [rows, cols] or null, found ",
           v->dump());
    q->weight_block_size = {(*v)[0].get<int64_t>(), (*v)[1].get<int64_t>()};
  }
  q->modules_to_not_convert = f.string_list("modules_to_not_convert");
}

}  // namespace

QuantConfig parse_quantization_config(const json& config, const std::string& source, bool separate_file) {
  if (!config.is_object())
    fail(ErrorCode::kInvalidArgument, source, ": must be an object, found ", config.dump());
  QuantConfig q;
  q.source = source;
  std::string method;
  if (auto it = config.find("quant_method"); it != config.end() && !it->is_null()) {
    if (!it->is_string())
      fail(ErrorCode::kInvalidArgument, source, ": field \"quant_method\" must be a string, found ", it->dump());
    method = it->get<std::string>();
  } else if (separate_file) {
    method = "gptq";  // AutoGPTQ's quantize_config.json before it wrote the field
  } else {
    fail(ErrorCode::kInvalidArgument, source, ": field \"quant_method\" is missing; expected one of \"awq\", \"gptq\", \"fp8\"");
  }
  Fields f(config, source, method);
  f.get("quant_method");
  if (method == "awq") {
    q.method = QuantMethod::kAwq;
    parse_awq(f, &q);
  } else if (method == "gptq") {
    q.method = QuantMethod::kGptq;
    parse_gptq(f, &q);
  } else if (method == "fp8") {
    q.method = QuantMethod::kFp8;
    q.scales_dtype = DType::kBF16;
    parse_fp8(f, &q);
  } else {
    fail(ErrorCode::kUnsupported, source, ": field \"quant_method\" is \"", method,
         "\"; shardlm reads \"awq\", \"gptq\" and \"fp8\" checkpoints");
  }
  f.refuse_unknown();
  return q;
}

QuantConfig published_quant_config(const std::string& format, int64_t group_size, bool desc_act, bool sym,
                                   const std::string& option) {
  json c;
  const bool gptq = format == "gptq" || format == "gptq-int8";
  if (!gptq && (desc_act || !sym))
    fail(ErrorCode::kInvalidArgument, "--desc-act and --asym apply to GPTQ, not to ", option, " ", format);
  if (format == "awq") {
    c = {{"quant_method", "awq"}, {"bits", 4}, {"group_size", group_size}, {"zero_point", true}, {"version", "gemm"}};
  } else if (gptq) {
    c = {{"quant_method", "gptq"}, {"bits", format == "gptq" ? 4 : 8}, {"group_size", group_size},
         {"desc_act", desc_act}, {"sym", sym}};
  } else if (format == "fp8") {
    c = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"},
         {"weight_block_size", {128, 128}}, {"modules_to_not_convert", json::array({"lm_head"})}};
  } else {
    fail(ErrorCode::kInvalidArgument, option, " \"", format, "\" is not a quantization shardlm knows; use awq, gptq, gptq-int8 or fp8");
  }
  try {
    return parse_quantization_config(c, option + " " + format, false);
  } catch (const Error& e) {
    fail(ErrorCode::kInvalidArgument, option, " ", format, " with group size ", group_size, ": ", e.what());
  }
}

void enable_quantized_lm_head(QuantConfig& q, const std::string& option) {
  if (q.method != QuantMethod::kGptq)
    fail(ErrorCode::kInvalidArgument, option, " applies to gptq and gptq-int8: ", quant_method_name(q.method),
         " checkpoints as published keep lm_head in the checkpoint dtype (AutoAWQ never quantizes it; FP8 lists it"
         " in modules_to_not_convert)");
  q.lm_head = true;
}

json quantization_config_json(const QuantConfig& q) {
  json c;
  switch (q.method) {
    case QuantMethod::kNone: return json();
    case QuantMethod::kAwq:
      // As Qwen/Qwen2.5-72B-Instruct-AWQ's config.json.
      c = {{"bits", q.bits}, {"group_size", q.group_size}, {"modules_to_not_convert", nullptr},
           {"quant_method", "awq"}, {"version", "gemm"}, {"zero_point", q.zero_point}};
      break;
    case QuantMethod::kGptq:
      // As Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4's config.json (calibration fields included).
      c = {{"batch_size", 1}, {"bits", q.bits}, {"block_name_to_quantize", nullptr}, {"cache_block_outputs", true},
           {"damp_percent", 0.01}, {"dataset", nullptr}, {"desc_act", q.desc_act}, {"exllama_config", {{"version", 1}}},
           {"group_size", q.group_size}, {"max_input_length", nullptr}, {"model_seqlen", nullptr},
           {"module_name_preceding_first_block", nullptr}, {"modules_in_block_to_quantize", nullptr},
           {"pad_token_id", nullptr}, {"quant_method", "gptq"}, {"sym", q.sym}, {"tokenizer", nullptr},
           {"true_sequential", true}, {"use_cuda_fp16", false}, {"use_exllama", true}};
      if (q.checkpoint_format != "gptq" && !q.checkpoint_format.empty()) c["checkpoint_format"] = q.checkpoint_format;
      if (q.lm_head) c["lm_head"] = true;  // as GPTQModel writes it (transformers' GPTQConfig has no such field)
      break;
    case QuantMethod::kFp8:
      // As Qwen/Qwen3-8B-FP8's config.json.
      c = {{"activation_scheme", "dynamic"}, {"fmt", "e4m3"}, {"quant_method", "fp8"}};
      c["weight_block_size"] = q.weight_block_size.empty() ? json() : json(q.weight_block_size);
      c["modules_to_not_convert"] = q.modules_to_not_convert;
      break;
  }
  if (q.method != QuantMethod::kFp8 && !q.modules_to_not_convert.empty())
    c["modules_to_not_convert"] = q.modules_to_not_convert;
  return c;
}

}  // namespace shardlm
