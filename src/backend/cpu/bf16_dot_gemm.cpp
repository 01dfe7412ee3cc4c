#include "backend/cpu/bf16_dot_gemm.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/cpu_isa.h"
#include "backend/cpu/kernel_report.h"
#include "backend/cpu/reduce16.h"
#include "backend/cpu/ops.h"
#include "core/error.h"

// GCC 10 and clang 9 have the AVX512_BF16 intrinsics. The kernel's functions
// carry the target attribute themselves, so the rest of this file (and every
// inline function of another header it instantiates: std::vector, the error
// helpers) is compiled for the build's baseline ISA and never meets an
// AVX-512 copy at link time.
#if defined(__x86_64__) && (defined(__clang__) ? __clang_major__ >= 9 : __GNUC__ >= 10)
#define SHARDLM_BF16_DOT 1
#include <immintrin.h>
// GCC 12 takes _mm512_undefined_ps's deliberate self-initialisation, inlined
// into a target-attributed function, for an uninitialised read.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define SHARDLM_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma")))
#endif

namespace shardlm::backend {

#ifdef SHARDLM_BF16_DOT
namespace {

constexpr int64_t kChunk = 32;  // bf16 elements per zmm: one VDPBF16PS step along k

// The rows GEMM's fixed tree (backend/cpu/reduce16.h): an accumulator's sum
// does not depend on which others share the call.
using cpu_detail::reduce16;

// sums[o] = tree sum of acc[o] for o < N.
template <int N>
SHARDLM_BF16_TARGET inline void reduce_all(const __m512* acc, float* sums) {
  for (int g = 0; g < (N + 15) / 16; ++g) {
    __m512 v[16];
    for (int o = 0; o < 16; ++o) v[o] = g * 16 + o < N ? acc[g * 16 + o] : _mm512_setzero_ps();
    alignas(64) float out[16];
    _mm512_store_ps(out, reduce16(v));
    for (int o = 0; o < 16 && g * 16 + o < N; ++o) sums[g * 16 + o] = out[o];
  }
}

// xb[0, kp) = bf16(x[0, k)) rounded to nearest even, zero past k.
SHARDLM_BF16_TARGET void round_row(const float* x, int64_t k, int64_t kp, uint16_t* xb) {
  int64_t i = 0;
  for (; i + kChunk <= k; i += kChunk) {
    const __m512bh h = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i));
    _mm512_storeu_si512(xb + i, (__m512i)h);
  }
  if (i < k) {
    const int64_t left = k - i;
    const __mmask16 lo = static_cast<__mmask16>(left >= 16 ? 0xFFFF : (1u << left) - 1);
    const __mmask16 hi = static_cast<__mmask16>(left <= 16 ? 0 : (1u << (left - 16)) - 1);
    const __m512bh h = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, x + i + 16), _mm512_maskz_loadu_ps(lo, x + i));
    _mm512_storeu_si512(xb + i, (__m512i)h);
    i += kChunk;
  }
  for (; i < kp; ++i) xb[i] = 0;
}

SHARDLM_BF16_TARGET inline __m512bh as_bh(__m512i v) { return (__m512bh)v; }

constexpr int64_t kPrefetchElems = 256;  // 512 bytes ahead in each weight row

