// Paged attention for decode, split-K (flash-decoding): the context is cut
// into partitions of kDecodePartition tokens so a batch of few sequences
// still fills the GPU; one thread block per (sequence, local KV head,
// partition) reads K and V once for every local Q head of that KV head's GQA
// group (uneven TP included: the group may be cut at the rank's edge).
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels/common.cuh"
#include "core/error.h"

namespace shardlm::backend::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxGroup = kMaxAttentionGroup;  // local Q heads per KV head a block serves

struct DecodeArgs {
  const float* q;
  int64_t q_stride;
  const bf16* kc;
  const bf16* vc;
  int64_t block_size;
  int64_t n_kv_heads;
  AttentionHeads heads;
  DeviceSeqs seqs;
  int n_partitions;
  int window;   // > 0: the last `window` keys of each context (a sliding-window layer)
  float scale;  // of q·k
  float* ws_out;  // [n_seqs, n_q_heads, n_partitions, HD]
  float* ws_ml;   // [n_seqs, n_q_heads, n_partitions, 2]: running max, sum of exp
  bf16* out;      // [n_tokens, n_q_heads, HD]
};

template <int HD>
__global__ void __launch_bounds__(kThreads) decode_kernel(DecodeArgs a) {
  static_assert(HD % 32 == 0 && HD <= 256, "head_dim must be a multiple of 32, at most 256");
  constexpr int kPerLane = HD / 32;
  extern __shared__ float smem[];
  const int kv_local = blockIdx.x, seq = blockIdx.y, part = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const AttentionHeads& h = a.heads;

  // Local Q heads [q_lo, q_hi) read this KV head.
  const int64_t kv_global = h.kv_head_begin + kv_local;
  const int64_t q_lo = max(kv_global * h.group_size, h.q_head_begin) - h.q_head_begin;
  const int64_t q_hi = min((kv_global + 1) * h.group_size, h.q_head_begin + h.n_q_heads) - h.q_head_begin;
  const int n_g = static_cast<int>(q_hi - q_lo);
  if (n_g <= 0) return;

  const int32_t* rec = a.seqs.records + static_cast<int64_t>(seq) * kSeqRecord;
  const int ctx = rec[1] > 0 ? rec[2] + rec[1] : 0;  // padding records have no context
  const int64_t row = rec[0];                        // this sequence's token in q and out
  // Keys [first, ctx): the whole context, or its last `window` positions;
  // the partitions cut that span, not the whole context.
  const int first = a.window > 0 && ctx > a.window ? ctx - a.window : 0;
  const int t_begin = first + part * kDecodePartition;
  const int t_end = min(ctx, t_begin + kDecodePartition);
  const int64_t n_q = h.n_q_heads;
  auto ws_index = [&](int g) { return ((static_cast<int64_t>(seq) * n_q + q_lo + g) * a.n_partitions + part); };

  if (t_begin >= t_end) {  // past this sequence's context (or a padding row)
    if (a.n_partitions > 1) {
      if (threadIdx.x < n_g) {
        a.ws_ml[ws_index(threadIdx.x) * 2] = -INFINITY;
        a.ws_ml[ws_index(threadIdx.x) * 2 + 1] = 0.0f;
      }
    } else {
      for (int i = threadIdx.x; i < n_g * HD; i += kThreads)
        if (rec[1] > 0) a.out[(row * n_q + q_lo + i / HD) * HD + i % HD] = __float2bfloat16(0.0f);
    }
    return;
  }

  float* q_s = smem;                        // [n_g, HD]
  float* scores = smem + n_g * HD;          // [n_g, kDecodePartition]
  float* stats = scores + n_g * kDecodePartition;  // [n_g, 2]
  for (int i = threadIdx.x; i < n_g * HD; i += kThreads) {
    const int g = i / HD, d = i % HD;
    q_s[i] = a.q[row * a.q_stride + (q_lo + g) * HD + d];
  }
  __syncthreads();

  const int32_t* table = a.seqs.block_tables + rec[3];
  const int64_t row_elems = a.n_kv_heads * HD;
  auto slot_of = [&](int t) { return static_cast<int64_t>(table[t / a.block_size]) * a.block_size + t % a.block_size; };

  // 1. Scores: a warp per token; each lane holds kPerLane consecutive elements of K.
  for (int t = t_begin + warp; t < t_end; t += kWarps) {
    const bf16* k = a.kc + slot_of(t) * row_elems + static_cast<int64_t>(kv_local) * HD + lane * kPerLane;
    float kf[kPerLane];
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) kf[e] = __bfloat162float(k[e]);
    for (int g = 0; g < n_g; ++g) {
      const float* qg = q_s + g * HD + lane * kPerLane;
      float s = 0.0f;
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) s += qg[e] * kf[e];
      s = warp_sum(s);
      if (lane == 0) scores[g * kDecodePartition + (t - t_begin)] = s * a.scale;
    }
  }
  __syncthreads();

  // 2. Softmax statistics per Q head: a warp per head.
  const int n_t = t_end - t_begin;
  for (int g = warp; g < n_g; g += kWarps) {
    float* sg = scores + g * kDecodePartition;
    float m = -INFINITY;
    for (int i = lane; i < n_t; i += 32) m = fmaxf(m, sg[i]);
    m = warp_max(m);
    float l = 0.0f;
    for (int i = lane; i < n_t; i += 32) {
      const float p = __expf(sg[i] - m);
      sg[i] = p;
      l += p;
    }
    l = warp_sum(l);
    if (lane == 0) {
      stats[g * 2] = m;
      stats[g * 2 + 1] = l;
    }
  }
  __syncthreads();

  // 3. Weighted sum of V: a thread per output dimension (two when HD = 256).
  for (int d = threadIdx.x; d < HD; d += kThreads) {
    float acc[kMaxGroup];
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) acc[g] = 0.0f;
    for (int t = t_begin; t < t_end; ++t) {
      const float v = __bfloat162float(a.vc[slot_of(t) * row_elems + static_cast<int64_t>(kv_local) * HD + d]);
      const float* p = scores + (t - t_begin);
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g)
        if (g < n_g) acc[g] += p[g * kDecodePartition] * v;
    }
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g >= n_g) break;
      const float o = acc[g] / stats[g * 2 + 1];
      if (a.n_partitions == 1)
        a.out[(row * n_q + q_lo + g) * HD + d] = __float2bfloat16(o);
      else
        a.ws_out[ws_index(g) * HD + d] = o;
    }
  }
  if (a.n_partitions > 1 && threadIdx.x < n_g) {
    a.ws_ml[ws_index(threadIdx.x) * 2] = stats[threadIdx.x * 2];
    a.ws_ml[ws_index(threadIdx.x) * 2 + 1] = stats[threadIdx.x * 2 + 1];
  }
}

