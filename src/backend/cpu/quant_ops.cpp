// Optimised quantized matmuls: AVX-512 kernels that unpack and dequantize in
// registers, threaded over output channels with OpenMP (the f32-activation
// path; the int8-activation AWQ/GPTQ kernels are in quant_ops_int8.cpp).
// AWQ and GPTQ run, by active_cpu_isa(): these AVX-512 kernels where the
// build has them, else the AVX2 ones (backend/cpu/isa/quant_avx2.cpp, built
// for AVX2 whatever -march says), else the scalar reference.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "backend/cpu/quant_ops.h"
#include "backend/cpu/kernel_report.h"
#include "backend/cpu/packed_gemm.h"
#include "backend/cpu/quant_ops_int8.h"
#include "backend/cpu/quant_ops_isa.h"
#include "core/cpu_isa.h"
#include "backend/cpu/quant_simd.h"
#include "backend/cpu/simd.h"
#include "core/error.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
// GCC 12 reports its own _mm512_undefined_* inside the intrinsics headers as
// "may be used uninitialized" at -O3 (GCC bug 105593): not this code's.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#define SHARDLM_QUANT_AVX512 1
#endif

namespace shardlm::backend {

namespace {

void add_bias(const VectorView* bias, int64_t n, int64_t m, float* y) {
  if (!bias) return;
  SHARDLM_CHECK(bias->n == m, "bias has ", bias->n, " elements, the Linear ", m, " outputs");
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < m; ++j) y[t * m + j] += load_as_f32(bias->data, bias->dtype, static_cast<size_t>(j));
}

#ifdef SHARDLM_QUANT_AVX512

using quant_simd::lanes_mask;
using quant_simd::load_scales;

// ---- GPTQ: qweight [n_in / P, n_out], 16 consecutive channels per vector ----
// One block of 16 output channels from n0 (m: the valid ones) for tokens
// [t0, t0 + TB). Rows are visited in order; whenever a row's group differs
// from the previous row's (every group_size rows, or any row under
// act-order), the finished run is folded in with its scale and zero.
template <int BITS, int TB>
void gptq_block(const float* x, const QuantMatrixView& w, int64_t n0, __mmask16 m, int64_t t0, float* y) {
  constexpr int P = 32 / BITS;
  const int64_t K = w.n_in, N = w.n_out, R = K / P;
  const __m512i maskv = _mm512_set1_epi32((1 << BITS) - 1);
  // Zero points: lane l is field l % P of word l / P of the block's 16 / P words.
  alignas(64) int32_t div[16], shift[16];
  for (int l = 0; l < 16; ++l) {
    div[l] = l / P;
    shift[l] = (l % P) * BITS;
  }
  const __m512i zdiv = _mm512_load_si512(div), zshift = _mm512_load_si512(shift);
  const int64_t valid = std::min<int64_t>(16, N - n0);
  const __mmask16 zmask = lanes_mask(valid / P);
  const float* xr[TB];
  for (int t = 0; t < TB; ++t) xr[t] = x + (t0 + t) * K;
  __m512 yacc[TB], qacc[TB];
  float sx[TB];
  for (int t = 0; t < TB; ++t) {
    yacc[t] = qacc[t] = _mm512_setzero_ps();
    sx[t] = 0.0f;
  }
  const __m512 zoff = _mm512_set1_ps(static_cast<float>(w.zero_offset));
  auto flush = [&](int64_t g) {
    const __m512 s = load_scales(w.scales, w.scales_dtype, g * N + n0, m);
    __m512i zi = _mm512_maskz_loadu_epi32(zmask, w.qzeros + g * (N / P) + n0 / P);
    zi = _mm512_and_si512(_mm512_srlv_epi32(_mm512_permutexvar_epi32(zdiv, zi), zshift), maskv);
    const __m512 z = _mm512_add_ps(_mm512_cvtepi32_ps(zi), zoff);
    for (int t = 0; t < TB; ++t) {
      yacc[t] = _mm512_fmadd_ps(s, _mm512_fnmadd_ps(z, _mm512_set1_ps(sx[t]), qacc[t]), yacc[t]);
      qacc[t] = _mm512_setzero_ps();
      sx[t] = 0.0f;
    }
  };
  int64_t cur = -1;
  for (int64_t r = 0; r < R; ++r) {
    const __m512i wv = _mm512_maskz_loadu_epi32(m, w.qweight + r * N + n0);
    for (int j = 0; j < P; ++j) {
      const int64_t k = r * P + j;
      const int64_t g = w.g_idx[k] - w.group_offset;
      if (g != cur) {
        if (cur >= 0) flush(cur);
        cur = g;
      }
      const __m512 qv = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(wv, BITS * j), maskv));
      for (int t = 0; t < TB; ++t) {
        const float xs = xr[t][k];
        qacc[t] = _mm512_fmadd_ps(_mm512_set1_ps(xs), qv, qacc[t]);
        sx[t] += xs;
      }
    }
  }
  if (cur >= 0) flush(cur);
  for (int t = 0; t < TB; ++t) _mm512_mask_storeu_ps(y + (t0 + t) * N + n0, m, yacc[t]);
}

