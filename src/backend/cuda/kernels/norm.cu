// RMSNorm fused with the residual add (one read and one write of the residual
// stream per layer half), and the plain f32 RMSNorm used per head.
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels/common.cuh"

namespace shardlm::backend::cuda {

namespace {

constexpr int kThreads = 256;

// One block per row.
__global__ void rms_norm_residual_kernel(float* __restrict__ residual, const float* __restrict__ delta, int64_t dim,
                                         const bf16* __restrict__ weight, float eps, float weight_offset,
                                         bf16* __restrict__ out) {
  __shared__ float scratch[32];
  float* x = residual + blockIdx.x * dim;
  const float* dx = delta ? delta + blockIdx.x * dim : nullptr;
  float ss = 0.0f;
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
    float v = x[d];
    if (dx) {
      v += dx[d];
      x[d] = v;
    }
    ss += v * v;
  }
  const float scale = rsqrtf(block_sum(ss, scratch) / static_cast<float>(dim) + eps);
  bf16* o = out + blockIdx.x * dim;
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x)
    o[d] = __float2bfloat16(x[d] * scale * (weight_offset + __bfloat162float(weight[d])));
}

__global__ void rms_norm_f32_kernel(const float* __restrict__ x, int64_t dim, const bf16* __restrict__ weight, float eps,
                                    float weight_offset, float* out) {
  __shared__ float scratch[32];
  const float* xi = x + blockIdx.x * dim;
  float ss = 0.0f;
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) ss += xi[d] * xi[d];
  const float scale = rsqrtf(block_sum(ss, scratch) / static_cast<float>(dim) + eps);
  // Every thread has read its elements before block_sum's barrier, so in place is safe.
  float* o = out + blockIdx.x * dim;
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) o[d] = xi[d] * scale * (weight_offset + __bfloat162float(weight[d]));
}

}  // namespace

void rms_norm_residual(float* residual, const float* delta, int64_t n_rows, int64_t dim, const bf16* weight, float eps,
                       float weight_offset, bf16* out, cudaStream_t stream) {
  if (n_rows <= 0) return;
  rms_norm_residual_kernel<<<static_cast<unsigned>(n_rows), kThreads, 0, stream>>>(residual, delta, dim, weight, eps,
                                                                                   weight_offset, out);
  SHARDLM_CUDA_CHECK_LAUNCH();
}

void rms_norm_f32(const float* x, int64_t n_rows, int64_t dim, const bf16* weight, float eps, float weight_offset,
                  float* out, cudaStream_t stream) {
  if (n_rows <= 0) return;
  // Head-sized rows (64-256): a smaller block wastes fewer threads.
  const int threads = dim <= 128 ? 64 : 128;
  rms_norm_f32_kernel<<<static_cast<unsigned>(n_rows), threads, 0, stream>>>(x, dim, weight, eps, weight_offset, out);
  SHARDLM_CUDA_CHECK_LAUNCH();
}

}  // namespace shardlm::backend::cuda
