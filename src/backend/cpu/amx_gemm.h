// y[n, m] = x[n, k] · W[m, k]ᵀ for bf16 W on Intel AMX tiles (Sapphire
// Rapids and later), at f32-level accuracy: x is split into two bf16 parts,
// x = x_hi + x_lo (x_hi = bf16(x), x_lo = bf16(x − x_hi)), so x is carried
// to about 2^-17 of its value, and each bf16 × bf16 product is exact in the
// tile's f32 accumulators. Two tile products per input thus cost a fraction
// of one f32 FMA pass. Internal to the backend layer (packed_gemm.cpp).
#pragma once

#include <cstdint>

namespace shardlm::backend {

// Whether this build has the AMX kernel and the OS lets this process use the
// tile registers (asked once: arch_prctl ARCH_REQ_XCOMP_PERM). The variable
// SHARDLM_AMX=off turns it off (then the AVX f32 kernel runs).
bool amx_available();

// x: [n, k] f32; w: [m, k] bf16 bits; y: [n, m] f32 (overwritten).
void amx_matmul_bf16(const float* x, int64_t n, const uint16_t* w, int64_t m, int64_t k, float* y);

}  // namespace shardlm::backend