// The share of `n_units` a thread takes: contiguous, so that each thread
// streams whole runs of every packed row.
inline std::pair<int64_t, int64_t> thread_share(int64_t n_units) {
  const int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
  return {n_units * t / n, n_units * (t + 1) / n};
}

// GPTQ whose groups follow the rows (g_idx[k] - group_offset == k / group_size,
// no act-order): each thread sweeps its channel blocks [b0, b1) row by row, a
// single forward stream through qweight, accumulating per block in a
// per-thread scratch of TB × blocks vectors (L1/L2, never weights).
template <int BITS, int TB>
void gptq_sweep(const float* x, const QuantMatrixView& w, int64_t b0, int64_t b1, int64_t t0, float* y,
                std::vector<__m512>& qacc, std::vector<__m512>& yacc) {
  constexpr int P = 32 / BITS;
  const int64_t K = w.n_in, N = w.n_out, nb = b1 - b0, gs = w.group_size;
  const __m512i maskv = _mm512_set1_epi32((1 << BITS) - 1);
  alignas(64) int32_t div[16], shift[16];
  for (int l = 0; l < 16; ++l) {
    div[l] = l / P;
    shift[l] = (l % P) * BITS;
  }
  const __m512i zdiv = _mm512_load_si512(div), zshift = _mm512_load_si512(shift);
  const __m512 zoff = _mm512_set1_ps(static_cast<float>(w.zero_offset));
  qacc.assign(static_cast<size_t>(TB * nb), _mm512_setzero_ps());
  yacc.assign(static_cast<size_t>(TB * nb), _mm512_setzero_ps());
  const float* xr[TB];
  for (int t = 0; t < TB; ++t) xr[t] = x + (t0 + t) * K;
  for (int64_t k0 = 0; k0 < K; k0 += gs) {
    const int64_t k1 = std::min(K, k0 + gs);
    const int64_t g = w.g_idx[k0] - w.group_offset;
    float sx[TB] = {};
    constexpr int WR = 8 / P;  // word rows per step of 8 input rows (group sizes are multiples of 8)
    for (int64_t r = k0 / P; r < k1 / P; r += WR) {
      __m512 xb[TB][8];
      for (int t = 0; t < TB; ++t)
        for (int kk = 0; kk < 8; ++kk) {
          const float v = xr[t][r * P + kk];
          sx[t] += v;
          xb[t][kk] = _mm512_set1_ps(v);
        }
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t n0 = (b0 + b) * 16;
        const __mmask16 m = lanes_mask(N - n0);
        __m512 qv[8];
        for (int wr = 0; wr < WR; ++wr) {
          const __m512i wv = _mm512_maskz_loadu_epi32(m, w.qweight + (r + wr) * N + n0);
          for (int j = 0; j < P; ++j)
            qv[wr * P + j] = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(wv, BITS * j), maskv));
        }
        for (int t = 0; t < TB; ++t) {
          __m512 a0 = qacc[t * nb + b], a1 = _mm512_setzero_ps();  // two chains of four FMAs
          for (int kk = 0; kk < 8; kk += 2) {
            a0 = _mm512_fmadd_ps(xb[t][kk], qv[kk], a0);
            a1 = _mm512_fmadd_ps(xb[t][kk + 1], qv[kk + 1], a1);
          }
          qacc[t * nb + b] = _mm512_add_ps(a0, a1);
        }
      }
    }
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t n0 = (b0 + b) * 16;
      const __mmask16 m = lanes_mask(N - n0);
      const __m512 s = load_scales(w.scales, w.scales_dtype, g * N + n0, m);
      __m512i zi = _mm512_maskz_loadu_epi32(lanes_mask(std::min<int64_t>(16, N - n0) / P), w.qzeros + g * (N / P) + n0 / P);
      zi = _mm512_and_si512(_mm512_srlv_epi32(_mm512_permutexvar_epi32(zdiv, zi), zshift), maskv);
      const __m512 z = _mm512_add_ps(_mm512_cvtepi32_ps(zi), zoff);
      for (int t = 0; t < TB; ++t) {
        __m512& q = qacc[t * nb + b];
        yacc[t * nb + b] = _mm512_fmadd_ps(s, _mm512_fnmadd_ps(z, _mm512_set1_ps(sx[t]), q), yacc[t * nb + b]);
        q = _mm512_setzero_ps();
      }
    }
  }
  for (int t = 0; t < TB; ++t)
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t n0 = (b0 + b) * 16;
      _mm512_mask_storeu_ps(y + (t0 + t) * N + n0, lanes_mask(N - n0), yacc[t * nb + b]);
    }
}

