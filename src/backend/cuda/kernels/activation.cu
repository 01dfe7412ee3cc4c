// Elementwise kernels: SiLU·mul and GELU(tanh)·mul (the gated MLPs), bias add, f32 ⇄ bf16.
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels/common.cuh"

namespace shardlm::backend::cuda {

namespace {

constexpr int kThreads = 256;

// The gated MLP's activation of gate, times up: SwiGLU and GeGLU (tanh gelu).
struct Silu {
  __device__ float operator()(float g) const { return g / (1.0f + expf(-g)); }
};
struct GeluTanh {
  __device__ float operator()(float g) const {
    return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
  }
};

template <class Act>
__global__ void gated_mul_kernel(const float* __restrict__ gate, const float* __restrict__ up, int64_t n_tokens,
                                 int64_t n_inter, int64_t stride, bf16* __restrict__ out) {
  const Act act;
  const int64_t total = n_tokens * n_inter;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / n_inter, j = i % n_inter;
    out[i] = __float2bfloat16(act(gate[t * stride + j]) * up[t * stride + j]);
  }
}

template <class Act>
void gated_mul(const float* gate, const float* up, int64_t n_tokens, int64_t n_inter, int64_t stride, bf16* out,
               cudaStream_t stream) {
  if (n_tokens * n_inter <= 0) return;
  gated_mul_kernel<Act><<<grid_for(n_tokens * n_inter, kThreads), kThreads, 0, stream>>>(gate, up, n_tokens, n_inter,
                                                                                         stride, out);
  SHARDLM_CUDA_CHECK_LAUNCH();
}

__global__ void add_bias_kernel(float* __restrict__ y, const bf16* __restrict__ b, int64_t total, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] += __bfloat162float(b[i % n]);
}

__global__ void f32_to_bf16_kernel(const float* __restrict__ in, int64_t count, bf16* __restrict__ out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16(in[i]);
}

__global__ void bf16_to_f32_kernel(const bf16* __restrict__ in, int64_t count, float* __restrict__ out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __bfloat162float(in[i]);
}

}  // namespace

void silu_mul(const float* gate, const float* up, int64_t n_tokens, int64_t n_inter, int64_t stride, bf16* out,
              cudaStream_t stream) {
  gated_mul<Silu>(gate, up, n_tokens, n_inter, stride, out, stream);
}

void gelu_tanh_mul(const float* gate, const float* up, int64_t n_tokens, int64_t n_inter, int64_t stride, bf16* out,
                   cudaStream_t stream) {
  gated_mul<GeluTanh>(gate, up, n_tokens, n_inter, stride, out, stream);
}

void add_bias(float* y, const bf16* b, int64_t n_rows, int64_t n, cudaStream_t stream) {
  if (n_rows * n <= 0) return;
  add_bias_kernel<<<grid_for(n_rows * n, kThreads), kThreads, 0, stream>>>(y, b, n_rows * n, n);
  SHARDLM_CUDA_CHECK_LAUNCH();
}

void f32_to_bf16(const float* in, int64_t count, bf16* out, cudaStream_t stream) {
  if (count <= 0) return;
  f32_to_bf16_kernel<<<grid_for(count, kThreads), kThreads, 0, stream>>>(in, count, out);
  SHARDLM_CUDA_CHECK_LAUNCH();
}

void bf16_to_f32(const bf16* in, int64_t count, float* out, cudaStream_t stream) {
  if (count <= 0) return;
  bf16_to_f32_kernel<<<grid_for(count, kThreads), kThreads, 0, stream>>>(in, count, out);
  SHARDLM_CUDA_CHECK_LAUNCH();
}

}  // namespace shardlm::backend::cuda
