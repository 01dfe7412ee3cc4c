// Device sampling: one thread block per row.
#include <curand_kernel.h>

#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/sampling.h"

namespace shardlm::backend::cuda {

namespace {

constexpr int kThreads = 1024;
constexpr float kGreedyT = 1e-5f;
constexpr int kBisectSteps = 30;
constexpr float kLogFloor = -88.0f;  // exp(-88) is about the smallest normal float

// (value, id) ordered by value descending then id ascending; NaN never wins.
struct Best {
  float v;
  int id;
};
__device__ __forceinline__ bool better(const Best& a, const Best& b) {
  if (a.id < 0) return false;
  if (b.id < 0) return true;
  return a.v > b.v || (a.v == b.v && a.id < b.id);
}

__device__ Best block_best(Best b, Best* scratch) {
  for (int o = 16; o > 0; o >>= 1) {
    Best other{__shfl_xor_sync(kFullMask, b.v, o), __shfl_xor_sync(kFullMask, b.id, o)};
    if (better(other, b)) b = other;
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = b;
  __syncthreads();
  b = (threadIdx.x & 31) < (blockDim.x >> 5) ? scratch[threadIdx.x & 31] : Best{0.0f, -1};
  for (int o = 16; o > 0; o >>= 1) {
    Best other{__shfl_xor_sync(kFullMask, b.v, o), __shfl_xor_sync(kFullMask, b.id, o)};
    if (better(other, b)) b = other;
  }
  return b;
}

// Best element of x strictly after `after` in the ordering (after.id < 0: the best overall).
__device__ Best best_after(const float* x, int64_t vocab, Best after, Best* scratch) {
  Best b{0.0f, -1};
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float v = x[i];
    if (isnan(v)) continue;
    const Best c{v, static_cast<int>(i)};
    if (after.id >= 0 && !better(after, c)) continue;
    if (better(c, b)) b = c;
  }
  return block_best(b, scratch);
}

__global__ void __launch_bounds__(kThreads)
    sample_kernel(const float* __restrict__ logits, int64_t vocab, const DeviceSamplingRow* __restrict__ rows,
                  DevicePenalties pen, float* __restrict__ work, int32_t* out_ids, float* out_logprobs,
                  int32_t* top_ids, float* top_logprobs) {
  __shared__ float fscratch[32];
  __shared__ Best bscratch[32];
  __shared__ float prefix[kThreads];
  __shared__ int chosen_s;
  const int64_t r = blockIdx.x;
  const DeviceSamplingRow p = rows[r];
  const float* raw = logits + r * vocab;
  float* z = work + r * vocab;

  // Raw log-normaliser and top logprobs.
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x)
    if (!isnan(raw[i])) m = fmaxf(m, raw[i]);
  m = block_max(m, fscratch);
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x)
    if (!isnan(raw[i]) && m != -INFINITY) s += __expf(raw[i] - m);
  const float log_z = m + __logf(block_sum(s, fscratch));
  Best prev{0.0f, -1};
  for (int k = 0; k < kMaxDeviceLogprobs; ++k) {
    if (k < p.n_logprobs) prev = best_after(raw, vocab, prev, bscratch);
    if (threadIdx.x == 0) {
      const bool has = k < p.n_logprobs && prev.id >= 0;
      top_ids[r * kMaxDeviceLogprobs + k] = has ? prev.id : -1;
      top_logprobs[r * kMaxDeviceLogprobs + k] = has ? prev.v - log_z : 0.0f;
    }
  }

