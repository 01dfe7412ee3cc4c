// The embedding gather of a vocab-parallel slice.
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels/common.cuh"

namespace shardlm::backend::cuda {

namespace {

// One block per token; threads stride over dim.
__global__ void embedding_gather_kernel(const bf16* __restrict__ table, int64_t n_rows, int64_t dim,
                                        int64_t vocab_begin, const int32_t* __restrict__ ids, float* __restrict__ out) {
  const int64_t t = blockIdx.x;
  const int64_t row = static_cast<int64_t>(ids[t]) - vocab_begin;
  float* o = out + t * dim;
  if (row < 0 || row >= n_rows) {
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) o[d] = 0.0f;
    return;
  }
  const bf16* src = table + row * dim;
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) o[d] = __bfloat162float(src[d]);
}

}  // namespace

void embedding_gather(const bf16* table, int64_t n_rows, int64_t dim, int64_t vocab_begin, const int32_t* ids,
                      int64_t n_tokens, float* out, cudaStream_t stream) {
  if (n_tokens <= 0) return;
  embedding_gather_kernel<<<static_cast<unsigned>(n_tokens), 256, 0, stream>>>(table, n_rows, dim, vocab_begin, ids,
                                                                               out);
  SHARDLM_CUDA_CHECK_LAUNCH();
}

}  // namespace shardlm::backend::cuda
