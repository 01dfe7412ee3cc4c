// The body of backend/cpu/rows_gemm.h's kernel, included once per ISA by
// backend/cpu/isa/rows_gemm_<isa>.cpp, each compiled with that ISA's flags
// and defining SHARDLM_ROWS_NS (rows_avx512, rows_avx2, rows_scalar).
// Everything here has internal linkage, so the copies never meet at link
// time; it calls no inline function of another header that could be
// compiled for a different ISA elsewhere (simd.h is per-ISA namespaced; the
// error helpers are left to the dispatcher, backend/cpu/rows_gemm.cpp).
#ifndef SHARDLM_ROWS_NS
#error "define SHARDLM_ROWS_NS before including rows_gemm_impl.h"
#endif

#include <omp.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "backend/cpu/reduce16.h"
#include "backend/cpu/rows_gemm.h"
#include "backend/cpu/simd.h"

namespace shardlm::backend::SHARDLM_ROWS_NS {
namespace {

inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

// One stored element as f32 (the k % L tail).
template <DType D>
inline float elem(const char* row, int64_t i) {
  if constexpr (D == DType::kF32) {
    float f;
    std::memcpy(&f, row + 4 * i, 4);
    return f;
  } else if constexpr (D == DType::kBF16) {
    uint16_t h;
    std::memcpy(&h, row + 2 * i, 2);
    const uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  } else {
    uint16_t h;
    std::memcpy(&h, row + 2 * i, 2);
    return f16_to_f32(h);  // out of line (core): never an ISA-specific inline copy
  }
}

// Per element dtype bytes.
template <DType D>
constexpr int64_t kSize = D == DType::kF32 ? 4 : 2;

// Token rows per block whose x stays in L2 while a row block's weights are
// reused across it (about 512 KiB of x), a multiple of `tb`.
inline int64_t token_block(int64_t n, int64_t k, int64_t tb) {
  const int64_t fit = max64(tb, (int64_t{512} << 10) / max64(1, 4 * k) / tb * tb);
  return min64(n, fit);
}

#ifdef SHARDLM_SIMD
using namespace simd;

#if defined(__AVX512F__) && defined(__AVX512BW__)
using cpu_detail::reduce16;  // backend/cpu/reduce16.h

// sums[o] = tree sum of acc[o] for o < N.
template <int N>
inline void reduce_all(const Vec* acc, float* sums) {
  constexpr int kGroups = (N + 15) / 16;
  for (int g = 0; g < kGroups; ++g) {
    Vec v[16];
    for (int o = 0; o < 16; ++o) v[o] = g * 16 + o < N ? acc[g * 16 + o] : zerov();
    alignas(64) float out[16];
    _mm512_store_ps(out, reduce16(v));
    for (int o = 0; o < 16 && g * 16 + o < N; ++o) sums[g * 16 + o] = out[o];
  }
}

// Tile shapes (weight rows RB × token rows TB, RB·TB accumulators + TB x
// vectors + 1 weight vector of the 32 zmm registers). bf16 weights (the pair
// order, tile_pairs below) take 4 × 4 tiles from 2 rows on: their tile
// holds 2·RB weight vectors, and GCC kept wider ones (4 × 5 and up, 2 × 8,
// 3 × 6) partly on the stack. Measured in-process on 1 thread, q_proj with W
// in L2, 16 rows: 4 × 4 ran 120 GFLOP/s; 4 × 6 90, 5 × 4 92, 2 × 8 99,
// 3 × 8 87 (the old 4 × 6 tile of the old order: 101).
//
// Whether dtype D's tiles take the pair order (tile_pairs: bf16, AVX-512).
template <DType D>
constexpr bool kPairOrder = D == DType::kBF16;
template <DType D>
constexpr int kMaxTokens = kPairOrder<D> ? 4 : 6;
template <DType D>
inline int rows_for(int64_t n) {
  if constexpr (kPairOrder<D>) return n == 1 ? 8 : 4;
  return n <= 3 ? 8 : 4;
}
#else
// AVX2: the tree over 8 lanes (s2[i] = a[i] + a[i+4], then as above), one
// accumulator at a time (the same sequence simd::hsum does).
template <int N>
inline void reduce_all(const Vec* acc, float* sums) {
  for (int o = 0; o < N; ++o) {
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(acc[o]), _mm256_extractf128_ps(acc[o], 1));
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    sums[o] = _mm_cvtss_f32(lo);
  }
}
// 16 ymm: RB·TB + TB + 1 <= 16.
template <DType D>
constexpr bool kPairOrder = false;
template <DType D>
constexpr int kMaxTokens = 3;
template <DType D>
inline int rows_for(int64_t n) { return n == 1 ? 8 : 4; }
#endif

constexpr int64_t kPrefetchBytes = 512;

// Bytes [lo, hi) of the next row block that a tile prefetches into L2 over
// its k loop (its token groups split the range), so that the next block's
// DRAM reads overlap this block's FMAs: without it the first token group of
// every block waited on DRAM and the later groups on the FMA ports, one after
// the other (perf at 16 rows: the first group of 6 rows took as long as the
// next 10). Measured on Qwen2.5-0.5B's bf16 shapes, 2 threads (Xeon, AVX-512,
// no AMX): q/o_proj, gate/up_proj and lm_head run 0.72–0.82× the time at 4
// and 16 rows.
struct Ahead {
  const char* lo = nullptr;
  const char* hi = nullptr;
};
// Only rows up to this long are prefetched ahead: the hardware's stream
// prefetcher ramps up within a longer row by itself (down_proj's 9.5 KiB
// rows gained nothing and lost up to 10% at 1–4 rows from the extra traffic).
constexpr int64_t kAheadMaxRowBytes = 4096;

#if defined(__AVX512F__) && defined(__AVX512BW__)
// bf16 weights on AVX-512 take the pair order (rows_gemm.h): a block of 32
// weights is 16 dwords, each an (even, odd) pair of bf16. The odd element is
// the dword's high half, so a zero-masked load of the odd words is that
// element as f32; the same masked load 2 bytes earlier puts the even element
// in the high half. Neither takes an ALU op (the old widening took a
// vpmovzxwd on p5 and a vpslld on p0 per 16 weights, the FMA ports; one
// plain load with a vpslld and a vpandd measured about the same here).
// Lane j multiplies the weights 2j and 2j + 1 of the block by x's matching
// elements, which split_pairs puts in place once per call.
constexpr int64_t kPairLanes = 32;
inline int64_t pair_k(int64_t k) { return (k + kPairLanes - 1) / kPairLanes * kPairLanes; }

// xs[t][pair_k(k)] for x[t][k]: per block of 32, the 16 even elements then
// the 16 odd ones; zero past k (they meet masked-off, zero weights, so they
// add +0 to every lane).
inline void split_pairs(const float* x, int64_t n, int64_t k, float* xs) {
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  const int64_t kp = pair_k(k);
  for (int64_t t = 0; t < n; ++t) {
    const float* xr = x + t * k;
    float* o = xs + t * kp;
    for (int64_t i = 0; i < kp; i += kPairLanes) {
      const int64_t left = k - i;
      const __mmask16 lo = left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (left > 0 ? left : 0)) - 1);
      const __mmask16 hi = left >= 32 ? 0xFFFF : static_cast<__mmask16>((1u << (left > 16 ? left - 16 : 0)) - 1);
      const __m512 a = _mm512_maskz_loadu_ps(lo, xr + i), b = _mm512_maskz_loadu_ps(hi, xr + i + 16);
      _mm512_storeu_ps(o + i, _mm512_permutex2var_ps(a, even, b));
      _mm512_storeu_ps(o + i + 16, _mm512_permutex2var_ps(a, odd, b));
    }
  }
}

