// Paged attention for prefill and chunked prefill: tiled and causal. A thread
// block takes kPrefillQueryTile queries of one sequence and one Q head (a
// warp per query); K/V tiles of kKeyTile cached tokens stream through shared
// memory and each warp keeps an online softmax (running max, sum, output).
// Chunked prefill is the same kernel: a chunk's queries sit at n_past.. and
// see every cached position up to their own (a sliding-window layer: the last
// `window` of them, so a tile reads only the keys its queries can see).
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels/common.cuh"
#include "core/error.h"

namespace shardlm::backend::cuda {

namespace {

constexpr int kKeyTile = 32;  // one key per lane when scoring
constexpr int kThreads = kPrefillQueryTile * 32;

struct PrefillArgs {
  const float* q;
  int64_t q_stride;
  const bf16* kc;
  const bf16* vc;
  int64_t block_size;
  int64_t n_kv_heads;
  AttentionHeads heads;
  DeviceSeqs seqs;
  int window;   // > 0: query at position p sees keys (p - window, p]
  float scale;  // of q·k
  bf16* out;
};

template <int HD>
__global__ void __launch_bounds__(kThreads) prefill_kernel(PrefillArgs a) {
  constexpr int kPerLane = HD / 32;
  constexpr int kRow = HD + 2;  // bf16 row stride in shared memory: +1 word spreads rows over banks
  __shared__ bf16 k_s[kKeyTile * kRow];
  __shared__ bf16 v_s[kKeyTile * kRow];
  __shared__ float q_s[kPrefillQueryTile * HD];

  const int tile = blockIdx.x, h = blockIdx.y, seq = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int32_t* rec = a.seqs.records + static_cast<int64_t>(seq) * kSeqRecord;
  const int n_tok = rec[1];
  const int q_first = tile * kPrefillQueryTile;
  if (q_first >= n_tok) return;  // whole block past this sequence's chunk
  const int past = rec[2];
  const int64_t tok0 = rec[0];
  const int64_t kv_local = (a.heads.q_head_begin + h) / a.heads.group_size - a.heads.kv_head_begin;
  const int64_t n_q = a.heads.n_q_heads;

  const int qi = q_first + warp;  // this warp's query within the chunk
  const bool active = qi < n_tok;
  const int q_pos = past + qi;
  for (int d = lane; d < HD; d += 32)
    q_s[warp * HD + d] = active ? a.q[(tok0 + qi) * a.q_stride + h * HD + d] * a.scale : 0.0f;

  const int32_t* table = a.seqs.block_tables + rec[3];
  const int64_t row_elems = a.n_kv_heads * HD;
  // Keys this block needs: positions [k_first, past + last query of the tile]
  // (k_first: 0, or the first key the tile's first query sees in its window).
  const int last_q = min(n_tok, q_first + kPrefillQueryTile) - 1;
  const int n_keys = past + last_q + 1;
  const int k_first = a.window > 0 ? max(0, past + q_first - a.window + 1) : 0;
  const int q_lowest = a.window > 0 ? q_pos - a.window + 1 : 0;  // this warp's first visible key

  float m = -INFINITY, l = 0.0f;
  float acc[kPerLane];
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) acc[e] = 0.0f;

  for (int k0 = k_first; k0 < n_keys; k0 += kKeyTile) {
    __syncthreads();  // the previous tile is consumed (and q_s is written, first time round)
    for (int i = threadIdx.x; i < kKeyTile * HD; i += kThreads) {
      const int j = i / HD, d = i % HD, t = k0 + j;
      bf16 kv = __float2bfloat16(0.0f), vv = kv;
      if (t < n_keys) {
        const int64_t slot = static_cast<int64_t>(table[t / a.block_size]) * a.block_size + t % a.block_size;
        const int64_t off = slot * row_elems + kv_local * HD + d;
        kv = a.kc[off];
        vv = a.vc[off];
      }
      k_s[j * kRow + d] = kv;
      v_s[j * kRow + d] = vv;
    }
    __syncthreads();
    if (!active) continue;

    // Lane j scores key k0 + j.
    const int t = k0 + lane;
    float s = -INFINITY;
    if (t <= q_pos && t >= q_lowest && t < n_keys) {
      s = 0.0f;
      const float* qv = q_s + warp * HD;
      const bf16* kr = k_s + lane * kRow;
#pragma unroll 8
      for (int d = 0; d < HD; ++d) s += qv[d] * __bfloat162float(kr[d]);
    }
    const float m_tile = warp_max(s);
    if (m_tile == -INFINITY) continue;  // every key of this tile is in this query's future (or out of its window)
    const float m_new = fmaxf(m, m_tile);
    const float corr = __expf(m - m_new);  // 0 the first time (m = -inf)
    const float p = s == -INFINITY ? 0.0f : __expf(s - m_new);
    l = l * corr + warp_sum(p);
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) acc[e] *= corr;
    for (int j = 0; j < kKeyTile; ++j) {
      const float pj = __shfl_sync(kFullMask, p, j);
      if (pj == 0.0f) continue;
      const bf16* vr = v_s + j * kRow;
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) acc[e] += pj * __bfloat162float(vr[lane + 32 * e]);
    }
    m = m_new;
  }
  if (!active) return;
  bf16* o = a.out + ((tok0 + qi) * n_q + h) * HD;
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) o[lane + 32 * e] = __float2bfloat16(l > 0.0f ? acc[e] / l : 0.0f);
}

}  // namespace

void paged_attention_prefill(const float* q, int64_t q_stride, const DeviceKvLayer& cache, const AttentionHeads& heads,
                             const DeviceSeqs& seqs, int64_t max_tokens_per_seq, bf16* out, cudaStream_t stream) {
  const int64_t n_seqs = seqs.n_seqs;
  if (n_seqs <= 0 || max_tokens_per_seq <= 0 || heads.n_q_heads <= 0) return;
  PrefillArgs a{};
  a.q = q;
  a.q_stride = q_stride;
  a.kc = cache.k;
  a.vc = cache.v;
  a.block_size = cache.block_size;
  a.n_kv_heads = cache.n_kv_heads;
  a.heads = heads;
  a.seqs = seqs;
  a.window = static_cast<int>(std::min<int64_t>(heads.window, 1 << 30));  // positions are int32
  a.scale = heads.scale_for(cache.head_dim);
  a.out = out;
  const dim3 grid(static_cast<unsigned>((max_tokens_per_seq + kPrefillQueryTile - 1) / kPrefillQueryTile),
                  static_cast<unsigned>(heads.n_q_heads), static_cast<unsigned>(n_seqs));
  auto launch = [&](auto tag) {
    constexpr int kHd = decltype(tag)::value;
    prefill_kernel<kHd><<<grid, kThreads, 0, stream>>>(a);
    SHARDLM_CUDA_CHECK_LAUNCH();
  };
  switch (cache.head_dim) {
    case 64: launch(std::integral_constant<int, 64>{}); break;
    case 96: launch(std::integral_constant<int, 96>{}); break;  // Phi-3-mini
    case 128: launch(std::integral_constant<int, 128>{}); break;
    case 256: launch(std::integral_constant<int, 256>{}); break;  // Gemma 2/3: 41 KiB of static shared memory
    default:
      fail(ErrorCode::kUnsupported, "CUDA prefill attention: head_dim ", cache.head_dim,
           " is not supported (", kAttentionHeadDims, ")");
  }
}

}  // namespace shardlm::backend::cuda
