// Rotate-half rotary embedding (GPT-NeoX / HF Llama, Qwen), in place. The
// rope type lives in inv_freq, computed on the host by backend::rope_inv_freq.
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels/common.cuh"

namespace shardlm::backend::cuda {

namespace {

// One block per (token, head); thread i rotates the pair (i, i + half), half = rotary_dim / 2.
__global__ void rope_kernel(float* __restrict__ x, int64_t n_heads, int64_t head_dim, int64_t row_stride,
                            const int32_t* __restrict__ positions, const float* __restrict__ inv_freq, int64_t half,
                            float mscale) {
  const int64_t t = blockIdx.x / n_heads, h = blockIdx.x % n_heads;
  float* v = x + t * row_stride + h * head_dim;
  const float pos = static_cast<float>(positions[t]);
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    // sincosf of pos × inv_freq in f32, as the CPU op (ops.cpp) computes the angle.
    float s, c;
    sincosf(pos * inv_freq[i], &s, &c);
    s *= mscale;
    c *= mscale;
    const float a = v[i], b = v[i + half];
    v[i] = a * c - b * s;
    v[i + half] = b * c + a * s;
  }
}

}  // namespace

void rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t row_stride, const int32_t* positions,
          const float* inv_freq, int64_t rotary_dim, float mscale, cudaStream_t stream) {
  if (n_tokens <= 0 || n_heads <= 0) return;
  const int64_t half = (rotary_dim > 0 ? rotary_dim : head_dim) / 2;
  const int threads = half <= 32 ? 32 : half <= 64 ? 64 : 128;
  rope_kernel<<<static_cast<unsigned>(n_tokens * n_heads), threads, 0, stream>>>(x, n_heads, head_dim, row_stride,
                                                                                 positions, inv_freq, half, mscale);
  SHARDLM_CUDA_CHECK_LAUNCH();
}

}  // namespace shardlm::backend::cuda
