#include "backend/cpu/rows_gemm.h"

#include "backend/cpu/kernel_report.h"
#include "core/error.h"

namespace shardlm::backend {

bool rows_gemm_supports(DType weight_dtype) {
  return weight_dtype == DType::kF32 || weight_dtype == DType::kBF16 || weight_dtype == DType::kF16;
}

void rows_gemm(CpuIsa isa, const float* x, int64_t n, const void* w, DType weight_dtype, int64_t m, int64_t k,
               float* y) {
  if (!rows_gemm_supports(weight_dtype))
    fail(ErrorCode::kUnsupported, "matmul: no kernel for ", dtype_safetensors_name(weight_dtype),
         " weights without a quantization scheme");
  SHARDLM_CHECK(static_cast<int>(isa) <= static_cast<int>(detected_cpu_isa()), "rows_gemm: ", cpu_isa_name(isa),
                " requested, the CPU runs at most ", cpu_isa_name(detected_cpu_isa()));
  const char* weights = kernel_weights_name(weight_dtype);
  switch (isa) {
    case CpuIsa::kAvx512Bf16:
    case CpuIsa::kAvx512:
      count_kernel("rows/avx512", weights, n, m, k);
      return rows_avx512::rows_gemm(x, n, w, weight_dtype, m, k, y);
    case CpuIsa::kAvx2:
      count_kernel("rows/avx2", weights, n, m, k);
      return rows_avx2::rows_gemm(x, n, w, weight_dtype, m, k, y);
    case CpuIsa::kScalar:
      count_kernel("rows/scalar", weights, n, m, k);
      return rows_scalar::rows_gemm(x, n, w, weight_dtype, m, k, y);
  }
}

}  // namespace shardlm::backend