bool groups_follow_rows(const QuantMatrixView& w) {
  for (int64_t k = 0; k < w.n_in; ++k)
    if (w.g_idx[k] - w.group_offset != k / w.group_size) return false;
  return true;
}

template <int BITS>
void gptq_matmul(const float* x, int64_t n, const QuantMatrixView& w, float* y) {
  const int64_t N = w.n_out, n_blocks = (N + 15) / 16;
  if (groups_follow_rows(w)) {
#pragma omp parallel
    {
      const auto [b0, b1] = thread_share(n_blocks);
      std::vector<__m512> qacc, yacc;
      if (b1 > b0) {
        int64_t t = 0;
        for (; t + 4 <= n; t += 4) gptq_sweep<BITS, 4>(x, w, b0, b1, t, y, qacc, yacc);
        for (; t < n; ++t) gptq_sweep<BITS, 1>(x, w, b0, b1, t, y, qacc, yacc);
      }
    }
    return;
  }
  // Act-order: a row's group is any group; blocks of 16 channels, folded per run of equal groups.
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < n_blocks; ++b) {
    const int64_t n0 = b * 16;
    const __mmask16 m = lanes_mask(N - n0);
    int64_t t = 0;
    for (; t + 4 <= n; t += 4) gptq_block<BITS, 4>(x, w, n0, m, t, y);
    for (; t + 2 <= n; t += 2) gptq_block<BITS, 2>(x, w, n0, m, t, y);
    for (; t < n; ++t) gptq_block<BITS, 1>(x, w, n0, m, t, y);
  }
}

// ---- AWQ: qweight [n_in, n_out / 8], 16 words (128 channels) per vector ----
// Nibble i of word c holds channel 8c + kAwqPackOrder[i], so vector i of the
// eight unpacked from a load holds channels {8(c0 + l) + order[i]}: the
// accumulators stay in that permuted order and are put back at the end.
// Each thread sweeps its word blocks [b0, b1) eight rows at a time (eight
// forward streams through qweight), accumulating in a per-thread scratch of
// TB × blocks × 8 vectors.
constexpr int kOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};

