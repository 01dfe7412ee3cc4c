// The one kernel of DeviceLocalComm (device_local_sum.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace shardlm {

// out[i] = Σ_r bufs[r][i] for i in [begin, end), f32 or bf16 (f32 sum); n <= 16 ranks.
cudaError_t device_local_sum(const void* const* bufs, int n, bool bf16, void* out, size_t begin, size_t end,
                             cudaStream_t stream);

}  // namespace shardlm
