#include "model/quantized_linear.h"

#include <algorithm>

#include "core/error.h"

namespace shardlm {

backend::WeightScheme weight_scheme(const QuantConfig& quant) {
  switch (quant.method) {
    case QuantMethod::kAwq: return backend::WeightScheme::kAwq;
    case QuantMethod::kGptq: return backend::WeightScheme::kGptq;
    case QuantMethod::kFp8: return backend::WeightScheme::kFp8;
    case QuantMethod::kNone: break;
  }
  return backend::WeightScheme::kDense;
}

void adopt_checkpoint_scales_dtype(ModelSpec& spec, const WeightSource& weights) {
  if (!spec.quant.enabled()) return;
  for (const TensorSpec& t : expected_tensors(spec)) {
    if (t.part != QuantPart::kScales && t.part != QuantPart::kScaleInv) continue;
    if (const WeightRef* ref = weights.find(t.name)) spec.quant.scales_dtype = ref->dtype;
    return;
  }
}

void check_part_dtype(const ModelSpec& spec, const TensorSpec& t, DType found, const std::string& source) {
  if (t.part == QuantPart::kNone) {
    if (spec.quant.enabled() && !is_compute_dtype(found))
      fail(ErrorCode::kUnsupported, source, ": tensor ", t.name, " is ", dtype_safetensors_name(found), ", but ",
           spec.quant.source, " (", spec.quant.describe(), ") leaves it unquantized: expected F32, F16 or BF16");
    return;
  }
  if (std::find(t.dtypes.begin(), t.dtypes.end(), found) != t.dtypes.end()) return;
  std::string accepted;
  for (DType d : t.dtypes) accepted += (accepted.empty() ? "" : " or ") + std::string(dtype_safetensors_name(d));
  fail(ErrorCode::kUnsupported, source, ": tensor ", t.name, " is ", dtype_safetensors_name(found), ", but ",
       spec.quant.source, " (", spec.quant.describe(), ") stores ", quant_part_name(t.part), " as ", accepted);
}

backend::Linear assemble_linear(const ModelSpec& spec, const std::string& module,
                                const std::map<std::string, HeldTensor>& held, const std::string& source) {
  auto get = [&](const char* suffix) -> const HeldTensor& {
    auto it = held.find(module + suffix);
    SHARDLM_CHECK(it != held.end(), "tensor ", module, suffix, " not in this rank's shard");
    return it->second;
  };
  backend::Linear l;
  const QuantConfig& q = spec.quant;
  if (!q.quantizes(module)) {
    l.weight = get(".weight").tensor;
    return l;
  }
  backend::QuantizedWeight& w = l.quant;
  w.scheme = weight_scheme(q);
  w.bits = q.bits;
  if (q.method == QuantMethod::kFp8) {
    const HeldTensor& fw = get(".weight");
    l.weight = fw.tensor;  // [n_out, n_in] F8_E4M3
    w.n_out = l.weight.dim(0);
    w.n_in = l.weight.dim(1);
    w.scales = get(".weight_scale_inv").tensor;
    if (!q.weight_block_size.empty()) {
      w.block_n = q.weight_block_size[0];
      w.block_k = q.weight_block_size[1];
      // A slice that starts inside a block (a K/V head range under uneven TP) keeps that block's scale.
      if (fw.shard.split_dim == 0) w.row_offset = fw.shard.slice.begin % w.block_n;
      if (fw.shard.split_dim == 1) w.col_offset = fw.shard.slice.begin % w.block_k;
    } else if (w.scales.numel() == 1) {  // per tensor
      w.block_n = w.n_out;
      w.block_k = w.n_in;
    } else {  // per output channel
      SHARDLM_CHECK(w.scales.numel() == w.n_out, "per-channel weight_scale_inv of ", module, ": ",
                    w.scales.describe(), " for ", w.n_out, " channels");
      w.block_n = 1;
      w.block_k = w.n_in;
      w.scales = w.scales.reshape({w.n_out, 1});
    }
    return l;
  }
  const HeldTensor& qw = get(".qweight");
  const int64_t pf = q.pack_factor();
  w.qweight = qw.tensor;
  w.qzeros = get(".qzeros").tensor;
  const HeldTensor& scales = get(".scales");
  w.scales = scales.tensor;
  if (q.method == QuantMethod::kAwq) {  // qweight [n_in, n_out / 8]
    w.n_in = qw.tensor.dim(0);
    w.n_out = qw.tensor.dim(1) * pf;
    w.group_size = q.group_rows(qw.shard.full_shape[0]);
    return l;
  }
  // GPTQ: qweight [n_in / p, n_out]
  w.n_in = qw.tensor.dim(0) * pf;
  w.n_out = qw.tensor.dim(1);
  w.group_size = q.group_rows(qw.shard.full_shape[0] * pf);
  w.zero_offset = q.zero_offset;
  // Scales split on input rows start at the group of the rank's first row;
  // act-order (and group_size -1) keep every group on every rank.
  w.group_offset = scales.shard.split_dim == 0 ? scales.shard.slice.begin : 0;
  const HeldTensor& g_idx = get(".g_idx");
  w.g_idx = g_idx.tensor;
  const int64_t n_groups = w.scales.dim(0);
  const int32_t* gi = static_cast<const int32_t*>(w.g_idx.data());
  for (int64_t k = 0; k < w.g_idx.numel(); ++k) {
    const int64_t local = gi[k] - w.group_offset;
    if (local < 0 || local >= n_groups)
      fail(ErrorCode::kInvalidArgument, source, ": tensor ", module, ".g_idx has ", gi[k], " at row ",
           g_idx.shard.split_dim == 0 ? g_idx.shard.slice.begin + k : k, ", but ", module, ".scales holds groups [",
           w.group_offset, ", ", w.group_offset + n_groups, ") for those rows (", q.describe(),
           "); the checkpoint's g_idx does not belong to its scales");
  }
  return l;
}

}  // namespace shardlm