template <int TB>
void awq_sweep(const float* x, const QuantMatrixView& w, int64_t b0, int64_t b1, int64_t t0, float* y,
               std::vector<__m512>& qacc, std::vector<__m512>& yacc) {
  const int64_t K = w.n_in, N = w.n_out, W = N / 8, gs = w.group_size, nb = b1 - b0;
  const __m512i nib = _mm512_set1_epi32(0xf);
  qacc.assign(static_cast<size_t>(TB * nb * 8), _mm512_setzero_ps());
  yacc.assign(static_cast<size_t>(TB * nb * 8), _mm512_setzero_ps());
  alignas(64) float sbuf[128];
  __m512i gidx[8];
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  for (int i = 0; i < 8; ++i)
    gidx[i] = _mm512_add_epi32(_mm512_slli_epi32(lane, 3), _mm512_set1_epi32(kOrder[i]));
  const float* xr[TB];
  for (int t = 0; t < TB; ++t) xr[t] = x + (t0 + t) * K;
  for (int64_t g = 0; g < K / gs; ++g) {
    float sx[TB] = {};
    for (int64_t k0 = g * gs; k0 < (g + 1) * gs; k0 += 8) {  // group sizes are multiples of 8
      __m512 xb[TB][8];
      for (int t = 0; t < TB; ++t)
        for (int kk = 0; kk < 8; ++kk) {
          sx[t] += xr[t][k0 + kk];
          xb[t][kk] = _mm512_set1_ps(xr[t][k0 + kk]);
        }
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t c0 = (b0 + b) * 16;
        const __mmask16 wm = lanes_mask(W - c0);
        __m512i wv[8];
        for (int kk = 0; kk < 8; ++kk) wv[kk] = _mm512_maskz_loadu_epi32(wm, w.qweight + (k0 + kk) * W + c0);
        for (int i = 0; i < 8; ++i) {
          __m512 a0[TB], a1[TB];  // two chains per token
          for (int t = 0; t < TB; ++t) {
            a0[t] = qacc[(t * nb + b) * 8 + i];
            a1[t] = _mm512_setzero_ps();
          }
          for (int kk = 0; kk < 8; ++kk) {
            const __m512 qv = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(wv[kk], 4 * i), nib));
            for (int t = 0; t < TB; ++t) {
              if (kk % 2 == 0) a0[t] = _mm512_fmadd_ps(xb[t][kk], qv, a0[t]);
              else a1[t] = _mm512_fmadd_ps(xb[t][kk], qv, a1[t]);
            }
          }
          for (int t = 0; t < TB; ++t) qacc[(t * nb + b) * 8 + i] = _mm512_add_ps(a0[t], a1[t]);
        }
      }
    }
    // Fold the group: its scales (channel order, then gathered per nibble) and zeros.
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t c0 = (b0 + b) * 16, valid_words = std::min<int64_t>(16, W - c0);
      const __mmask16 wm = lanes_mask(valid_words);
      for (int c = 0; c < 8; ++c) {
        const int64_t have = 8 * valid_words - 16 * c;
        _mm512_store_ps(sbuf + 16 * c,
                        have > 0 ? load_scales(w.scales, w.scales_dtype, g * N + 8 * c0 + 16 * c, lanes_mask(have))
                                 : _mm512_setzero_ps());
      }
      const __m512i zw = _mm512_maskz_loadu_epi32(wm, w.qzeros + g * W + c0);
      for (int i = 0; i < 8; ++i) {
        const __m512 z = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(zw, 4 * i), nib));
        const __m512 s = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), wm, gidx[i], sbuf, 4);
        for (int t = 0; t < TB; ++t) {
          __m512& q = qacc[(t * nb + b) * 8 + i];
          __m512& acc = yacc[(t * nb + b) * 8 + i];
          acc = _mm512_fmadd_ps(s, _mm512_fnmadd_ps(z, _mm512_set1_ps(sx[t]), q), acc);
          q = _mm512_setzero_ps();
        }
      }
    }
  }
  for (int t = 0; t < TB; ++t)
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t c0 = (b0 + b) * 16, valid_words = std::min<int64_t>(16, W - c0);
      alignas(64) float lanes[8][16];
      for (int i = 0; i < 8; ++i) _mm512_store_ps(lanes[i], yacc[(t * nb + b) * 8 + i]);
      float* yr = y + (t0 + t) * N + 8 * c0;
      for (int64_t l = 0; l < valid_words; ++l)
        for (int i = 0; i < 8; ++i) yr[8 * l + kOrder[i]] = lanes[i][l];
    }
}

