// The quantized kernels built for one ISA whatever -march the rest of the
// build has (flags: src/backend/CMakeLists.txt), chosen at run time by
// quant_matmul from active_cpu_isa(). Internal to the backend layer.
#pragma once

#include <cstdint>

#include "backend/cpu/quant_ops.h"

namespace shardlm::backend::quant_avx2 {

// AWQ and GPTQ (4 or 8 bits, act-order too) with f32 activations:
// y[n, n_out] = x[n, n_in] × Wᵀ, no bias (quant_matmul's kF32 contract).
// Each output element sums x·q over each group's rows in increasing k with
// one FMA chain and folds the groups in order, so its value does not depend
// on n or on the token tile (batch invariance). Runs only on a CPU with
// AVX2, FMA and F16C (detected_cpu_isa() >= kAvx2).
void quant_matmul(const float* x, int64_t n, const QuantMatrixView& w, float* y);

}  // namespace shardlm::backend::quant_avx2
