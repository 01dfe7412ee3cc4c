#include "backend/cuda/device_memory.h"

#include "backend/cuda/cuda_check.h"
#include "core/error.h"

namespace shardlm::backend::cuda {

DeviceMemInfo CudaMemInfo::query() {
  SHARDLM_CUDA_CHECK(cudaSetDevice(device_));
  SHARDLM_CUDA_CHECK(cudaDeviceSynchronize());
  size_t free_b = 0, total_b = 0;
  SHARDLM_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return {.free_bytes = free_b, .total_bytes = total_b};
}

namespace {
// The CUDA context must exist before the baseline, or its creation would be
// charged to the first allocation.
int with_context(int device) {
  SHARDLM_CUDA_CHECK(cudaSetDevice(device));
  SHARDLM_CUDA_CHECK(cudaFree(nullptr));
  return device;
}
}  // namespace

DeviceArena::DeviceArena(int device) : device_(with_context(device)), info_(device), accounting_(info_) {}

DeviceArena::~DeviceArena() {
  cudaSetDevice(device_);
  for (void* p : blocks_) cudaFree(p);
}

void* DeviceArena::allocate(MemCategory category, size_t bytes) {
  void* p = nullptr;
  accounting_.measure(category, bytes, [&] {
    const cudaError_t st = cudaMalloc(&p, bytes);
    if (st != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free error state
      const DeviceMemInfo now = info_.query();
      fail(ErrorCode::kOutOfMemory, "GPU ", device_, ": cannot allocate ", bytes, " bytes for ",
           mem_category_name(category), " (", cudaGetErrorName(st), "; ", now.free_bytes, " of ", now.total_bytes,
           " bytes free); lower --gpu-memory-utilization or --max-num-seqs, or use more -tp ranks");
    }
  });
  blocks_.push_back(p);
  return p;
}

}  // namespace shardlm::backend::cuda
