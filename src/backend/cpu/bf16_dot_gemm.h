// y[n, m] = bf16(x)[n, k] · W[m, k]ᵀ for bf16 weights W: the opt-in
// DenseActivations::kBf16 path of backend::matmul (backend/ops.h). Each
// activation row is rounded to bf16 once per call (round to nearest even;
// inputs and results below 2^-126 count as zero, as VCVTNE2PS2BF16 and
// VDPBF16PS do), then multiplied against the stored bf16 weights with
// AVX512_BF16 VDPBF16PS, which sums pairs of exact bf16 products into f32.
//
// The result is NOT the exact path's: each x[i] moves by up to 2^-8 |x[i]|
// (bf16 keeps 8 significant bits), so |y − y_exact| <= 2^-8 Σ_i |x[i] w[i]|
// plus f32 summation error (tests/backend/bf16_dot_gemm_test.cpp checks it).
//
// Two kernels, register-tiled, threaded over weight-row blocks like
// backend/rows_gemm.h (dynamic chunks), token-blocked to stay in L2:
//   dot (n < kBf16TokenVectorMinRows, and every n in batch-invariant mode):
//     tiles of RB weight rows × TB tokens (8 × ≤3 for decode, 4 × ≤6), each
//     element's 16-lane accumulator takes the 32-wide k chunks in order (the
//     k % 32 tail zero-padded into a last chunk), then a fixed pairwise tree
//     over the lanes. That order depends on k alone, not on n, the tile or
//     the thread: a row's output is bit-identical alone or among any others,
//     so the path keeps --batch-invariant's guarantee.
//   token-vector (prefill, large batches): tokens along the vector (the bf16
//     activations re-laid as panels of 16 tokens × k pairs), each weight pair
//     broadcast from where W is stored (no copy of W), 12 rows × 32 tokens
//     per tile, no horizontal sum: each element sums its pairs in k order.
// The kernels carry their own target attributes (they build without
// -march=native) and run only where CPUID reports AVX512_BF16 and
// SHARDLM_ISA does not cap it (backend/cpu_isa.h). Internal to the backend.
#pragma once

#include <cstdint>

namespace shardlm::backend {

// From how many rows the token-vector kernel runs (outside batch-invariant mode).
constexpr int64_t kBf16TokenVectorMinRows = 16;

// Whether this build compiled the kernel (x86-64, a compiler with AVX512_BF16).
bool bf16_dot_gemm_built();
// Built, and active_cpu_isa() is avx512bf16 (the CPU has AVX512_BF16 and
// SHARDLM_ISA does not cap it below).
bool bf16_dot_gemm_runs();
// Why bf16_dot_gemm_runs() is false ("" when it is true), for error messages.
const char* bf16_dot_gemm_missing();

// x: [n, k] f32; w: [m, k] bf16 (raw bits); y: [n, m] f32 (overwritten).
// Throws Error(kUnsupported) where bf16_dot_gemm_runs() is false.
void bf16_dot_gemm(const float* x, int64_t n, const uint16_t* w, int64_t m, int64_t k, float* y);

}  // namespace shardlm::backend
