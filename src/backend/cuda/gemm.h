// BF16 GEMM on tensor cores through cuBLASLt, for prefill and batched decode:
//   y[n, m] (f32) = x[n, k] (bf16) × W[m, k]ᵀ (bf16)
// the layout of backend::matmul (W as stored in the checkpoint, row-major
// [out, in]). f32 accumulation and output: the residual stream stays f32.
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>

namespace shardlm::backend::cuda {

class LtGemm {
 public:
  // workspace_bytes of device memory for cuBLASLt (allocated here, once).
  explicit LtGemm(size_t workspace_bytes = size_t{32} << 20);
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // x: [n, k] bf16; w: [m, k] bf16; y: [n, m] f32. The algorithm per (n, m, k)
  // is chosen once by cuBLASLt's heuristic and cached, so a CUDA-graph replay
  // and every later step use the same one.
  void matmul(const __nv_bfloat16* x, int64_t n, const __nv_bfloat16* w, int64_t m, int64_t k, float* y,
              cudaStream_t stream);

  size_t workspace_bytes() const { return workspace_bytes_; }

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  const Plan& plan_for(int64_t n, int64_t m, int64_t k);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<std::tuple<int64_t, int64_t, int64_t>, Plan> plans_;
};

}  // namespace shardlm::backend::cuda