void awq_matmul(const float* x, int64_t n, const QuantMatrixView& w, float* y) {
  const int64_t n_blocks = (w.n_out / 8 + 15) / 16;
#pragma omp parallel
  {
    const auto [b0, b1] = thread_share(n_blocks);
    std::vector<__m512> qacc, yacc;
    if (b1 > b0) {
      int64_t t = 0;
      for (; t + 2 <= n; t += 2) awq_sweep<2>(x, w, b0, b1, t, y, qacc, yacc);
      for (; t < n; ++t) awq_sweep<1>(x, w, b0, b1, t, y, qacc, yacc);
    }
  }
}

#endif

#ifdef SHARDLM_SIMD
// ---- FP8 E4M3: weight [n_out, n_in] row-major, like a dense matrix ----
// AVX-512 or AVX2 (simd.h's Vec). Bytes widen through f16 to the value × 2^-8
// (simd.h's kFp8F16Rebias: never an f32 subnormal); the block scale carries
// the 2^8 back.
constexpr int64_t kFp8PrefetchBytes = 512;

// y[t, j] for RB weight rows from j0 and TB tokens from t0: each row's bytes
// are widened once per vector and used for TB tokens. One token: per scale
// block along k, the sums are scaled into totals (RB + RB registers). More
// tokens: each widened vector is scaled by its row's block scale first, so
// RB × TB accumulators + RB scales + TB x vectors fit the register file (32
// zmm: the (8, 2) and (4, 4) tiles; 16 ymm: (4, 2)).
// kScaleSums (one token, unless batch-invariant): per-block sums scaled
// into the totals; otherwise (the order every token count shares) each
// widened vector is scaled first.
template <int RB, int TB, bool kScaleSums = TB == 1>
void fp8_tile(const float* x, const QuantMatrixView& w, int64_t j0, int64_t t0, float* y) {
  using namespace simd;
  const int64_t K = w.n_in, N = w.n_out, bk = w.block_k;
  const uint8_t* row[RB];
  for (int r = 0; r < RB; ++r) row[r] = w.weight + (j0 + r) * K;
  Vec tot[RB][TB];
  float tail[RB][TB] = {};
  for (int r = 0; r < RB; ++r)
    for (int t = 0; t < TB; ++t) tot[r][t] = zerov();
  // Scale blocks along k: [kb, ke) is block (kb + col_offset) / bk.
  for (int64_t kb = 0; kb < K;) {
    const int64_t blk = (kb + w.col_offset) / bk;
    const int64_t ke = std::min(K, (blk + 1) * bk - w.col_offset);
    float scale1[RB];
    Vec scale[RB];
    for (int r = 0; r < RB; ++r) {
      const int64_t si = ((j0 + r + w.row_offset) / w.block_n) * w.scale_cols + blk;
      scale1[r] = load_as_f32(w.scales, w.scales_dtype, static_cast<size_t>(si));
      scale[r] = setv(scale1[r] * kFp8F16Rebias);
    }
    Vec block_acc[RB][TB];
    for (int r = 0; r < RB; ++r)
      for (int t = 0; t < TB; ++t) block_acc[r][t] = zerov();
    Vec (&acc)[RB][TB] = kScaleSums ? block_acc : tot;
    int64_t i = kb;
    for (; i + kLanes <= ke; i += kLanes) {
      Vec xv[TB];
      for (int t = 0; t < TB; ++t) xv[t] = loadx(x + (t0 + t) * K + i);
      for (int r = 0; r < RB; ++r) {
        // As in the dense GEMV: the hardware prefetcher stops at 4 KiB pages.
        if (i % 64 == 0) prefetch(row[r] + i + kFp8PrefetchBytes);
        Vec wv = load_fp8_over_256(row[r] + i);
        if constexpr (!kScaleSums) wv = mulv(wv, scale[r]);
        for (int t = 0; t < TB; ++t) acc[r][t] = fmav(wv, xv[t], acc[r][t]);
      }
    }
    for (; i < ke; ++i)  // a block edge or the row's end off the vector width
      for (int r = 0; r < RB; ++r) {
        const float wv = f8e4m3_to_f32(row[r][i]) * scale1[r];
        for (int t = 0; t < TB; ++t) tail[r][t] += wv * x[(t0 + t) * K + i];
      }
    if constexpr (kScaleSums)
      for (int r = 0; r < RB; ++r)
        for (int t = 0; t < TB; ++t) tot[r][t] = fmav(block_acc[r][t], scale[r], tot[r][t]);
    kb = ke;
  }
  for (int t = 0; t < TB; ++t)
    for (int r = 0; r < RB; ++r) y[(t0 + t) * N + j0 + r] = hsum(tot[r][t]) + tail[r][t];
}