// y[t0 + t, j0 + r] for r < RB, t < TB over the whole of k. x rows are the
// bf16 copies (kp apart, zero-padded to kp); the k % 32 tail of a weight row
// is a masked load (zeros past k), so it joins the last chunk. PF: prefetch
// each weight row's stream ahead (the first token group of a block).
template <int RB, int TB, bool PF>
SHARDLM_BF16_TARGET inline void tile(const uint16_t* xb, int64_t kp, const uint16_t* w, int64_t k, int64_t m,
                                     int64_t j0, int64_t t0, float* y) {
  const uint16_t* wrow[RB];
  for (int r = 0; r < RB; ++r) wrow[r] = w + (j0 + r) * k;
  const uint16_t* xrow[TB];
  for (int t = 0; t < TB; ++t) xrow[t] = xb + (t0 + t) * kp;
  __m512 acc[RB * TB];
  for (int o = 0; o < RB * TB; ++o) acc[o] = _mm512_setzero_ps();
  const int64_t kv = k - k % kChunk;
  for (int64_t i = 0; i < kv; i += kChunk) {
    __m512bh xv[TB];
    for (int t = 0; t < TB; ++t) xv[t] = as_bh(_mm512_loadu_si512(xrow[t] + i));
    for (int r = 0; r < RB; ++r) {
      if constexpr (PF) _mm_prefetch(reinterpret_cast<const char*>(wrow[r] + i + kPrefetchElems), _MM_HINT_T0);
      const __m512bh wv = as_bh(_mm512_loadu_si512(wrow[r] + i));
      for (int t = 0; t < TB; ++t) acc[r * TB + t] = _mm512_dpbf16_ps(acc[r * TB + t], wv, xv[t]);
    }
  }
  if (kv < k) {
    const __mmask32 tail = static_cast<__mmask32>((uint64_t{1} << (k - kv)) - 1);
    __m512bh xv[TB];
    for (int t = 0; t < TB; ++t) xv[t] = as_bh(_mm512_loadu_si512(xrow[t] + kv));
    for (int r = 0; r < RB; ++r) {
      const __m512bh wv = as_bh(_mm512_maskz_loadu_epi16(tail, wrow[r] + kv));
      for (int t = 0; t < TB; ++t) acc[r * TB + t] = _mm512_dpbf16_ps(acc[r * TB + t], wv, xv[t]);
    }
  }
  float sums[RB * TB];
  reduce_all<RB * TB>(acc, sums);
  for (int r = 0; r < RB; ++r)
    for (int t = 0; t < TB; ++t) y[(t0 + t) * m + j0 + r] = sums[r * TB + t];
}

// Token rows per register tile: RB·TB accumulators + TB x vectors + 1
// weight vector within the 32 zmm registers.
template <int RB>
constexpr int kMaxTokens = RB == 8 ? 3 : 6;

template <int RB, int TB>
SHARDLM_BF16_TARGET inline void tile_pf(bool pf, const uint16_t* xb, int64_t kp, const uint16_t* w, int64_t k,
                                        int64_t m, int64_t j0, int64_t t0, float* y) {
  if (pf) tile<RB, TB, true>(xb, kp, w, k, m, j0, t0, y);
  else tile<RB, TB, false>(xb, kp, w, k, m, j0, t0, y);
}

// Token rows [t0, t1) against weight rows [j0, j0 + RB), in groups of at
// most kMaxTokens<RB> of near-equal size (16 = 6 + 5 + 5, not 6 + 6 + 4).
template <int RB>
SHARDLM_BF16_TARGET void row_block(const uint16_t* xb, int64_t kp, const uint16_t* w, int64_t k, int64_t m,
                                   int64_t j0, int64_t t0, int64_t t1, float* y) {
  constexpr int kMax = kMaxTokens<RB>;
  const int64_t n_groups = (t1 - t0 + kMax - 1) / kMax;
  for (int64_t g = 0, t = t0; g < n_groups; ++g) {
    const int64_t tb = (t1 - t + (n_groups - g) - 1) / (n_groups - g);
    const bool pf = g == 0;
    switch (tb) {
      case 1: tile_pf<RB, 1>(pf, xb, kp, w, k, m, j0, t, y); break;
      case 2: tile_pf<RB, 2>(pf, xb, kp, w, k, m, j0, t, y); break;
      case 3: tile_pf<RB, 3>(pf, xb, kp, w, k, m, j0, t, y); break;
      default:
        if constexpr (kMax == 6) {
          switch (tb) {
            case 4: tile_pf<RB, 4>(pf, xb, kp, w, k, m, j0, t, y); break;
            case 5: tile_pf<RB, 5>(pf, xb, kp, w, k, m, j0, t, y); break;
            default: tile_pf<RB, 6>(pf, xb, kp, w, k, m, j0, t, y); break;
          }
        }
    }
    t += tb;
  }
}

// Row block b of RB rows (the last, partial one row by row) for tokens [t0, t1).
template <int RB>
SHARDLM_BF16_TARGET void run_block(int64_t b, const uint16_t* xb, int64_t kp, const uint16_t* w, int64_t k,
                                   int64_t m, int64_t t0, int64_t t1, float* y) {
  if ((b + 1) * RB <= m) return row_block<RB>(xb, kp, w, k, m, b * RB, t0, t1, y);
  for (int64_t j = b * RB; j < m; ++j) row_block<1>(xb, kp, w, k, m, j, t0, t1, y);
}

