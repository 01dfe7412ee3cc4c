// y[n, m] = x[n, k] · W[m, k]ᵀ for many tokens (prefill, large decode
// batches): a GotoBLAS-style GEMM. W is widened to f32 one panel at a time
// (kNR output rows × kKC of k, a few tens of KiB, in L1/L2), never as a whole
// copy, and each panel is reused by every token of the call through an
// outer-product register tile (kMR tokens × kNR outputs of accumulators).
// bf16 weights go to AMX tiles where the CPU and OS allow (backend/cpu/amx_gemm.h).
// Internal to the backend layer: backend::matmul chooses it by token count.
#pragma once

#include <cstdint>

#include "backend/cpu/quant_ops.h"
#include "core/dtype.h"

namespace shardlm::backend {

// Whether packed_matmul has a kernel for this build and weight dtype
// (f32, bf16, f16 with AVX2+FMA+F16C or AVX-512).
bool packed_matmul_available(DType weight_dtype);

// From how many tokens on packed_matmul beats the rows kernel
// (backend/cpu/rows_gemm.h): 8 for bf16 on AMX tiles (backend/cpu/amx_gemm.h), 32
// for the AVX kernel (measured with 2 threads on Qwen2.5-0.5B's layer shapes).
int64_t packed_matmul_min_tokens(DType weight_dtype);

// Whether packed_matmul runs this dtype on AMX tiles.
bool packed_uses_amx(DType weight_dtype);

// x: [n, k] f32 rows; w: [m, k] rows of weight_dtype; y: [n, m] f32 (overwritten).
void packed_matmul(const float* x, int64_t n, const void* w, DType weight_dtype, int64_t m, int64_t k, float* y);

// FP8 E4M3 weights with block scales through the same GEMM: each panel is
// widened and scaled while it is packed (panels end on scale blocks along k).
// Available when a SIMD load never straddles a scale block: block_k and the
// slice's col_offset multiples of the vector width.
bool packed_fp8_available(const QuantMatrixView& w);
// x: [n, w.n_in]; y: [n, w.n_out] (overwritten).
void packed_matmul_fp8(const float* x, int64_t n, const QuantMatrixView& w, float* y);

}  // namespace shardlm::backend