// The tile loops below, unrolled whole: GCC otherwise keeps the accumulator
// array in memory and stores all of it back every block.
#define SHARDLM_UNROLL _Pragma("GCC unroll 64")

// One block of 32 weights of the pair order: acc[r * TB + t] += the block's
// even weights of row r times x's even elements, then the odd ones. valid:
// the block's words that are weights (the others load as zero).
template <int RB, int TB>
inline void pair_step(const uint16_t* const* wrow, const float* const* xrow, int64_t i, __mmask32 valid, Vec* acc) {
  constexpr __mmask32 kOdd = 0xAAAAAAAAu;
  {
    // Word 2j + 1 of the load 2 bytes early is weight 2j; word 0 (the word
    // before the block) is masked off, and a masked-off word is never read,
    // even before the first row.
    Vec wv[RB];
    SHARDLM_UNROLL
    for (int r = 0; r < RB; ++r)
      wv[r] = _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(
          kOdd & (valid << 1), reinterpret_cast<const char*>(wrow[r] + i) - sizeof(uint16_t)));
    SHARDLM_UNROLL
    for (int t = 0; t < TB; ++t) {
      const Vec xv = loadx(xrow[t] + i);
      SHARDLM_UNROLL
      for (int r = 0; r < RB; ++r) acc[r * TB + t] = fmav(wv[r], xv, acc[r * TB + t]);
    }
  }
  {
    Vec wv[RB];
    SHARDLM_UNROLL
    for (int r = 0; r < RB; ++r) wv[r] = _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(kOdd & valid, wrow[r] + i));
    SHARDLM_UNROLL
    for (int t = 0; t < TB; ++t) {
      const Vec xv = loadx(xrow[t] + i + 16);
      SHARDLM_UNROLL
      for (int r = 0; r < RB; ++r) acc[r * TB + t] = fmav(wv[r], xv, acc[r * TB + t]);
    }
  }
}