template <int RB>
void fp8_rows(const float* x, int64_t n, const QuantMatrixView& w, int64_t j0, float* y) {
  // Several tokens per pass unpack each weight vector once for all of them.
  constexpr int kTB = simd::kLanes == 16 && RB < 8 ? 4 : 2;
  int64_t t = 0;
  for (; t + kTB <= n; t += kTB) fp8_tile<RB, kTB>(x, w, j0, t, y);
  for (; t + 2 <= n; t += 2) fp8_tile<RB, 2>(x, w, j0, t, y);
  const bool invariant = batch_invariant();
  for (; t < n; ++t) {
    if (invariant) fp8_tile<RB, 1, false>(x, w, j0, t, y);
    else fp8_tile<RB, 1>(x, w, j0, t, y);
  }
}

template <int RB>
void fp8_row_blocks(const float* x, int64_t n, const QuantMatrixView& w, float* y) {
  const int64_t N = w.n_out, n_row_blocks = (N + RB - 1) / RB;
  // Dynamic chunks, as the dense GEMV: the two vCPUs run at unequal speed.
#pragma omp parallel for schedule(dynamic, 8)
  for (int64_t rb = 0; rb < n_row_blocks; ++rb) {
    const int64_t j0 = rb * RB;
    if (j0 + RB <= N) {
      fp8_rows<RB>(x, n, w, j0, y);
    } else {
      for (int64_t j = j0; j < N; ++j) fp8_rows<1>(x, n, w, j, y);
    }
  }
}

void fp8_matmul(const float* x, int64_t n, const QuantMatrixView& w, float* y) {
  // Prefill and large batches: the packed f32 GEMM, panels widened and
  // scaled as they are packed (backend/cpu/packed_gemm.h).
  // (Not when batch-invariant: the GEMM sums in another order than the tiles.)
  if (!batch_invariant() && n >= packed_matmul_min_tokens(DType::kF32) && packed_fp8_available(w))
    return packed_matmul_fp8(x, n, w, y);
  // Up to 3 tokens, 8 rows in flight keep more DRAM requests outstanding
  // (as the dense GEMV; AVX2's 16 registers take 4).
  count_kernel("fp8rows/simd", "fp8", n, w.n_out, w.n_in);
  if (n < 4 && simd::kLanes == 16) return fp8_row_blocks<8>(x, n, w, y);
  fp8_row_blocks<4>(x, n, w, y);
}
#endif


void check_view(const QuantMatrixView& w) {
  SHARDLM_CHECK(w.n_out > 0 && w.n_in > 0 && w.scales != nullptr, "quant_matmul: empty ", weight_scheme_name(w.scheme),
                " matrix");
  switch (w.scheme) {
    case WeightScheme::kAwq:
      SHARDLM_CHECK(w.bits == 4 && w.n_out % 8 == 0 && w.group_size > 0 && w.n_in % w.group_size == 0 && w.qweight &&
                        w.qzeros,
                    "quant_matmul: awq ", w.n_out, "x", w.n_in, " group ", w.group_size);
      break;
    case WeightScheme::kGptq:
      SHARDLM_CHECK((w.bits == 4 || w.bits == 8) && w.n_out % (32 / w.bits) == 0 && w.n_in % (32 / w.bits) == 0 &&
                        w.qweight && w.qzeros && w.g_idx,
                    "quant_matmul: gptq ", w.bits, "-bit ", w.n_out, "x", w.n_in);
      break;
    case WeightScheme::kFp8:
      SHARDLM_CHECK(w.weight && w.block_n > 0 && w.block_k > 0, "quant_matmul: fp8 without weight or block");
      break;
    case WeightScheme::kDense: fail(ErrorCode::kInternal, "quant_matmul on a dense matrix");
  }
}

}  // namespace

