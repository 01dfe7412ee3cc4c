// out[i] = sum over ranks of bufs[r][i] for i in [begin, end): the reduce step
// of DeviceLocalComm::all_reduce (out is the calling rank's own buffer).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "comm/cuda/device_local_sum.h"

namespace shardlm {

namespace {

constexpr int kMaxRanks = 16;
struct Ptrs {
  const void* p[kMaxRanks];
};

template <typename T>
__global__ void sum_kernel(Ptrs bufs, int n, void* out, size_t begin, size_t end) {
  for (size_t i = begin + blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < end;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    float s = 0.0f;
    for (int r = 0; r < n; ++r) {
      if constexpr (sizeof(T) == 4)
        s += static_cast<const float*>(bufs.p[r])[i];
      else
        s += __bfloat162float(static_cast<const __nv_bfloat16*>(bufs.p[r])[i]);
    }
    if constexpr (sizeof(T) == 4)
      static_cast<float*>(out)[i] = s;
    else
      static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16(s);
  }
}

}  // namespace

cudaError_t device_local_sum(const void* const* bufs, int n, bool bf16, void* out, size_t begin, size_t end,
                             cudaStream_t stream) {
  if (n > kMaxRanks) return cudaErrorInvalidValue;
  if (end <= begin) return cudaSuccess;
  Ptrs p{};
  for (int r = 0; r < n; ++r) p.p[r] = bufs[r];
  const size_t count = end - begin;
  unsigned blocks = static_cast<unsigned>((count + 255) / 256);
  if (blocks > 4096) blocks = 4096;
  if (bf16)
    sum_kernel<__nv_bfloat16><<<blocks, 256, 0, stream>>>(p, n, out, begin, end);
  else
    sum_kernel<float><<<blocks, 256, 0, stream>>>(p, n, out, begin, end);
  return cudaGetLastError();
}

}  // namespace shardlm
