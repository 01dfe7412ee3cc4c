// CUDA / cuBLAS status codes become typed errors naming the call, the file
// and the line (library code never aborts on a device error).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

namespace shardlm::backend::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line);

}  // namespace shardlm::backend::cuda

#define SHARDLM_CUDA_CHECK(expr)                                                              \
  do {                                                                                        \
    cudaError_t shardlm_status_ = (expr);                                                     \
    if (shardlm_status_ != cudaSuccess)                                                       \
      ::shardlm::backend::cuda::throw_cuda_error(shardlm_status_, #expr, __FILE__, __LINE__); \
  } while (0)

#define SHARDLM_CUBLAS_CHECK(expr)                                                              \
  do {                                                                                          \
    cublasStatus_t shardlm_status_ = (expr);                                                    \
    if (shardlm_status_ != CUBLAS_STATUS_SUCCESS)                                               \
      ::shardlm::backend::cuda::throw_cublas_error(shardlm_status_, #expr, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: launch-configuration errors surface here, not later.
#define SHARDLM_CUDA_CHECK_LAUNCH() SHARDLM_CUDA_CHECK(cudaGetLastError())
