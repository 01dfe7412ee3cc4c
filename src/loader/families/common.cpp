// The pieces family tables share: a layer's tensor table (with the quantized
// parts of a Linear), the Llama-named attention and MLP, and the refusals of
// config fields that several families carry.
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "loader/config_fields.h"
#include "loader/families/family.h"

namespace shardlm {

using nlohmann::json;

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

LayerTable::LayerTable(const ModelSpec& spec, int64_t layer, std::vector<TensorSpec>& out)
    : spec_(spec), layer_(layer), prefix_(spec.tensor_prefix + "model.layers." + std::to_string(layer) + "."), out_(out) {}

void LayerTable::add(const std::string& name, std::vector<int64_t> shape, TensorSlot slot, ShardRole role,
                     ShardSpace space) {
  TensorSpec t{prefix_ + name, std::move(shape), false, layer_};
  t.slot = slot;
  t.role = role;
  t.space = space;
  out_.push_back(std::move(t));
}

void append_linear_tensors(const ModelSpec& spec, const std::string& module, int64_t n_out, int64_t n_in,
                           TensorSlot slot, ShardRole role, ShardSpace space, int64_t expert, int64_t layer,
                           std::vector<TensorSpec>& out) {
  const QuantConfig& q = spec.quant;
  auto part = [&](QuantPart p, std::string tensor, std::vector<int64_t> shape, std::vector<DType> dtypes) {
    TensorSpec t{std::move(tensor), std::move(shape), false, layer};
    t.dtypes = std::move(dtypes);
    t.part = p;
    t.module = module;
    t.out_features = n_out;
    t.in_features = n_in;
    t.slot = slot;
    t.role = role;
    t.space = space;
    t.expert = expert;
    out.push_back(std::move(t));
    return &out.back();
  };
  if (!q.quantizes(module)) {
    part(QuantPart::kNone, module + ".weight", {n_out, n_in}, {});
    return;
  }
  auto quant = [&](QuantPart p, std::vector<int64_t> shape, std::vector<DType> dtypes) {
    return part(p, module + "." + quant_part_name(p), std::move(shape), std::move(dtypes));
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
      quant(QuantPart::kQWeight, {n_in, n_out / pf}, {DType::kI32});
      quant(QuantPart::kQZeros, {q.n_groups(n_in), n_out / pf}, {DType::kI32});
      quant(QuantPart::kScales, {q.n_groups(n_in), n_out}, scale_dtypes);
      break;
    case QuantMethod::kGptq:
      quant(QuantPart::kQWeight, {n_in / pf, n_out}, {DType::kI32});
      quant(QuantPart::kQZeros, {q.n_groups(n_in), n_out / pf}, {DType::kI32});
      quant(QuantPart::kScales, {q.n_groups(n_in), n_out}, scale_dtypes);
      quant(QuantPart::kGIdx, {n_in}, {DType::kI32});
      break;
    case QuantMethod::kFp8: {
      quant(QuantPart::kFp8Weight, {n_out, n_in}, {DType::kF8E4M3});
      if (q.weight_block_size.empty()) {
        TensorSpec* t = quant(QuantPart::kScaleInv, {}, scale_dtypes);
        t->other_shapes = {{1}, {n_out}, {n_out, 1}};
      } else {
        quant(QuantPart::kScaleInv, {ceil_div(n_out, q.weight_block_size[0]), ceil_div(n_in, q.weight_block_size[1])},
              scale_dtypes);
      }
      break;
    }
    case QuantMethod::kNone: break;
  }
}

// The tensors of one Linear [n_out, n_in] named `module` of this layer.
void LayerTable::linear(const std::string& name, int64_t n_out, int64_t n_in, TensorSlot slot, ShardRole role,
                        ShardSpace space, int64_t expert) {
  append_linear_tensors(spec_, prefix_ + name, n_out, n_in, slot, role, space, expert, layer_, out_);
}

void LayerTable::fused_linear(const std::string& name, std::vector<FusedPart> parts, int64_t n_in) {
  const std::string module = prefix_ + name;
  if (spec_.quant.quantizes(module))
    fail(ErrorCode::kUnsupported, spec_.quant.source, ": ", module, " is a fused Linear of ", spec_.architecture,
         "; shardlm shards fused Linears of unquantized checkpoints only (", spec_.quant.describe(), " is not supported yet)");
  int64_t rows = 0;
  for (const FusedPart& p : parts) rows += p.rows;
  TensorSpec t{module + ".weight", {rows, n_in}, false, layer_};
  t.module = module;
  t.out_features = rows;
  t.in_features = n_in;
  t.slot = parts.front().slot;
  t.role = ShardRole::kFusedParts;
  t.fused = std::move(parts);
  out_.push_back(std::move(t));
}

void llama_attention_tensors(LayerTable& t) {
  const ModelSpec& s = t.spec();
  const int64_t h = s.hidden_size;
  t.add("input_layernorm.weight", {h}, TensorSlot::kAttnNorm);
  t.linear("self_attn.q_proj", s.q_dim(), h, TensorSlot::kQ, ShardRole::kColumn, ShardSpace::kQHeads);
  t.linear("self_attn.k_proj", s.kv_dim(), h, TensorSlot::kK, ShardRole::kColumn, ShardSpace::kKvHeads);
  t.linear("self_attn.v_proj", s.kv_dim(), h, TensorSlot::kV, ShardRole::kColumn, ShardSpace::kKvHeads);
  if (s.qkv_bias) {
    t.add("self_attn.q_proj.bias", {s.q_dim()}, TensorSlot::kQBias, ShardRole::kColumn, ShardSpace::kQHeads);
    t.add("self_attn.k_proj.bias", {s.kv_dim()}, TensorSlot::kKBias, ShardRole::kColumn, ShardSpace::kKvHeads);
    t.add("self_attn.v_proj.bias", {s.kv_dim()}, TensorSlot::kVBias, ShardRole::kColumn, ShardSpace::kKvHeads);
  }
  if (s.qk_norm) {
    t.add("self_attn.q_norm.weight", {s.head_dim}, TensorSlot::kQNorm);
    t.add("self_attn.k_norm.weight", {s.head_dim}, TensorSlot::kKNorm);
  }
  t.linear("self_attn.o_proj", h, s.q_dim(), TensorSlot::kO, ShardRole::kRow, ShardSpace::kQHeads);
}

void llama_mlp_tensors(LayerTable& t) {
  const ModelSpec& s = t.spec();
  const int64_t h = s.hidden_size, i = s.intermediate_size;
  t.add("post_attention_layernorm.weight", {h}, TensorSlot::kMlpNorm);
  t.linear("mlp.gate_proj", i, h, TensorSlot::kGate, ShardRole::kColumn, ShardSpace::kIntermediate);
  t.linear("mlp.up_proj", i, h, TensorSlot::kUp, ShardRole::kColumn, ShardSpace::kIntermediate);
  t.linear("mlp.down_proj", h, i, TensorSlot::kDown, ShardRole::kRow, ShardSpace::kIntermediate);
}

void require_silu(const json& config, const ModelSpec& spec, const std::string& source) {
  if (auto act = config.find("hidden_act"); act != config.end() && !act->is_null()) {
    if (!act->is_string() || act->get<std::string>() != "silu")
      fail(ErrorCode::kUnsupported, source, ": hidden_act ", act->dump(), " is not supported for ", spec.architecture,
           "; its MLPs and experts are SwiGLU with silu (every released config says \"silu\")");
  }
}

void refuse_attention_bias(const json& config, const ModelSpec& spec, const std::string& source) {
  if (optional_bool(config, "attention_bias", false, source))
    fail(ErrorCode::kUnsupported, source, ": attention_bias=true (biases on q_proj, k_proj, v_proj and o_proj) is not supported for ",
         spec.architecture, "; shardlm runs these models without attention biases (every released Llama 3, Mistral and Qwen3 config sets false)");
}

void refuse_mlp_bias(const json& config, const std::string& source) {
  if (optional_bool(config, "mlp_bias", false, source))
    fail(ErrorCode::kUnsupported, source, ": mlp_bias=true is not supported");
}

void refuse_qwen_sliding_window(const json& config, const std::string& source) {
  if (optional_bool(config, "use_sliding_window", false, source))
    fail(ErrorCode::kUnsupported, source, ": use_sliding_window=true (sliding-window attention on layers from max_window_layers) is not "
         "supported; shardlm computes full attention only. Set use_sliding_window to false (every released Qwen2.5/Qwen3 config does)");
}

namespace {

// sliding_window: null, or a positive integer (returned; 0 for null).
int64_t sliding_window_field(const json& config, const std::string& source) {
  auto w = config.find("sliding_window");
  if (w == config.end() || w->is_null()) return 0;
  if (!w->is_number_integer() || w->get<int64_t>() <= 0)
    fail(ErrorCode::kInvalidArgument, source, ": field \"sliding_window\" must be null or a positive integer, found ", w->dump());
  return w->get<int64_t>();
}

}  // namespace

void mistral_sliding_window(const json& config, ModelSpec& spec, const std::string& source) {
  const int64_t w = sliding_window_field(config, source);
  if (w > 0 && w < spec.max_position_embeddings) {
    spec.sliding_window = w;
    spec.sliding_layers.assign(static_cast<size_t>(spec.n_layers), true);
  }
}

void write_mistral_sliding_window(const ModelSpec& spec, json& config) {
  if (spec.sliding_layers.empty()) {
    config["sliding_window"] = nullptr;
  } else {
    config["sliding_window"] = spec.sliding_window;
  }
}

void refuse_sliding_window_field(const json& config, const ModelSpec& spec, const std::string& source) {
  const int64_t w = sliding_window_field(config, source);
  if (w > 0)
    fail(ErrorCode::kUnsupported, source, ": sliding_window=", w, " is not supported for ", spec.architecture,
         " (each token would attend to the last ", w, " positions only; shardlm computes full attention); "
         "remove the field or set it to null");
}

}  // namespace shardlm
