// Round-to-nearest quantization of a Linear into the published storage
// layouts (loader/quant_config.h), and the scalar dequantization that reads
// them back. make-model writes synthetic AWQ/GPTQ/FP8 checkpoints with the
// first; the second is the oracle the quantized kernels are tested against
// (the Python reference in tests/reference/ unpacks with its own code).
//
// Quantization, per group of input rows g and output channel n (AWQ and
// GPTQ asym): scale = (max - min) / maxq, zero = round(-min / scale) in
// [0, maxq], q = clamp(round(w / scale) + zero, 0, maxq); GPTQ widens
// [min, max] to hold 0, as its quantizer does; GPTQ sym: scale =
// 2 max|w| / maxq, zero = (maxq + 1) / 2. Scales are rounded to their stored
// dtype before q is computed, so dequantization reproduces q exactly. FP8
// blocks: scale_inv = amax / 448, q = e4m3(w / scale_inv).
// GPTQ desc_act: rows are taken in order of decreasing sum of squares of the
// weight column (the diagonal GPTQ's act-order sorts by, up to a factor)
// and grouped in that order; g_idx records each row's group. The "gptq"
// checkpoint format stores zero - 1, so zeros are kept >= 1 there.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "loader/model_spec.h"

namespace shardlm {

// The bytes of every tensor of one quantized Linear, by part, in the
// dtypes and shapes expected_tensors lists for it. w is the [n_out, n_in]
// weight, row-major f32. `parts` are the module's TensorSpecs (their shapes
// and first dtypes are what is produced).
std::map<QuantPart, std::vector<uint8_t>> quantize_linear(const QuantConfig& quant, const float* w, int64_t n_out,
                                                          int64_t n_in, const std::vector<TensorSpec>& parts);

// One stored part for dequantize_linear: bytes in `dtype` with `shape`.
struct QuantPartView {
  const void* data = nullptr;
  DType dtype = DType::kI32;
  std::vector<int64_t> shape;
};

// The [n_out, n_in] f32 weight a quantized Linear stands for. Throws
// Error(kInvalidArgument) naming the part when one is missing or its shape
// does not match.
std::vector<float> dequantize_linear(const QuantConfig& quant, const std::map<QuantPart, QuantPartView>& parts,
                                     int64_t n_out, int64_t n_in);

}  // namespace shardlm
