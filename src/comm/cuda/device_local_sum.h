// The one kernel of DeviceLocalComm (device_local_sum.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace shardlm {

// out[i] = Σ_r bufs[r][i] for i in [begin, end), summed in f32 in rank order;
// kind 0 = f32, 1 = bf16, 2 = f16; n <= 16 ranks.
cudaError_t device_local_sum(const void* const* bufs, int n, int kind, void* out, size_t begin, size_t end,
                             cudaStream_t stream);

}  // namespace shardlm