const char* quant_activations_name(QuantActivations a) { return a == QuantActivations::kInt8 ? "int8" : "f32"; }

namespace {
// -1 until read from the environment (or set); then a QuantActivations.
std::atomic<int> g_quant_activations{-1};
}  // namespace

QuantActivations default_quant_activations() {
  int v = g_quant_activations.load(std::memory_order_relaxed);
  if (v >= 0) return static_cast<QuantActivations>(v);
  QuantActivations from_env = QuantActivations::kInt8;
  if (const char* env = std::getenv("SHARDLM_QUANT_ACTIVATIONS"); env != nullptr && std::strcmp(env, "int8") != 0) {
    if (std::strcmp(env, "f32") != 0)
      fail(ErrorCode::kInvalidArgument, "SHARDLM_QUANT_ACTIVATIONS is '", env,
           "': expected int8 (the default: int8 activations for AWQ/GPTQ) or f32 (the exact dequantize-to-f32 "
           "kernels)");
    from_env = QuantActivations::kF32;
  }
  int expected = -1;
  g_quant_activations.compare_exchange_strong(expected, static_cast<int>(from_env));
  return static_cast<QuantActivations>(g_quant_activations.load(std::memory_order_relaxed));
}

void set_default_quant_activations(QuantActivations activations) {
  g_quant_activations.store(static_cast<int>(activations), std::memory_order_relaxed);
}

bool int8_activations_run(const QuantMatrixView& w) { return int8_activations_apply(w); }

void quant_matmul(const float* x, int64_t n, const QuantMatrixView& w, const VectorView* bias, float* y) {
  quant_matmul(x, n, w, bias, y, default_quant_activations());
}

void quant_matmul(const float* x, int64_t n, const QuantMatrixView& w, const VectorView* bias, float* y,
                  QuantActivations activations) {
  check_view(w);
  if (activations == QuantActivations::kInt8 && int8_activations_apply(w)) {
    int8_activation_matmul(x, n, w, y);
    add_bias(bias, n, w.n_out, y);
    return;
  }
#ifdef SHARDLM_SIMD
  if (w.scheme == WeightScheme::kFp8) {
    fp8_matmul(x, n, w, y);
    add_bias(bias, n, w.n_out, y);
    return;
  }
#endif
  const CpuIsa isa = active_cpu_isa();
#ifdef SHARDLM_QUANT_AVX512
  if (isa >= CpuIsa::kAvx512) {
    count_kernel("quant/avx512", kernel_weights_name(w.scheme, w.bits), n, w.n_out, w.n_in);  // (fp8 returned above)
    switch (w.scheme) {
      case WeightScheme::kAwq: awq_matmul(x, n, w, y); break;
      case WeightScheme::kGptq:
        if (w.bits == 4) gptq_matmul<4>(x, n, w, y);
        else gptq_matmul<8>(x, n, w, y);
        break;
      case WeightScheme::kFp8:
      case WeightScheme::kDense: break;
    }
    add_bias(bias, n, w.n_out, y);
    return;
  }
#endif
  // (FP8 reaches here only in a build without SIMD kernels: the reference.)
  if (isa >= CpuIsa::kAvx2 && w.scheme != WeightScheme::kFp8) {
    count_kernel("quant/avx2", kernel_weights_name(w.scheme, w.bits), n, w.n_out, w.n_in);
    quant_avx2::quant_matmul(x, n, w, y);
    add_bias(bias, n, w.n_out, y);
    return;
  }
  count_kernel(w.scheme == WeightScheme::kFp8 ? "fp8rows/scalar" : "quant/scalar", kernel_weights_name(w.scheme, w.bits),
               n, w.n_out, w.n_in);
  ref::quant_matmul(x, n, w, bias, y);  // a CPU without AVX2: the scalar kernels
}

}  // namespace shardlm::backend
