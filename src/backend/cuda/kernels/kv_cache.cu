// The KV-cache write: each new token's K and V rows into their paged slots.
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels/common.cuh"

namespace shardlm::backend::cuda {

namespace {

// One block per token; threads stride over n_kv_heads × head_dim. A slot's
// K (and V) row [n_kv_heads, head_dim] is contiguous in the cache.
__global__ void kv_cache_write_kernel(bf16* __restrict__ kc, bf16* __restrict__ vc, int64_t row_elems,
                                      const float* __restrict__ k, const float* __restrict__ v, int64_t row_stride,
                                      const int32_t* __restrict__ slots) {
  const int64_t t = blockIdx.x;
  const int32_t slot = slots[t];
  if (slot < 0) return;  // padding row of a graph bucket
  bf16* kd = kc + static_cast<int64_t>(slot) * row_elems;
  bf16* vd = vc + static_cast<int64_t>(slot) * row_elems;
  const float* ks = k + t * row_stride;
  const float* vs = v + t * row_stride;
  for (int64_t i = threadIdx.x; i < row_elems; i += blockDim.x) {
    kd[i] = __float2bfloat16(ks[i]);
    vd[i] = __float2bfloat16(vs[i]);
  }
}

}  // namespace

void kv_cache_write(const DeviceKvLayer& cache, const float* k, const float* v, int64_t row_stride,
                    const int32_t* slots, int64_t n_tokens, cudaStream_t stream) {
  if (n_tokens <= 0) return;
  kv_cache_write_kernel<<<static_cast<unsigned>(n_tokens), 128, 0, stream>>>(
      cache.k, cache.v, cache.n_kv_heads * cache.head_dim, k, v, row_stride, slots);
  SHARDLM_CUDA_CHECK_LAUNCH();
}

}  // namespace shardlm::backend::cuda
