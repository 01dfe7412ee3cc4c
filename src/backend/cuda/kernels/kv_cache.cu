// The KV-cache write: each new token's K and V rows into their paged slots.
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels/common.cuh"

namespace shardlm::backend::cuda {

namespace {

// One block per token of the step; it finds its sequence by binary search
// over the records' token_begin (ascending), then threads stride over the
// slot's K and V rows [n_kv_heads, head_dim], which are contiguous.
__global__ void kv_cache_write_kernel(bf16* __restrict__ kc, bf16* __restrict__ vc, int64_t block_size,
                                      int64_t row_elems, const float* __restrict__ k, const float* __restrict__ v,
                                      int64_t row_stride, DeviceSeqs seqs) {
  const int32_t t = static_cast<int32_t>(blockIdx.x);
  int64_t lo = 0, hi = seqs.n_seqs - 1;  // last record with token_begin <= t
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (seqs.records[mid * kSeqRecord] <= t) lo = mid; else hi = mid - 1;
  }
  const int32_t* rec = seqs.records + lo * kSeqRecord;
  if (t < rec[0] || t >= rec[0] + rec[1]) return;  // not a token of any sequence (cannot happen when packed)
  const int64_t pos = rec[2] + (t - rec[0]);
  const int64_t slot = static_cast<int64_t>(seqs.block_tables[rec[3] + pos / block_size]) * block_size + pos % block_size;
  bf16* kd = kc + slot * row_elems;
  bf16* vd = vc + slot * row_elems;
  const float* ks = k + static_cast<int64_t>(t) * row_stride;
  const float* vs = v + static_cast<int64_t>(t) * row_stride;
  for (int64_t i = threadIdx.x; i < row_elems; i += blockDim.x) {
    kd[i] = __float2bfloat16(ks[i]);
    vd[i] = __float2bfloat16(vs[i]);
  }
}

}  // namespace

void kv_cache_write(const DeviceKvLayer& cache, const float* k, const float* v, int64_t row_stride,
                    const DeviceSeqs& seqs, int64_t n_tokens, cudaStream_t stream) {
  if (n_tokens <= 0 || seqs.n_seqs <= 0) return;
  kv_cache_write_kernel<<<static_cast<unsigned>(n_tokens), 128, 0, stream>>>(
      cache.k, cache.v, cache.block_size, cache.n_kv_heads * cache.head_dim, k, v, row_stride, seqs);
  SHARDLM_CUDA_CHECK_LAUNCH();
}

}  // namespace shardlm::backend::cuda
