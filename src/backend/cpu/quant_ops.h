// Quantized Linear weights as a rank holds them, and the CPU kernels that
// multiply by them. The stored parts keep the checkpoint's dtypes and layout
// (loader/quant_config.h describes them); kernels dequantize in registers,
// never into memory:
//   AWQ  (GEMM packing)  w[n, k] = (q[k, n] - z[k / g, n]) × s[k / g, n]
//   GPTQ (4 or 8 bits)   w[n, k] = (q[k, n] - (z[gi, n] + zero_offset)) × s[gi, n],
//                        gi = g_idx[k] - group_offset (act-order: any group per row)
//   FP8  (E4M3)          w[n, k] = e4m3(weight[n, k]) × scale_inv[(n + r0) / block_n, (k + c0) / block_k]
//                        (r0, c0: where a slice starts inside its first scale block)
// Per group, AWQ and GPTQ accumulate Σ x·q and Σ x and apply the group's
// scale and zero once (y += s × (Σ x·q − z × Σ x)), which is exact algebra.
#pragma once

#include <cstdint>

#include "backend/cpu/ops.h"
#include "core/tensor.h"

namespace shardlm::backend {

// WeightScheme: backend/op_args.h.

// The stored parts of one quantized Linear [n_out, n_in] on this rank (a
// slice: whole packed words on output channels, whole groups on input rows).
struct QuantizedWeight {
  WeightScheme scheme = WeightScheme::kDense;
  int bits = 0;              // awq 4; gptq 4 or 8; fp8 8
  int64_t n_out = 0;         // output channels on this rank
  int64_t n_in = 0;          // input rows on this rank
  int64_t group_size = 0;    // awq/gptq: input rows per group (gptq group_size -1: the full in_features)
  int zero_offset = 0;       // gptq: added to each stored zero (1 for checkpoint_format "gptq", 0 for "gptq_v2")
  int64_t group_offset = 0;  // gptq: the g_idx value of local scales row 0 (row-sliced scales start there)
  Tensor qweight;            // awq [n_in, n_out / 8] I32; gptq [n_in / (32 / bits), n_out] I32
  Tensor qzeros;             // awq/gptq [G, n_out / (32 / bits)] I32
  Tensor scales;             // awq/gptq [G, n_out] F16/BF16; fp8 weight_scale_inv [ceil(n_out / block_n), ceil(n_in / block_k)] F32/BF16
  Tensor g_idx;              // gptq [n_in] I32
  int64_t block_n = 0;       // fp8: output rows per scale (per tensor: n_out; per channel: 1)
  int64_t block_k = 0;       // fp8: input columns per scale (per tensor or channel: n_in)
  int64_t row_offset = 0;    // fp8: local row 0 sits this many rows into its first scale block
  int64_t col_offset = 0;    // fp8: local column 0 sits this many columns into its first scale block
};

// The same, as plain pointers for the kernels. fp8: `weight` is the
// [n_out, n_in] E4M3 matrix.
struct QuantMatrixView {
  WeightScheme scheme = WeightScheme::kDense;
  int bits = 0;
  int64_t n_out = 0;
  int64_t n_in = 0;
  int64_t group_size = 0;
  int zero_offset = 0;
  int64_t group_offset = 0;
  const int32_t* qweight = nullptr;
  const int32_t* qzeros = nullptr;
  const void* scales = nullptr;
  DType scales_dtype = DType::kF16;
  int64_t n_groups = 0;             // rows of scales / qzeros (fp8: scale rows)
  int64_t scale_cols = 0;           // fp8: columns of scale_inv
  const int32_t* g_idx = nullptr;   // gptq
  const uint8_t* weight = nullptr;  // fp8
  int64_t block_n = 0;
  int64_t block_k = 0;
  int64_t row_offset = 0;
  int64_t col_offset = 0;
};

// The view of a rank's QuantizedWeight (fp8 takes the E4M3 matrix `fp8`).
QuantMatrixView quant_view(const QuantizedWeight& q, const Tensor& fp8);

// How the AWQ and GPTQ kernels take the activations x:
//   kF32  x as it is; the weights are dequantized to f32 in registers (exact
//         up to f32 rounding: the reference checks run this way);
//   kInt8 x quantized to int8 per 32 inputs (d = max|x| / 127, as llama.cpp's
//         Q8 activations), then integer dot products with AVX-512 VNNI. The
//         result is W · x̂ with |x − x̂| <= max|x| / 254 per block of 32.
//         Where no int8 kernel applies (a build without VNNI, GPTQ act-order,
//         n_in or the group not a multiple of 32) the f32 kernels run.
// FP8 weights always take f32 activations.
enum class QuantActivations { kF32, kInt8 };
// "f32", "int8"
const char* quant_activations_name(QuantActivations a);
// The process's choice, read once from the environment:
// SHARDLM_QUANT_ACTIVATIONS=int8 (the default when unset) or f32. Any other
// value throws Error(kInvalidArgument) naming the variable and the values.
QuantActivations default_quant_activations();
// Replaces the process's choice (tests; a future CLI flag). Matmuls already
// running keep the value they read.
void set_default_quant_activations(QuantActivations activations);

// y[n, n_out] = x[n, n_in] × Wᵀ (+ bias[n_out]). Threads over output
// channels (a decode step streams the packed words once with every core);
// AVX-512 where the build has it, portable loops otherwise. The first form
// takes default_quant_activations().
void quant_matmul(const float* x, int64_t n, const QuantMatrixView& w, const VectorView* bias, float* y);
void quant_matmul(const float* x, int64_t n, const QuantMatrixView& w, const VectorView* bias, float* y,
                  QuantActivations activations);
// Whether quant_matmul(..., kInt8) runs the int8 kernels on `w` in this build.
bool int8_activations_run(const QuantMatrixView& w);

namespace ref {
// W[n_out, n_in] as f32 (the oracle of the tests; never used on a hot path).
void dequantize(const QuantMatrixView& w, float* out);
// Single-threaded per-element dequantization inside the dot product.
void quant_matmul(const float* x, int64_t n, const QuantMatrixView& w, const VectorView* bias, float* y);
}  // namespace ref

}  // namespace shardlm::backend
