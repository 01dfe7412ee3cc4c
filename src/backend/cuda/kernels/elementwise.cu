// Plain f32 kernels the Backend interface needs around ours: the residual
// add, scaling, the logits' soft-cap and the row gather of the logit rows.
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels/common.cuh"

namespace shardlm::backend::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void add_f32_kernel(float* __restrict__ y, const float* __restrict__ x, int64_t count) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] += x[i];
}

__global__ void scale_f32_kernel(float* __restrict__ x, int64_t count, float s) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] *= s;
}

__global__ void softcap_f32_kernel(float* __restrict__ x, int64_t count, float cap, float inv_cap) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = cap * tanhf(x[i] * inv_cap);
}

// One block per gathered row; threads stride over dim.
__global__ void gather_rows_kernel(const float* __restrict__ x, int64_t dim, const int32_t* __restrict__ rows,
                                   float* __restrict__ out) {
  const int64_t i = blockIdx.x;
  const float* src = x + static_cast<int64_t>(rows[i]) * dim;
  float* dst = out + i * dim;
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) dst[d] = src[d];
}

}  // namespace

void add_f32(float* y, const float* x, int64_t count, cudaStream_t stream) {
  if (count <= 0) return;
  add_f32_kernel<<<grid_for(count, kThreads), kThreads, 0, stream>>>(y, x, count);
  SHARDLM_CUDA_CHECK_LAUNCH();
}

void scale_f32(float* x, int64_t count, float s, cudaStream_t stream) {
  if (count <= 0) return;
  scale_f32_kernel<<<grid_for(count, kThreads), kThreads, 0, stream>>>(x, count, s);
  SHARDLM_CUDA_CHECK_LAUNCH();
}

void softcap_f32(float* x, int64_t count, float cap, cudaStream_t stream) {
  if (count <= 0) return;
  softcap_f32_kernel<<<grid_for(count, kThreads), kThreads, 0, stream>>>(x, count, cap, 1.0f / cap);
  SHARDLM_CUDA_CHECK_LAUNCH();
}

void gather_rows_f32(const float* x, int64_t dim, const int32_t* rows, int64_t n_rows, float* out,
                     cudaStream_t stream) {
  if (n_rows <= 0 || dim <= 0) return;
  gather_rows_kernel<<<static_cast<unsigned>(n_rows), kThreads, 0, stream>>>(x, dim, rows, out);
  SHARDLM_CUDA_CHECK_LAUNCH();
}

}  // namespace shardlm::backend::cuda
