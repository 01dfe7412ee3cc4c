#include "backend/cuda/cuda_check.h"

#include "core/error.h"

namespace shardlm::backend::cuda {

void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
  const char* name = cudaGetErrorName(status);
  const char* text = cudaGetErrorString(status);
  if (status == cudaErrorMemoryAllocation)
    fail(ErrorCode::kOutOfMemory, "CUDA out of memory in ", call, " (", file, ":", line,
         "); lower --gpu-memory-utilization, --max-num-seqs or --max-num-batched-tokens, or use more -tp ranks");
  if (status == cudaErrorNoKernelImageForDevice || status == cudaErrorUnsupportedPtxVersion)
    fail(ErrorCode::kUnsupported, "CUDA: ", name, " in ", call, ": this build has no kernels for this GPU's "
         "architecture; rebuild with -DCMAKE_CUDA_ARCHITECTURES=<its compute capability, e.g. 86>");
  if (status == cudaErrorInsufficientDriver || status == cudaErrorNoDevice)
    fail(ErrorCode::kUnsupported, "CUDA: ", name, " (", text, ") in ", call,
         "; `shardlm doctor` shows the driver and devices");
  fail(ErrorCode::kInternal, "CUDA error ", name, " (", text, ") in ", call, " at ", file, ":", line);
}

void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status == CUBLAS_STATUS_ALLOC_FAILED)
    fail(ErrorCode::kOutOfMemory, "cuBLAS could not allocate in ", call, " (", file, ":", line, ")");
  fail(ErrorCode::kInternal, "cuBLAS error ", cublasLtGetStatusName(status), " (", cublasLtGetStatusString(status),
       ") in ", call, " at ", file, ":", line);
}

}  // namespace shardlm::backend::cuda
