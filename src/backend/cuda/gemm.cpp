#include "backend/cuda/gemm.h"

#include "backend/cuda/cuda_check.h"
#include "core/error.h"

namespace shardlm::backend::cuda {

LtGemm::LtGemm(size_t workspace_bytes) : workspace_bytes_(workspace_bytes) {
  SHARDLM_CUBLAS_CHECK(cublasLtCreate(&handle_));
  if (workspace_bytes_ > 0) SHARDLM_CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
}

LtGemm::~LtGemm() {
  for (auto& [key, p] : plans_) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.desc);
  }
  if (workspace_) cudaFree(workspace_);
  if (handle_) cublasLtDestroy(handle_);
}

// Row-major y[n, m] = x[n, k] · W[m, k]ᵀ is column-major yᵀ[m, n] = op(W)·xᵀ
// with W seen column-major as [k, m] (transposed by the op) and x as [k, n].
const LtGemm::Plan& LtGemm::plan_for(int64_t n, int64_t m, int64_t k) {
  const auto key = std::make_tuple(n, m, k);
  if (auto it = plans_.find(key); it != plans_.end()) return it->second;
  Plan p;
  SHARDLM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  SHARDLM_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof trans_a));
  SHARDLM_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof trans_b));
  SHARDLM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, k, m, k));
  SHARDLM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, k, n, k));
  SHARDLM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, m, n, m));

  cublasLtMatmulPreference_t pref = nullptr;
  SHARDLM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  SHARDLM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                            &workspace_bytes_, sizeof workspace_bytes_));
  cublasLtMatmulHeuristicResult_t result{};
  int n_results = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.c, p.c, pref, 1, &result, &n_results);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || n_results == 0) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.desc);
    fail(ErrorCode::kUnsupported, "cuBLASLt has no BF16 GEMM algorithm for y[", n, ", ", m, "] = x[", n, ", ", k,
         "] × W[", m, ", ", k, "]ᵀ (", cublasLtGetStatusName(st), ")");
  }
  p.algo = result.algo;
  return plans_.emplace(key, p).first->second;
}

void LtGemm::matmul(const __nv_bfloat16* x, int64_t n, const __nv_bfloat16* w, int64_t m, int64_t k, float* y,
                    cudaStream_t stream) {
  if (n <= 0 || m <= 0) return;
  if (k <= 0) fail(ErrorCode::kInvalidArgument, "CUDA GEMM: inner dimension k = ", k, " must be positive");
  const Plan& p = plan_for(n, m, k);
  const float alpha = 1.0f, beta = 0.0f;
  SHARDLM_CUBLAS_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &p.algo,
                                      workspace_, workspace_bytes_, stream));
}

}  // namespace shardlm::backend::cuda