// Merges the partitions of one (sequence, Q head): a thread per dimension.
template <int HD>
__global__ void decode_reduce_kernel(const float* __restrict__ ws_out, const float* __restrict__ ws_ml,
                                     int n_partitions, int64_t n_q, DeviceSeqs seqs, bf16* __restrict__ out) {
  const int32_t* rec = seqs.records + static_cast<int64_t>(blockIdx.y) * kSeqRecord;
  if (rec[1] == 0) return;  // padding
  const int64_t row = static_cast<int64_t>(blockIdx.y) * n_q + blockIdx.x;        // (seq, q head) in the workspace
  const int64_t out_row = static_cast<int64_t>(rec[0]) * n_q + blockIdx.x;        // (token, q head) in out
  const float* ml = ws_ml + row * n_partitions * 2;
  float m = -INFINITY;
  for (int p = 0; p < n_partitions; ++p) m = fmaxf(m, ml[p * 2]);
  for (int d = threadIdx.x; d < HD; d += blockDim.x) {
    float num = 0.0f, den = 0.0f;
    if (m != -INFINITY) {
      for (int p = 0; p < n_partitions; ++p) {
        const float w = ml[p * 2 + 1] * __expf(ml[p * 2] - m);
        if (w == 0.0f) continue;
        num += w * ws_out[(row * n_partitions + p) * HD + d];
        den += w;
      }
    }
    out[out_row * HD + d] = __float2bfloat16(den > 0.0f ? num / den : 0.0f);
  }
}

}  // namespace