// Token rows per block whose bf16 copy (about 512 KiB) stays in L2 while a
// row block's weights are reused across it; a multiple of the tile height.
int64_t token_block(int64_t n, int64_t kp, int64_t tb) {
  const int64_t fit = std::max<int64_t>(tb, (int64_t{512} << 10) / (2 * kp) / tb * tb);
  return std::min(n, fit);
}

template <int RB>
void run(const uint16_t* xb, int64_t n, int64_t kp, const uint16_t* w, int64_t m, int64_t k, float* y) {
  const int64_t n_blocks = (m + RB - 1) / RB;
  const int64_t tblock = token_block(n, kp, kMaxTokens<RB>);
#pragma omp parallel
  for (int64_t t0 = 0; t0 < n; t0 += tblock) {
    const int64_t t1 = std::min(n, t0 + tblock);
    // Dynamic chunks of row blocks: threads of a shared machine run at unequal speed.
#pragma omp for schedule(dynamic, 8)
    for (int64_t b = 0; b < n_blocks; ++b) run_block<RB>(b, xb, kp, w, k, m, t0, t1, y);
  }
}

// ---- Token-vector kernel (prefill, large batches) ----
// Tokens go along the vector: the activations are laid out once per call as
// panels of 16 tokens, xv[g][p] = one zmm holding, for each token l of panel
// g, its bf16 pair (x[2p], x[2p+1]) as one 32-bit word (VDPBF16PS's pair
// layout). A weight row's pair W[j, 2p..2p+1] is one 32-bit word of the
// stored row, broadcast to all lanes: no copy or repacking of W, and no
// horizontal sum (lane l of column j's accumulator is y[16g + l, j]). Each
// element sums its pairs in increasing k, an odd k's last element alone.

constexpr int64_t kPanel = 16;  // tokens per zmm

// xv for tokens [0, n): [ceil(n / 16), kp / 2, 16] words, zero past n.
SHARDLM_BF16_TARGET void pack_panel(const uint16_t* xb, int64_t n, int64_t kp, int64_t g, uint32_t* xv) {
  const int64_t pairs = kp / 2, t0 = g * kPanel;
  uint32_t* out = xv + g * pairs * kPanel;
  const int64_t valid = std::min<int64_t>(kPanel, n - t0);
  // Pair p of the panel's 16 tokens, gathered into one vector (lanes past n: zero).
  const __m512i lane_rows = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                               _mm512_set1_epi32(static_cast<int>(kp / 2)));
  const __mmask16 live = static_cast<__mmask16>(valid >= 16 ? 0xFFFF : (1u << valid) - 1);
  const int* base = reinterpret_cast<const int*>(xb + t0 * kp);
  for (int64_t p = 0; p < pairs; ++p) {
    const __m512i v = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, lane_rows, base + p, 4);
    _mm512_storeu_si512(out + p * kPanel, v);
  }
}

// y[16·g0 + 16v + l, j0 + r] for r < MR, v < NV, over all of k. W rows are
// read where they are stored.
template <int MR, int NV>
SHARDLM_BF16_TARGET inline void tv_tile(const uint32_t* xv, int64_t pairs, const uint16_t* w, int64_t k, int64_t m,
                                        int64_t j0, int64_t g0, int64_t n, float* y) {
  const uint16_t* wrow[MR];
  for (int r = 0; r < MR; ++r) wrow[r] = w + (j0 + r) * k;
  const uint32_t* xp[NV];
  for (int v = 0; v < NV; ++v) xp[v] = xv + (g0 + v) * pairs * kPanel;
  __m512 acc[MR * NV];
  for (int o = 0; o < MR * NV; ++o) acc[o] = _mm512_setzero_ps();
  const int64_t full = k / 2;
  for (int64_t p = 0; p < full; ++p) {
    __m512bh xvv[NV];
    for (int v = 0; v < NV; ++v) xvv[v] = as_bh(_mm512_loadu_si512(xp[v] + p * kPanel));
    for (int r = 0; r < MR; ++r) {
      int32_t word;
      std::memcpy(&word, wrow[r] + 2 * p, 4);
      const __m512bh wb = as_bh(_mm512_set1_epi32(word));
      for (int v = 0; v < NV; ++v) acc[r * NV + v] = _mm512_dpbf16_ps(acc[r * NV + v], wb, xvv[v]);
    }
  }
  if (k % 2) {  // the last element alone: its pair's high half is zero (never the next row's)
    __m512bh xvv[NV];
    for (int v = 0; v < NV; ++v) xvv[v] = as_bh(_mm512_loadu_si512(xp[v] + full * kPanel));
    for (int r = 0; r < MR; ++r) {
      const __m512bh wb = as_bh(_mm512_set1_epi32(static_cast<int>(wrow[r][k - 1])));
      for (int v = 0; v < NV; ++v) acc[r * NV + v] = _mm512_dpbf16_ps(acc[r * NV + v], wb, xvv[v]);
    }
  }
  alignas(64) float out[MR * NV * kPanel];
  for (int o = 0; o < MR * NV; ++o) _mm512_store_ps(out + o * kPanel, acc[o]);
  for (int v = 0; v < NV; ++v) {
    const int64_t t0 = (g0 + v) * kPanel, valid = std::min<int64_t>(kPanel, n - t0);
    for (int64_t l = 0; l < valid; ++l) {
      float* yr = y + (t0 + l) * m + j0;
      for (int r = 0; r < MR; ++r) yr[r] = out[(r * NV + v) * kPanel + l];
    }
  }
}

