// y[n, m] = x[n, k] · W[m, k]ᵀ for any number of rows n, each weight vector
// widened once and used by a register tile of rows (so the 2–16 rows of a
// batched decode step read W once, not once per row), and with one
// reduction order for every output element whatever n is:
//   lane l of the element's accumulator sums w[i]·x[i] for i ≡ l (mod L) in
//   increasing i with FMAs over the whole vectors of k (L = 16 on AVX-512,
//   8 on AVX2); the L lanes are added by a fixed pairwise tree
//   (lane i + lane i + L/2, then + L/4, ...); the k % L tail is added
//   after, in order. Scalar: one sequential sum per element.
//   bf16 weights on AVX-512 take the pair order instead: over blocks of 32
//   in increasing order, lane j adds w[32b + 2j]·x[32b + 2j], then
//   w[32b + 2j + 1]·x[32b + 2j + 1] (the last block's elements past k count
//   as zeros, so there is no separate tail); then the same tree. Every n
//   (1 included) sums that way, so invariance holds as before.
// The tile shape, the thread split, the token blocking, the loop order
// (rows_gemm_impl.h's chunks) and the prefetching change with n; none of
// them changes that order, so a row's output is bit-identical
// computed alone or among any others (batch invariance: backend/cpu/ops.h).
// Built once per ISA (backend/cpu/isa/rows_gemm_*.cpp) and chosen at run
// time (backend/cpu/cpu_isa.h). Internal to the backend layer.
#pragma once

#include <cstdint>

#include "core/cpu_isa.h"
#include "core/dtype.h"

namespace shardlm::backend {

// Whether rows_gemm has a kernel for this weight dtype (f32, bf16, f16).
bool rows_gemm_supports(DType weight_dtype);

// x: [n, k] f32; w: [m, k] in weight_dtype; y: [n, m] f32 (overwritten).
// isa: the kernel to run (at most detected_cpu_isa(); avx512bf16 runs the
// avx512 kernel: the exact path takes no bf16 dot products).
void rows_gemm(CpuIsa isa, const float* x, int64_t n, const void* w, DType weight_dtype, int64_t m, int64_t k,
               float* y);

// One matrix of rows_gemm_many: w [m, k] in the call's weight dtype,
// y [n, m] f32 (overwritten).
struct RowsGemmPart {
  const void* w = nullptr;
  int64_t m = 0;
  float* y = nullptr;
};
// The most parts one rows_gemm_many call takes (q, k, v are 3; the work
// list's offsets live on the stack).
constexpr int64_t kRowsGemmMaxParts = 8;

// rows_gemm of the same x [n, k] against parts[0, n_parts), every matrix in
// weight_dtype (q, k, v; gate, up): one parallel region whose one dynamic
// work list holds every part's row blocks, so the small matrices share one
// ramp-up and one end barrier instead of paying one each. Each part's y is
// bit-identical to rows_gemm on that matrix alone (the same tiles over the
// same token groups; only which thread runs a block and when changes).
// Counted in the kernel report as n_parts matmuls, each with its own shape.
void rows_gemm_many(CpuIsa isa, const float* x, int64_t n, int64_t k, DType weight_dtype, const RowsGemmPart* parts,
                    int64_t n_parts);

// One build per ISA, each in its own namespace (same contracts as rows_gemm
// and rows_gemm_many; rows_gemm is rows_gemm_many of one part).
namespace rows_avx512 {
void rows_gemm_many(const float* x, int64_t n, int64_t k, DType weight_dtype, const RowsGemmPart* parts,
                    int64_t n_parts);
}
namespace rows_avx2 {
void rows_gemm_many(const float* x, int64_t n, int64_t k, DType weight_dtype, const RowsGemmPart* parts,
                    int64_t n_parts);
}
namespace rows_scalar {
void rows_gemm_many(const float* x, int64_t n, int64_t k, DType weight_dtype, const RowsGemmPart* parts,
                    int64_t n_parts);
}

}  // namespace shardlm::backend