// The pair order's tile (tile() below, same contract): x is split_pairs'
// rows, pair_k(k) floats apart. RB·TB accumulators + RB weight vectors + 1 x
// vector of the 32 zmm registers.
// Not inlined: inside chunk_group's loop GCC allocated the same tile's
// registers worse (measured 0.8x the speed at 8 and 16 rows).
template <int RB, int TB, bool PF, bool kTail>
__attribute__((noinline)) void tile_pairs(const float* xs, int64_t k, const char* w, int64_t m, int64_t j0,
                                          int64_t t0, float* y, Ahead ahead) {
  const int64_t kp = pair_k(k);
  const uint16_t* wrow[RB];
  SHARDLM_UNROLL
  for (int r = 0; r < RB; ++r) wrow[r] = reinterpret_cast<const uint16_t*>(w) + (j0 + r) * k;
  const float* xrow[TB];
  SHARDLM_UNROLL
  for (int t = 0; t < TB; ++t) xrow[t] = xs + (t0 + t) * kp;
  Vec acc[RB * TB];
  SHARDLM_UNROLL
  for (int o = 0; o < RB * TB; ++o) acc[o] = zerov();
  // Bytes of `ahead` per block, whole cache lines: at most RB lines (the
  // range is at most RB rows of k, split over the token groups).
  const int64_t n_steps = kp / kPairLanes;
  const int64_t pf_step = ((ahead.hi - ahead.lo + n_steps - 1) / n_steps + 63) / 64 * 64;
  const char* pf = ahead.lo;
  // kTail (k % 32 != 0): the last block's words past k are masked off, in
  // this loop (a second call of pair_step after it made GCC keep acc in
  // memory); without a tail the masks stay constants out of the loop.
  const __mmask32 last = static_cast<__mmask32>((uint64_t{1} << (k - (kp - kPairLanes))) - 1);
  for (int64_t i = 0; i < kp; i += kPairLanes) {
    if constexpr (PF) {
      SHARDLM_UNROLL
      for (int r = 0; r < RB; ++r) prefetch(reinterpret_cast<const char*>(wrow[r] + i) + kPrefetchBytes);
    }
    pair_step<RB, TB>(wrow, xrow, i, !kTail || i + kPairLanes <= k ? ~__mmask32{0} : last, acc);
    SHARDLM_UNROLL
    for (int l = 0; l < RB; ++l)
      if (64 * l < pf_step && pf + 64 * l < ahead.hi) _mm_prefetch(pf + 64 * l, _MM_HINT_T1);
    pf += pf_step;
  }
  float sums[RB * TB];
  reduce_all<RB * TB>(acc, sums);
  for (int r = 0; r < RB; ++r)
    for (int t = 0; t < TB; ++t) y[(t0 + t) * m + j0 + r] = sums[r * TB + t];
}
#endif

// y[t0 + t, j0 + r] for r < RB, t < TB. PF: prefetch each weight row's
// stream ahead (the first token group of a block: the later ones find the
// rows in L1/L2). `ahead` changes what is in cache, never the sum.
template <DType D, int RB, int TB, bool PF>
inline void tile(const float* x, int64_t k, const char* w, int64_t m, int64_t j0, int64_t t0, float* y, Ahead ahead) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
  if constexpr (kPairOrder<D>) {
    if (k % kPairLanes) return tile_pairs<RB, TB, PF, true>(x, k, w, m, j0, t0, y, ahead);
    return tile_pairs<RB, TB, PF, false>(x, k, w, m, j0, t0, y, ahead);
  }
