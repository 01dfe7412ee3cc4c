// out[i] = sum over ranks of bufs[r][i] for i in [begin, end): the reduce step
// of DeviceLocalComm::all_reduce (out is the calling rank's own buffer).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "comm/cuda/device_local_sum.h"

namespace shardlm {

namespace {

constexpr int kMaxRanks = 16;
struct Ptrs {
  const void* p[kMaxRanks];
};

__device__ __forceinline__ float load(const float* p, size_t i) { return p[i]; }
__device__ __forceinline__ float load(const __nv_bfloat16* p, size_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ float load(const __half* p, size_t i) { return __half2float(p[i]); }
__device__ __forceinline__ void store(float* p, size_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store(__nv_bfloat16* p, size_t i, float v) { p[i] = __float2bfloat16(v); }
__device__ __forceinline__ void store(__half* p, size_t i, float v) { p[i] = __float2half(v); }

template <typename T>
__global__ void sum_kernel(Ptrs bufs, int n, void* out, size_t begin, size_t end) {
  for (size_t i = begin + blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < end;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    float s = 0.0f;
    for (int r = 0; r < n; ++r) s += load(static_cast<const T*>(bufs.p[r]), i);
    store(static_cast<T*>(out), i, s);
  }
}

}  // namespace

cudaError_t device_local_sum(const void* const* bufs, int n, int kind, void* out, size_t begin, size_t end,
                             cudaStream_t stream) {
  if (n > kMaxRanks) return cudaErrorInvalidValue;
  if (end <= begin) return cudaSuccess;
  Ptrs p{};
  for (int r = 0; r < n; ++r) p.p[r] = bufs[r];
  const size_t count = end - begin;
  unsigned blocks = static_cast<unsigned>((count + 255) / 256);
  if (blocks > 4096) blocks = 4096;
  if (kind == 1)
    sum_kernel<__nv_bfloat16><<<blocks, 256, 0, stream>>>(p, n, out, begin, end);
  else if (kind == 2)
    sum_kernel<__half><<<blocks, 256, 0, stream>>>(p, n, out, begin, end);
  else
    sum_kernel<float><<<blocks, 256, 0, stream>>>(p, n, out, begin, end);
  return cudaGetLastError();
}

}  // namespace shardlm
