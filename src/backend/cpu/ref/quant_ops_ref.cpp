// Scalar reference of the quantized kernels: each weight element unpacked
// and dequantized on its own, straight from the layout's definition.
#include <vector>

#include "backend/cpu/quant_ops.h"
#include "core/error.h"

namespace shardlm::backend {

QuantMatrixView quant_view(const QuantizedWeight& q, const Tensor& fp8) {
  QuantMatrixView v;
  v.scheme = q.scheme;
  v.bits = q.bits;
  v.n_out = q.n_out;
  v.n_in = q.n_in;
  v.group_size = q.group_size;
  v.zero_offset = q.zero_offset;
  v.group_offset = q.group_offset;
  v.qweight = q.qweight.defined() ? static_cast<const int32_t*>(q.qweight.data()) : nullptr;
  v.qzeros = q.qzeros.defined() ? static_cast<const int32_t*>(q.qzeros.data()) : nullptr;
  v.scales = q.scales.data();
  v.scales_dtype = q.scales.dtype();
  v.n_groups = q.scales.rank() == 0 ? 1 : q.scales.dim(0);
  v.scale_cols = q.scales.rank() >= 2 ? q.scales.dim(1) : 1;
  v.g_idx = q.g_idx.defined() ? static_cast<const int32_t*>(q.g_idx.data()) : nullptr;
  v.weight = fp8.defined() ? static_cast<const uint8_t*>(fp8.data()) : nullptr;
  v.block_n = q.block_n;
  v.block_k = q.block_k;
  v.row_offset = q.row_offset;
  v.col_offset = q.col_offset;
  return v;
}

namespace ref {

namespace {

// The unsigned `bits`-bit field `index` of a packed word.
inline int32_t field(int32_t word, int index, int bits) {
  return static_cast<int32_t>((static_cast<uint32_t>(word) >> (index * bits)) & ((1u << bits) - 1u));
}

constexpr int kAwqReverse[8] = {0, 4, 1, 5, 2, 6, 3, 7};  // channel j of a word sits in nibble kAwqReverse[j]

float element(const QuantMatrixView& w, int64_t n, int64_t k) {
  const auto scale = [&](int64_t row, int64_t col, int64_t cols) {
    return load_as_f32(w.scales, w.scales_dtype, static_cast<size_t>(row * cols + col));
  };
  switch (w.scheme) {
    case WeightScheme::kAwq: {
      const int64_t words = w.n_out / 8, g = k / w.group_size;
      const int q = field(w.qweight[k * words + n / 8], kAwqReverse[n % 8], 4);
      const int z = field(w.qzeros[g * words + n / 8], kAwqReverse[n % 8], 4);
      return static_cast<float>(q - z) * scale(g, n, w.n_out);
    }
    case WeightScheme::kGptq: {
      const int p = 32 / w.bits;
      const int64_t g = w.g_idx[k] - w.group_offset;
      SHARDLM_CHECK(g >= 0 && g < w.n_groups, "g_idx ", w.g_idx[k], " at row ", k, " outside the groups held");
      const int q = field(w.qweight[(k / p) * w.n_out + n], static_cast<int>(k % p), w.bits);
      const int z = field(w.qzeros[g * (w.n_out / p) + n / p], static_cast<int>(n % p), w.bits) + w.zero_offset;
      return static_cast<float>(q - z) * scale(g, n, w.n_out);
    }
    case WeightScheme::kFp8:
      return f8e4m3_to_f32(w.weight[n * w.n_in + k]) * scale((n + w.row_offset) / w.block_n,
                                                         (k + w.col_offset) / w.block_k, w.scale_cols);
    case WeightScheme::kDense: break;
  }
  fail(ErrorCode::kInternal, "ref::dequantize on a dense matrix");
}

}  // namespace

void dequantize(const QuantMatrixView& w, float* out) {
  for (int64_t n = 0; n < w.n_out; ++n)
    for (int64_t k = 0; k < w.n_in; ++k) out[n * w.n_in + k] = element(w, n, k);
}

void quant_matmul(const float* x, int64_t n_tokens, const QuantMatrixView& w, const VectorView* bias, float* y) {
  std::vector<float> row(static_cast<size_t>(w.n_in));
  for (int64_t n = 0; n < w.n_out; ++n) {
    for (int64_t k = 0; k < w.n_in; ++k) row[k] = element(w, n, k);
    const float b = bias ? load_as_f32(bias->data, bias->dtype, static_cast<size_t>(n)) : 0.0f;
    for (int64_t t = 0; t < n_tokens; ++t) {
      double s = 0.0;
      for (int64_t k = 0; k < w.n_in; ++k) s += static_cast<double>(x[t * w.n_in + k]) * row[k];
      y[t * w.n_out + n] = static_cast<float>(s) + b;
    }
  }
}

}  // namespace ref

}  // namespace shardlm::backend