#endif
  constexpr int64_t es = kSize<D>;
  const char* wrow[RB];
  for (int r = 0; r < RB; ++r) wrow[r] = w + (j0 + r) * k * es;
  const float* xrow[TB];
  for (int t = 0; t < TB; ++t) xrow[t] = x + (t0 + t) * k;
  Vec acc[RB * TB];
  for (int o = 0; o < RB * TB; ++o) acc[o] = zerov();
  const int64_t kv = k - k % kLanes;
  // Bytes of `ahead` per k step, in whole cache lines.
  const int64_t n_steps = kv / kLanes;
  const int64_t pf_step = n_steps > 0 ? ((ahead.hi - ahead.lo + n_steps - 1) / n_steps + 63) / 64 * 64 : 0;
  const char* pf = ahead.lo;
  for (int64_t i = 0; i < kv; i += kLanes) {
    Vec xv[TB];
    for (int t = 0; t < TB; ++t) xv[t] = loadx(xrow[t] + i);
    for (int r = 0; r < RB; ++r) {
      if constexpr (PF) {
        if ((i * es) % 64 == 0) prefetch(wrow[r] + i * es + kPrefetchBytes);
      }
      const Vec wv = loadv<D>(wrow[r], i);
      for (int t = 0; t < TB; ++t) acc[r * TB + t] = fmav(wv, xv[t], acc[r * TB + t]);
    }
    for (const char* e = pf + pf_step; pf < e && pf < ahead.hi; pf += 64) _mm_prefetch(pf, _MM_HINT_T1);
  }
  float sums[RB * TB];
  reduce_all<RB * TB>(acc, sums);
  for (int r = 0; r < RB; ++r)
    for (int t = 0; t < TB; ++t) {
      float s = sums[r * TB + t];
      for (int64_t i = kv; i < k; ++i) s = __builtin_fmaf(elem<D>(wrow[r], i), xrow[t][i], s);
      y[(t0 + t) * m + j0 + r] = s;
    }
}

template <DType D, int RB, int TB>
inline void tile_pf(bool pf, const float* x, int64_t k, const char* w, int64_t m, int64_t j0, int64_t t0, float* y,
                    Ahead ahead) {
  if (pf) tile<D, RB, TB, true>(x, k, w, m, j0, t0, y, ahead);
  else tile<D, RB, TB, false>(x, k, w, m, j0, t0, y, ahead);
}

// How token rows split into groups, one tile each: near-equal groups of at
// most kGroupTokens (at most 24 accumulators: rows_for never gives a wider
// tile, and the cap keeps the unused ones from being built). The pair
// order's 4-row tiles take up to 6 rows as one group: 4 × 5 and 4 × 6 spill
// a little but read W once (5 rows, 1 thread, W from DRAM: 0.94-1.07x the
// old kernel's time per shape, against 1.01-1.20x as groups of 3 + 2).
template <DType D, int RB>
constexpr int kGroupTokens = kMaxTokens<D> < 24 / RB ? kMaxTokens<D> : 24 / RB;
template <DType D, int RB>
constexpr int kTileTokens = kPairOrder<D> && RB == 4 ? 6 : kGroupTokens<D, RB>;  // the widest tile built
template <DType D, int RB>
inline int64_t groups_for(int64_t rows) {
  return rows <= kTileTokens<D, RB> ? 1 : (rows + kGroupTokens<D, RB> - 1) / kGroupTokens<D, RB>;
}

// f(std::integral_constant<int, tb>{}) for the token group size tb in [1, N]:
// one tile instantiation per size, as a switch would make.
template <int N, class F>
inline void with_tokens(int64_t tb, F&& f) {
  if (tb == N) return f(std::integral_constant<int, N>{});
  if constexpr (N > 1) with_tokens<N - 1>(tb, f);
}

