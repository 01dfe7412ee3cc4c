#include "backend/cpu/rows_gemm.h"

#include "backend/cpu/kernel_report.h"
#include "core/error.h"

namespace shardlm::backend {

bool rows_gemm_supports(DType weight_dtype) {
  return weight_dtype == DType::kF32 || weight_dtype == DType::kBF16 || weight_dtype == DType::kF16;
}

void rows_gemm(CpuIsa isa, const float* x, int64_t n, const void* w, DType weight_dtype, int64_t m, int64_t k,
               float* y) {
  const RowsGemmPart part{w, m, y};
  rows_gemm_many(isa, x, n, k, weight_dtype, &part, 1);
}

void rows_gemm_many(CpuIsa isa, const float* x, int64_t n, int64_t k, DType weight_dtype, const RowsGemmPart* parts,
                    int64_t n_parts) {
  if (!rows_gemm_supports(weight_dtype))
    fail(ErrorCode::kUnsupported, "matmul: no kernel for ", dtype_safetensors_name(weight_dtype),
         " weights without a quantization scheme");
  SHARDLM_CHECK(static_cast<int>(isa) <= static_cast<int>(detected_cpu_isa()), "rows_gemm: ", cpu_isa_name(isa),
                " requested, the CPU runs at most ", cpu_isa_name(detected_cpu_isa()));
  SHARDLM_CHECK(n_parts >= 0 && n_parts <= kRowsGemmMaxParts, "rows_gemm_many: ", n_parts, " parts (at most ",
                kRowsGemmMaxParts, ")");
  const char* weights = kernel_weights_name(weight_dtype);
  // Each part counts as the matmul it replaces (the report's unit is a matrix).
  auto count = [&](const char* path) {
    for (int64_t p = 0; p < n_parts; ++p) count_kernel(path, weights, n, parts[p].m, k);
  };
  switch (isa) {
    case CpuIsa::kAvx512Bf16:
    case CpuIsa::kAvx512:
      count("rows/avx512");
      return rows_avx512::rows_gemm_many(x, n, k, weight_dtype, parts, n_parts);
    case CpuIsa::kAvx2:
      count("rows/avx2");
      return rows_avx2::rows_gemm_many(x, n, k, weight_dtype, parts, n_parts);
    case CpuIsa::kScalar:
      count("rows/scalar");
      return rows_scalar::rows_gemm_many(x, n, k, weight_dtype, parts, n_parts);
  }
}

}  // namespace shardlm::backend
