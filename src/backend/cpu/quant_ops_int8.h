// The int8-activation kernels of quant_ops (AVX-512 VNNI), used by
// quant_matmul under QuantActivations::kInt8. Internal to the backend layer.
#pragma once

#include <cstdint>

#include "backend/cpu/quant_ops.h"

namespace shardlm::backend {

// Inputs per activation block: each block of x has its own int8 scale.
constexpr int64_t kActBlock = 32;

// Whether this build has the kernels (AVX-512 F/BW/VL + VNNI).
bool int8_activation_kernels_built();
// Whether they run `w`: AWQ or GPTQ whose groups follow the rows (no act-order),
// n_in and the group size multiples of kActBlock, in a build that has them.
bool int8_activations_apply(const QuantMatrixView& w);
// y[n, n_out] = x̂[n, n_in] × Wᵀ, x̂ = x quantized to int8 per kActBlock
// inputs (d = max|x| / 127, x̂ = d × round(x / d)). Requires int8_activations_apply(w).
void int8_activation_matmul(const float* x, int64_t n, const QuantMatrixView& w, float* y);

}  // namespace shardlm::backend