// Token rows [t0, t1) against weight rows [j0, j0 + RB): groups_for's
// near-equal groups (16 = 6 + 5 + 5, not 6 + 6 + 4). The groups
// share the prefetch of the next row block [j0 + RB, j0 + 2 RB) (Ahead).
// `after`: the block this thread runs next when it is not [j0 + RB, j0 + 2 RB)
// (the last block of a work item: the next item's first rows).
template <DType D, int RB>
void row_block(const float* x, int64_t k, const char* w, int64_t m, int64_t j0, int64_t t0, int64_t t1, float* y,
               const Ahead* after = nullptr) {
  constexpr int64_t es = kSize<D>;
  const int64_t n_groups = groups_for<D, RB>(t1 - t0);
  const char* next_lo = after ? after->lo : w + (j0 + RB) * k * es;
  // Longer rows too for bf16 in several token groups: with 4-row groups the
  // first group's wait on DRAM is a larger share (down_proj, 16 and 24 rows,
  // 1 thread, W from DRAM: 1.13x the old kernel's time without, 0.82-0.89x
  // with).
  const bool next_too = k * es <= kAheadMaxRowBytes || (kPairOrder<D> && n_groups > 1);
  const int64_t next_bytes =
      !next_too ? 0
      : after   ? min64(RB * k * es, after->hi - after->lo)
                : max64(0, min64(RB, m - j0 - RB)) * k * es;
  for (int64_t g = 0, t = t0; g < n_groups; ++g) {
    const int64_t tb = (t1 - t + (n_groups - g) - 1) / (n_groups - g);
    const bool pf = g == 0;
    const Ahead ahead{next_lo + next_bytes * g / n_groups, next_lo + next_bytes * (g + 1) / n_groups};
    with_tokens<kTileTokens<D, RB>>(tb, [&](auto tbc) { tile_pf<D, RB, tbc()>(pf, x, k, w, m, j0, t, y, ahead); });
    t += tb;
  }
}

// Row blocks per chunk of the token-group-major order (run_rb): 8 blocks of
// 4 bf16 rows of k = 896 are 56 KiB of W, which stay in L2 while a token
// group's x (6 rows, 21 KiB) stays in L1. 4 and 16 were measured too: 4
// lost a little at 16 rows, 16 lost on q/o_proj's 224 blocks (balance).
constexpr int64_t kChunkBlocks = 8;

// Row blocks [b0, b1) against the token group [t, t + TB); tile q0 + i of
// the chunk's n_tiles prefetches its share of next[0, n_next).
template <DType D, int RB, int TB>
void chunk_group(const float* x, int64_t k, const char* w, int64_t m, int64_t b0, int64_t b1, int64_t t, float* y,
                 bool pf, const char* next, int64_t n_next, int64_t q0, int64_t n_tiles) {
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t q = q0 + (b - b0);
    const Ahead ahead{next + n_next * q / n_tiles, next + n_next * (q + 1) / n_tiles};
    tile_pf<D, RB, TB>(pf, x, k, w, m, b * RB, t, y, ahead);
  }
}

// Token rows [t0, t1) in several groups against the full row blocks
// [b0, b1), token group by token group: each group's x stays in L1 across
// the chunk (block by block, a 16-row x of 56 KiB cycled through a 48 KiB
// L1 once per block), and the chunk's W is read from DRAM by the first group
// and from L2 by the others. The tiles spread the prefetch of `next` (the
// weights of the work item this thread runs after this one) over the chunk.
template <DType D, int RB>
void chunk(const float* x, int64_t k, const char* w, int64_t m, int64_t b0, int64_t b1, int64_t t0, int64_t t1,
           float* y, Ahead next) {
  const int64_t n_groups = groups_for<D, RB>(t1 - t0);
  const int64_t n_next = next.hi - next.lo;
  const int64_t n_tiles = n_groups * (b1 - b0);
  for (int64_t g = 0, t = t0; g < n_groups; ++g) {
    const int64_t tb = (t1 - t + (n_groups - g) - 1) / (n_groups - g);
    const bool pf = g == 0;
    const int64_t q0 = g * (b1 - b0);
    with_tokens<kTileTokens<D, RB>>(
        tb, [&](auto tbc) { chunk_group<D, RB, tbc()>(x, k, w, m, b0, b1, t, y, pf, next.lo, n_next, q0, n_tiles); });
    t += tb;
  }
}

// Row blocks per work item where a block sees one token group (the
// block-major order): the dynamic chunk of the loop before the grouping.
constexpr int64_t kItemBlocks = 8;

// The work items of one part (a matrix [m, k]) with RB-row blocks:
// chunked, its chunks of kChunkBlocks full blocks plus one for the m % RB
// tail rows; else its blocks (the tail rows one more) kItemBlocks at a time.
template <int RB>
int64_t n_items(int64_t m, bool chunked) {
  const int64_t n_full = m / RB, n_blocks = n_full + (m % RB ? 1 : 0);
  if (chunked) return (n_full + kChunkBlocks - 1) / kChunkBlocks + (m % RB ? 1 : 0);
  return (n_blocks + kItemBlocks - 1) / kItemBlocks;
}