// Weight rows [j0, j0 + MR) against token panels [g0, g1): pairs of panels
// (32 tokens), a last odd one alone.
template <int MR>
SHARDLM_BF16_TARGET void tv_rows(const uint32_t* xv, int64_t pairs, const uint16_t* w, int64_t k, int64_t m,
                                 int64_t j0, int64_t g0, int64_t g1, int64_t n, float* y) {
  int64_t g = g0;
  for (; g + 2 <= g1; g += 2) tv_tile<MR, 2>(xv, pairs, w, k, m, j0, g, n, y);
  if (g < g1) tv_tile<MR, 1>(xv, pairs, w, k, m, j0, g, n, y);
}

constexpr int64_t kTvRows = 12;  // 12 rows × 2 panels: 24 accumulators + 2 x vectors + 1 broadcast

// Row block b (kTvRows rows; the last, partial one by 4s and then 1s).
SHARDLM_BF16_TARGET void tv_block(int64_t b, const uint32_t* xv, int64_t pairs, const uint16_t* w, int64_t k,
                                  int64_t m, int64_t g0, int64_t g1, int64_t n, float* y) {
  int64_t j = b * kTvRows;
  if (j + kTvRows <= m) return tv_rows<kTvRows>(xv, pairs, w, k, m, j, g0, g1, n, y);
  for (; j + 4 <= m; j += 4) tv_rows<4>(xv, pairs, w, k, m, j, g0, g1, n, y);
  for (; j < m; ++j) tv_rows<1>(xv, pairs, w, k, m, j, g0, g1, n, y);
}

void run_tv(const uint16_t* xb, int64_t n, int64_t kp, const uint16_t* w, int64_t m, int64_t k, float* y) {
  const int64_t pairs = kp / 2, n_panels = (n + kPanel - 1) / kPanel;
  static thread_local std::vector<uint32_t> xv_buf;
  if (xv_buf.size() < static_cast<size_t>(n_panels * pairs * kPanel))
    xv_buf.resize(static_cast<size_t>(n_panels * pairs * kPanel));
  uint32_t* xv = xv_buf.data();
  // Panels per token block: about 1 MiB of xv, kept in L2 while a row
  // block's weights are reused across it; an even count (32-token tiles).
  const int64_t per_block = std::min(n_panels, std::max<int64_t>(2, ((int64_t{1} << 20) / (pairs * 64)) / 2 * 2));
  const int64_t n_blocks = (m + kTvRows - 1) / kTvRows;
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t g = 0; g < n_panels; ++g) pack_panel(xb, n, kp, g, xv);
    for (int64_t g0 = 0; g0 < n_panels; g0 += per_block) {
      const int64_t g1 = std::min(n_panels, g0 + per_block);
#pragma omp for schedule(dynamic, 4)
      for (int64_t b = 0; b < n_blocks; ++b) tv_block(b, xv, pairs, w, k, m, g0, g1, n, y);
    }
  }
}

}  // namespace

bool bf16_dot_gemm_built() { return true; }

#else