int64_t decode_attention_partitions(int64_t max_context, int64_t window) {
  const int64_t span = window > 0 ? std::min(max_context, window) : max_context;
  return (span + kDecodePartition - 1) / kDecodePartition;
}

size_t decode_attention_workspace_bytes(int64_t n_seqs, const AttentionHeads& heads, int64_t head_dim,
                                        int64_t max_context) {
  const int64_t n_parts = decode_attention_partitions(max_context, heads.window);
  if (n_parts <= 1) return 0;
  return static_cast<size_t>(n_seqs * heads.n_q_heads * n_parts * (head_dim + 2)) * sizeof(float);
}

void paged_attention_decode(const float* q, int64_t q_stride, const DeviceKvLayer& cache, const AttentionHeads& heads,
                            const DeviceSeqs& seqs, int64_t max_context, void* workspace, bf16* out,
                            cudaStream_t stream) {
  const int64_t n_seqs = seqs.n_seqs;
  if (n_seqs <= 0 || heads.n_q_heads <= 0) return;
  if (max_context < 1) fail(ErrorCode::kInvalidArgument, "CUDA decode attention: max_context ", max_context, " < 1");
  DecodeArgs a{};
  a.q = q;
  a.q_stride = q_stride;
  a.kc = cache.k;
  a.vc = cache.v;
  a.block_size = cache.block_size;
  a.n_kv_heads = cache.n_kv_heads;
  a.heads = heads;
  a.seqs = seqs;
  a.n_partitions = static_cast<int>(decode_attention_partitions(max_context, heads.window));
  a.window = static_cast<int>(std::min<int64_t>(heads.window, 1 << 30));  // positions are int32
  a.scale = heads.scale_for(cache.head_dim);
  a.out = out;
  if (a.n_partitions > 1) {
    if (workspace == nullptr)
      fail(ErrorCode::kInternal, "CUDA decode attention: max_context ", max_context, " needs a workspace of ",
           decode_attention_workspace_bytes(n_seqs, heads, cache.head_dim, max_context), " bytes");
    a.ws_out = static_cast<float*>(workspace);
    a.ws_ml = a.ws_out + n_seqs * heads.n_q_heads * a.n_partitions * cache.head_dim;
  }
  auto launch = [&](auto kernel_tag) {
    constexpr int kHd = decltype(kernel_tag)::value;
    const int max_g = static_cast<int>(std::min<int64_t>(heads.group_size, heads.n_q_heads));
    if (max_g > kMaxGroup)
      fail(ErrorCode::kUnsupported, "CUDA decode attention: ", max_g, " Q heads per KV head on one rank; at most ",
           kMaxGroup, " are supported");
    const size_t smem = static_cast<size_t>(max_g) * (kHd + kDecodePartition + 2) * sizeof(float);
    if (smem > 48 * 1024)
      SHARDLM_CUDA_CHECK(cudaFuncSetAttribute(decode_kernel<kHd>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(smem)));
    const dim3 grid(static_cast<unsigned>(cache.n_kv_heads), static_cast<unsigned>(n_seqs),
                    static_cast<unsigned>(a.n_partitions));
    decode_kernel<kHd><<<grid, kThreads, smem, stream>>>(a);
    SHARDLM_CUDA_CHECK_LAUNCH();
    if (a.n_partitions > 1) {
      decode_reduce_kernel<kHd><<<dim3(static_cast<unsigned>(heads.n_q_heads), static_cast<unsigned>(n_seqs)),
                                  kHd < 128 ? kHd : 128, 0, stream>>>(a.ws_out, a.ws_ml, a.n_partitions,
                                                                      heads.n_q_heads, seqs, out);
      SHARDLM_CUDA_CHECK_LAUNCH();
    }
  };
  switch (cache.head_dim) {
    case 64: launch(std::integral_constant<int, 64>{}); break;
    case 96: launch(std::integral_constant<int, 96>{}); break;  // Phi-3-mini
    case 128: launch(std::integral_constant<int, 128>{}); break;
    case 256: launch(std::integral_constant<int, 256>{}); break;  // Gemma 2/3
    default:
      fail(ErrorCode::kUnsupported, "CUDA decode attention: head_dim ", cache.head_dim,
           " is not supported (", kAttentionHeadDims, ")");
  }
}

}  // namespace shardlm::backend::cuda