// The bytes of W that work item c of `part` reads: its rows, whole.
template <DType D, int RB>
Ahead item_bytes(int64_t k, const RowsGemmPart& part, bool chunked, int64_t c) {
  const char* w = static_cast<const char*>(part.w);
  const int64_t row = k * kSize<D>, n_full = part.m / RB;
  const int64_t per = chunked ? kChunkBlocks : kItemBlocks;
  int64_t j0 = c * per * RB, j1 = min64(part.m, (c + 1) * per * RB);
  if (chunked && c * kChunkBlocks >= n_full) j0 = n_full * RB, j1 = part.m;  // the tail item
  else if (chunked) j1 = min64(j1, n_full * RB);
  return {w + j0 * row, w + j1 * row};
}

// Work item c of one part against token rows [t0, t1); `next`: the bytes
// of the item this thread runs next (prefetched into L2 by chunked items).
template <DType D, int RB>
void run_item(const float* x, int64_t k, const RowsGemmPart& part, bool chunked, int64_t c, int64_t t0, int64_t t1,
              Ahead next) {
  const char* w = static_cast<const char*>(part.w);
  const int64_t m = part.m, n_full = m / RB;
  float* y = part.y;
  if (chunked) {
    const int64_t b0 = c * kChunkBlocks;
    if (b0 < n_full) {
      chunk<D, RB>(x, k, w, m, b0, min64(n_full, b0 + kChunkBlocks), t0, t1, y, next);
    } else {
      for (int64_t j = n_full * RB; j < m; ++j) row_block<D, 1>(x, k, w, m, j, t0, t1, y);
    }
    return;
  }
  const int64_t n_blocks = n_full + (m % RB ? 1 : 0);
  for (int64_t b = c * kItemBlocks, e = min64(n_blocks, b + kItemBlocks); b < e; ++b) {
    if (b < n_full) {
      row_block<D, RB>(x, k, w, m, b * RB, t0, t1, y, b + 1 == e ? &next : nullptr);
    } else {
      for (int64_t j = n_full * RB; j < m; ++j) row_block<D, 1>(x, k, w, m, j, t0, t1, y);
    }
  }
}

// Every part's row blocks in one parallel region: one dynamic list of work
// items, part after part, per token block. An output element is computed by
// the same tile over the same token group as with its part alone (the
// token blocking, the tile shape and the chunked choice depend on n, k and
// the dtype, which the parts share), so each y is bit-identical to a call of
// its own; what changes is one ramp-up and one barrier for all the parts,
// and the last item's imbalance spread over all of them.
template <DType D, int RB>
void run_rb(const float* x, int64_t n, int64_t k, const RowsGemmPart* parts, int64_t n_parts) {
  constexpr int64_t es = kSize<D>;
  const int64_t tblock = token_block(n, k, kMaxTokens<D>);
  // Chunk order where a block sees several token groups and rows are short
  // (longer rows: x no longer fits L1 either way; not measured to gain).
  // In-process A/B, 16 rows, bf16, 2 threads: 0.86-0.92x the time of the
  // block-major order with the same prefetch.
  const bool chunked = min64(n, tblock) > kMaxTokens<D> && k * es <= kAheadMaxRowBytes;
  // first[p]: the index of part p's first item; first[n_parts]: all items.
  int64_t first[kRowsGemmMaxParts + 1] = {0};
  for (int64_t p = 0; p < n_parts; ++p) first[p + 1] = first[p] + n_items<RB>(parts[p].m, chunked);
  const int64_t n_all = first[n_parts];
  if (n_all == 0) return;
  // Work item g is item g % n_all of token block g / n_all. Each thread
  // claims its next item before it runs the current one (a dynamic
  // schedule one item ahead), so the current one prefetches the weights
  // that this thread reads next. With `omp for schedule(dynamic)` a thread
  // could only guess, and "the item after mine" is the one the other
  // thread has just taken: its L2 got a copy nobody read, and every first
  // token group of a chunk waited on DRAM (perf, 16 rows on 2 threads: the
  // first group took 2.1x each later group's time). Dynamic, not static: on
  // a shared machine one thread often runs slower than the other.
  const int64_t n_tblocks = (n + tblock - 1) / tblock, total = n_tblocks * n_all;
  std::atomic<int64_t> claimed{0};
  const auto item_at = [&](int64_t g, int64_t* p, int64_t* c) {
    const int64_t i = g % n_all;
    *p = 0;
    while (i >= first[*p + 1]) ++*p;
    *c = i - first[*p];
  };
#pragma omp parallel
  {
    int64_t cur = claimed.fetch_add(1, std::memory_order_relaxed);
    while (cur < total) {
      const int64_t nxt = claimed.fetch_add(1, std::memory_order_relaxed);
      int64_t p, c;
      Ahead ahead;
      if (nxt < total) {
        item_at(nxt, &p, &c);
        ahead = item_bytes<D, RB>(k, parts[p], chunked, c);
      }
      item_at(cur, &p, &c);
      const int64_t t0 = cur / n_all * tblock;
      run_item<D, RB>(x, k, parts[p], chunked, c, t0, min64(n, t0 + tblock), ahead);
      cur = nxt;
    }
  }
}