bool bf16_dot_gemm_built() { return false; }

#endif

bool bf16_dot_gemm_runs() { return bf16_dot_gemm_built() && active_cpu_isa() >= CpuIsa::kAvx512Bf16; }

const char* bf16_dot_gemm_missing() {
  if (!bf16_dot_gemm_built()) return "this build has no AVX512_BF16 kernel (it needs x86-64 and GCC 10 or clang 9)";
  if (detected_cpu_isa() < CpuIsa::kAvx512Bf16) return "this CPU lacks AVX512_BF16 (CPUID leaf 7.1 EAX bit 5)";
  if (active_cpu_isa() < CpuIsa::kAvx512Bf16) return "SHARDLM_ISA caps the CPU kernels below avx512bf16";
  return "";
}

void bf16_dot_gemm(const float* x, int64_t n, const uint16_t* w, int64_t m, int64_t k, float* y) {
  if (!bf16_dot_gemm_runs()) fail(ErrorCode::kUnsupported, "bf16 activations: ", bf16_dot_gemm_missing());
#ifdef SHARDLM_BF16_DOT
  if (n <= 0 || m <= 0) return;
  count_kernel("bf16dot/avx512bf16", "bf16", n, m, k);
  if (k <= 0) {
    std::memset(y, 0, static_cast<size_t>(n * m) * sizeof(float));
    return;
  }
  const int64_t kp = (k + kChunk - 1) / kChunk * kChunk;
  // The activations in bf16, once per call: [n, kp]. Reused across calls.
  static thread_local std::vector<uint16_t> xb_buf;
  if (xb_buf.size() < static_cast<size_t>(n * kp)) xb_buf.resize(static_cast<size_t>(n * kp));
  uint16_t* xb = xb_buf.data();
#pragma omp parallel for schedule(static) if (n * k > 65536)
  for (int64_t t = 0; t < n; ++t) round_row(x + t * k, k, kp, xb + t * kp);
  if (n <= 3) return run<8>(xb, n, kp, w, m, k, y);
  if (n < kBf16TokenVectorMinRows || batch_invariant()) return run<4>(xb, n, kp, w, m, k, y);
  run_tv(xb, n, kp, w, m, k, y);
#endif
}

const char* dense_activations_name(DenseActivations a) { return a == DenseActivations::kBf16 ? "bf16" : "f32"; }

bool parse_dense_activations(const char* s, DenseActivations* out) {
  if (std::strcmp(s, "f32") == 0) *out = DenseActivations::kF32;
  else if (std::strcmp(s, "bf16") == 0) *out = DenseActivations::kBf16;
  else return false;
  return true;
}

namespace {
// -1 until read from the environment (or set); then a DenseActivations.
std::atomic<int> g_dense_activations{-1};
}  // namespace

DenseActivations default_dense_activations() {
  const int v = g_dense_activations.load(std::memory_order_relaxed);
  if (v >= 0) return static_cast<DenseActivations>(v);
  DenseActivations from_env = DenseActivations::kF32;
  if (const char* env = std::getenv("SHARDLM_DENSE_ACTIVATIONS"); env != nullptr && *env != 0) {
    if (!parse_dense_activations(env, &from_env))
      fail(ErrorCode::kInvalidArgument, "SHARDLM_DENSE_ACTIVATIONS is '", env,
           "': expected f32 (the default: exact) or bf16 (bf16 weights take bf16-rounded activations and AVX512_BF16 "
           "dot products)");
    if (from_env == DenseActivations::kBf16 && !bf16_dot_gemm_runs())
      fail(ErrorCode::kUnsupported, "SHARDLM_DENSE_ACTIVATIONS=bf16: ", bf16_dot_gemm_missing(),
           "; unset it or use f32");
  }
  int expected = -1;
  g_dense_activations.compare_exchange_strong(expected, static_cast<int>(from_env));
  return static_cast<DenseActivations>(g_dense_activations.load(std::memory_order_relaxed));
}

void set_default_dense_activations(DenseActivations activations) {
  if (activations == DenseActivations::kBf16 && !bf16_dot_gemm_runs())
    fail(ErrorCode::kUnsupported, "bf16 activations: ", bf16_dot_gemm_missing());
  g_dense_activations.store(static_cast<int>(activations), std::memory_order_relaxed);
}

}  // namespace shardlm::backend