  // Penalised logits into work.
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) z[i] = raw[i];
  __syncthreads();
  if (pen.offsets) {
    for (int e = pen.offsets[r] + threadIdx.x; e < pen.offsets[r + 1]; e += blockDim.x) {
      const int t = pen.tokens[e];
      if (t < 0 || t >= vocab) continue;
      float v = z[t];
      const int n = pen.out_counts[e];
      if (p.repetition_penalty != 1.0f && (pen.in_prompt[e] || n > 0))
        v = v > 0.0f ? v / p.repetition_penalty : v * p.repetition_penalty;
      if (n > 0) v -= p.frequency_penalty * n + p.presence_penalty;
      z[t] = v;  // tokens are distinct within a row: no two threads write one slot
    }
  }
  __syncthreads();

  int chosen = -1;
  if (p.temperature < kGreedyT) {
    chosen = best_after(z, vocab, Best{0.0f, -1}, bscratch).id;
  } else {
    const float inv_t = 1.0f / p.temperature;
    float mz = -INFINITY;
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x)
      if (!isnan(z[i])) mz = fmaxf(mz, z[i] * inv_t);
    mz = block_max(mz, fscratch);
    // e_i = exp(z_i / T - max): the most likely token has e = 1; min-p drops e < min_p.
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
      const float zi = z[i] * inv_t;
      float e = isnan(z[i]) || isinf(zi) || mz == -INFINITY ? 0.0f : __expf(zi - mz);
      if (e < p.min_p) e = 0.0f;
      z[i] = e;
    }
    __syncthreads();
    auto count_at_least = [&](float tau) {
      float c = 0.0f;
      for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) c += z[i] >= tau && z[i] > 0.0f ? 1.0f : 0.0f;
      return block_sum(c, fscratch);
    };
    auto mass_above = [&](float tau) {  // strictly above
      float c = 0.0f;
      for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) c += z[i] > tau ? z[i] : 0.0f;
      return block_sum(c, fscratch);
    };
    float cut = 0.0f;  // keep e >= cut (and e > 0)
    if (p.top_k > 0 && count_at_least(0.0f) > static_cast<float>(p.top_k)) {
      // Bisection on log(e) in [kLogFloor, 0], so tail probabilities far below
      // 2^-30 are still told apart: count(e >= exp(lo)) >= k stays true.
      float lo = kLogFloor, hi = 0.0f;
      for (int it = 0; it < kBisectSteps; ++it) {
        const float mid = 0.5f * (lo + hi);
        if (count_at_least(__expf(mid)) >= static_cast<float>(p.top_k)) lo = mid; else hi = mid;
      }
      cut = __expf(lo);
    }
    if (p.top_p < 1.0f) {
      for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x)
        if (z[i] < cut) z[i] = 0.0f;
      __syncthreads();
      const float target = p.top_p * mass_above(0.0f);
      // Keep token v while the mass of the more likely ones is below top_p × kept mass.
      float lo = kLogFloor, hi = 0.0f;  // in log(e): mass_above(exp(hi)) = 0 < target
      if (mass_above(__expf(lo)) >= target) {
        for (int it = 0; it < kBisectSteps; ++it) {
          const float mid = 0.5f * (lo + hi);
          if (mass_above(__expf(mid)) < target) hi = mid; else lo = mid;
        }
        cut = fmaxf(cut, __expf(hi));
      }
    }
    // Kept mass per thread over a contiguous chunk, then a scan over threads.
    const int64_t chunk = (vocab + blockDim.x - 1) / blockDim.x;
    const int64_t b0 = threadIdx.x * chunk, b1 = min(vocab, b0 + chunk);
    float mine = 0.0f;
    for (int64_t i = b0; i < b1; ++i) mine += z[i] >= cut ? z[i] : 0.0f;
    prefix[threadIdx.x] = mine;
    __syncthreads();
    for (int o = 1; o < kThreads; o <<= 1) {  // inclusive Hillis-Steele scan
      const float add = threadIdx.x >= o ? prefix[threadIdx.x - o] : 0.0f;
      __syncthreads();
      prefix[threadIdx.x] += add;
      __syncthreads();
    }
    const float total = prefix[kThreads - 1];
    if (threadIdx.x == 0) chosen_s = -1;
    __syncthreads();
    curandStatePhilox4_32_10_t rng;
    curand_init(p.seed, 0, p.step, &rng);  // per request, not per row: the same tokens whatever the batch
    const float target = curand_uniform(&rng) * total;  // (0, total]
    const float before = prefix[threadIdx.x] - mine;
    if (total > 0.0f && target > before && target <= prefix[threadIdx.x]) {
      float acc = before;
      int pick = -1;
      for (int64_t i = b0; i < b1; ++i) {
        const float e = z[i] >= cut ? z[i] : 0.0f;
        if (e <= 0.0f) continue;
        pick = static_cast<int>(i);
        acc += e;
        if (acc >= target) break;
      }
      atomicMax(&chosen_s, pick);
    }
    __syncthreads();
    chosen = chosen_s;
    if (chosen < 0) chosen = best_after(raw, vocab, Best{0.0f, -1}, bscratch).id;  // rounding or all masked
  }
  if (threadIdx.x == 0) {
    if (chosen < 0) chosen = 0;
    out_ids[r] = chosen;
    out_logprobs[r] = raw[chosen] - log_z;
  }
}

}  // namespace

void sample(const float* logits, int64_t n_rows, int64_t vocab, const DeviceSamplingRow* rows,
            const DevicePenalties& penalties, float* work, int32_t* out_ids, float* out_logprobs, int32_t* top_ids,
            float* top_logprobs, cudaStream_t stream) {
  if (n_rows <= 0) return;
  sample_kernel<<<static_cast<unsigned>(n_rows), kThreads, 0, stream>>>(logits, vocab, rows, penalties, work, out_ids,
                                                                         out_logprobs, top_ids, top_logprobs);
  SHARDLM_CUDA_CHECK_LAUNCH();
}

}  // namespace shardlm::backend::cuda