template <DType D>
void run(const float* x, int64_t n, int64_t k, const RowsGemmPart* parts, int64_t n_parts) {
  if (rows_for<D>(n) == 8) return run_rb<D, 8>(x, n, k, parts, n_parts);
  run_rb<D, 4>(x, n, k, parts, n_parts);
}

#else  // scalar: one sequential sum per element

// The parts one after the other, each its own parallel loop (the scalar
// kernel is the oracle and the fallback, not a speed path).
template <DType D>
void run(const float* x, int64_t n, int64_t k, const RowsGemmPart* parts, int64_t n_parts) {
  for (int64_t p = 0; p < n_parts; ++p) {
    const char* w = static_cast<const char*>(parts[p].w);
    const int64_t m = parts[p].m;
    float* y = parts[p].y;
#pragma omp parallel for schedule(dynamic, 16)
    for (int64_t j = 0; j < m; ++j) {
      const char* row = w + j * k * kSize<D>;
      for (int64_t t = 0; t < n; ++t) {
        const float* xr = x + t * k;
        float s = 0.0f;
        for (int64_t i = 0; i < k; ++i) s += elem<D>(row, i) * xr[i];
        y[t * m + j] = s;
      }
    }
  }
}

#endif

}  // namespace

void rows_gemm_many(const float* x, int64_t n, int64_t k, DType weight_dtype, const RowsGemmPart* parts,
                    int64_t n_parts) {
  if (n <= 0 || n_parts <= 0) return;
  switch (weight_dtype) {
    case DType::kF32: return run<DType::kF32>(x, n, k, parts, n_parts);
    case DType::kBF16: {
#if defined(SHARDLM_SIMD) && defined(__AVX512F__) && defined(__AVX512BW__)
      // The pair order's x (split_pairs), in the calling thread's buffer,
      // reused across calls; 64-byte aligned, one cache line per block. The
      // buffer holds at most kSplitFloats: a longer call (a batch-invariant
      // prefill chunk: thousands of rows × intermediate_size) runs in token
      // chunks, each row's sums the same either way (batch invariance), so
      // this memory, which the allocator does not count, stays bounded.
      constexpr int64_t kSplitFloats = int64_t{1} << 18;  // 1 MiB
      const int64_t kp = pair_k(k), chunk = max64(1, kSplitFloats / kp);
      static thread_local std::vector<float> xs_buf;
      const size_t need = static_cast<size_t>(min64(n, chunk) * kp) + 16;
      if (xs_buf.size() < need) xs_buf.resize(need);
      float* xs = xs_buf.data() + (16 - reinterpret_cast<uintptr_t>(xs_buf.data()) / 4 % 16) % 16;
      RowsGemmPart at[kRowsGemmMaxParts];
      for (int64_t t0 = 0; t0 < n; t0 += chunk) {
        const int64_t nt = min64(chunk, n - t0);
        for (int64_t p = 0; p < n_parts; ++p) at[p] = {parts[p].w, parts[p].m, parts[p].y + t0 * parts[p].m};
        split_pairs(x + t0 * k, nt, k, xs);
        run<DType::kBF16>(xs, nt, k, at, n_parts);
      }
      return;
#else
      return run<DType::kBF16>(x, n, k, parts, n_parts);
#endif
    }
    case DType::kF16: return run<DType::kF16>(x, n, k, parts, n_parts);
    default: return;  // backend::rows_gemm_many checked the dtype and the part count
  }
}

}  // namespace shardlm::backend::SHARDLM_ROWS_NS
