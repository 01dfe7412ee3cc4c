// AWQ and GPTQ (4 and 8 bits) matmuls on int8 activations with AVX-512 VNNI,
// as llama.cpp runs Q4_0 × Q8_0: each token's x is quantized once per call to
// int8 in blocks of kActBlock (32) inputs, d_b = max|x| / 127 over the block,
// x̂ = d_b × round(x / d_b), and the weights' 4-bit or 8-bit fields (unsigned)
// are multiplied by it with vpdpbusd, 64 products per instruction, without
// ever becoming floats. Per block the integer sums are scaled by d_b; per
// weight group by the group's scale and zero:
//   y[t, n] = Σ_g s[g, n] × (Σ_{b in g} d_b × Σ_{k in b} q̂[t, k] × q[k, n] − z[g, n] × Σ_{k in g} x̂[t, k])
// which is exactly W_dequantized · x̂: the only change from the f32 kernels is
// x → x̂ (a relative error of at most 1/254 of each block's max|x| per input).
// GPTQ act-order (any group per row) stays on the f32 kernels. Batched calls
// (prefill, several sequences) reuse each unpacked weight vector for up to 4
// tokens in registers (GPTQ), or for 4 or 8 tokens from a 4 KiB L1 tile (AWQ,
// whose unpacking includes a byte transpose).
#include "backend/cpu/quant_ops_int8.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "core/cpu_isa.h"
#include "backend/cpu/kernel_report.h"
#include "backend/cpu/quant_simd.h"
#include "core/error.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#define SHARDLM_QUANT_VNNI 1
#endif

namespace shardlm::backend {

bool int8_activation_kernels_built() {
#ifdef SHARDLM_QUANT_VNNI
  return true;
#else
  return false;
#endif
}

bool int8_activations_apply(const QuantMatrixView& w) {
  if (!int8_activation_kernels_built() || active_cpu_isa() < CpuIsa::kAvx512) return false;  // SHARDLM_ISA=avx2 caps it
  if (w.scheme != WeightScheme::kAwq && w.scheme != WeightScheme::kGptq) return false;
  if (w.group_size <= 0 || w.n_in % kActBlock != 0 || w.group_size % kActBlock != 0) return false;
  if (w.scheme == WeightScheme::kGptq) {  // groups must follow the rows (no act-order)
    for (int64_t k = 0; k < w.n_in; ++k)
      if (w.g_idx[k] - w.group_offset != k / w.group_size) return false;
  }
  return true;
}

#ifdef SHARDLM_QUANT_VNNI

namespace {

using quant_simd::lanes_mask;
using quant_simd::load_scales;

inline std::pair<int64_t, int64_t> thread_share(int64_t n_units) {
  const int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
  return {n_units * t / n, n_units * (t + 1) / n};
}

// x[n, K] quantized once per call (the calling thread's scratch, reused).
struct QuantizedActivations {
  std::vector<int32_t> q;    // [n, K] int8, four to a word (the operands vpdpbusd broadcasts);
                             // gptq 4-bit: each run of 8 as (0 2 4 6 1 3 5 7), the nibbles' order
  std::vector<float> d;      // [n, K / kActBlock]
  std::vector<float> gsum;   // [n, G]: Σ x̂ over each weight group
  int64_t K = 0, G = 0;
};

void quantize_activations(const float* x, int64_t n, int64_t K, int64_t group_size, bool nibble_order,
                          QuantizedActivations& a) {
  const int64_t nb = K / kActBlock, G = K / group_size, per_group = group_size / kActBlock;
  a.K = K;
  a.G = G;
  a.q.resize(static_cast<size_t>(n * K / 4));
  a.d.resize(static_cast<size_t>(n * nb));
  a.gsum.assign(static_cast<size_t>(n * G), 0.0f);
  const __m512 sign = _mm512_set1_ps(-0.0f);
  const __m128i order = _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* xs = x + t * K + b * kActBlock;
      const __m512 v0 = _mm512_loadu_ps(xs), v1 = _mm512_loadu_ps(xs + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_andnot_ps(sign, v0), _mm512_andnot_ps(sign, v1)));
      const float d = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, _mm512_set1_ps(inv)));
      const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, _mm512_set1_ps(inv)));
      __m128i b0 = _mm512_cvtsepi32_epi8(q0), b1 = _mm512_cvtsepi32_epi8(q1);
      if (nibble_order) {
        b0 = _mm_shuffle_epi8(b0, order);
        b1 = _mm_shuffle_epi8(b1, order);
      }
      int32_t* qs = a.q.data() + (t * K + b * kActBlock) / 4;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qs), b0);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + 4), b1);
      a.d[static_cast<size_t>(t * nb + b)] = d;
      a.gsum[static_cast<size_t>(t * G + b / per_group)] +=
          d * static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1)));
    }
  }
}

// ---- GPTQ (groups follow rows): qweight [K / P, N], 16 channels per vector ----
// A 4-bit word holds inputs 8r..8r+7 of one channel: its low nibbles (mask
// 0x0f0f0f0f) are inputs 8r + {0, 2, 4, 6} as four bytes, its high nibbles
// 8r + {1, 3, 5, 7}: the order the activations were stored in. An 8-bit word
// holds inputs 4r..4r+3 as bytes, in order. Each thread sweeps its channel
// blocks [b0, b1) one activation block (32 rows) at a time; the per-block
// float sums and the per-group totals live in a per-thread scratch.
// Where each sweep step prefetches (AWQ and GPTQ alike). A thread reads its
// channel span of an activation block's rows (32 inputs: 32 AWQ rows, RW
// GPTQ word rows) as that many short interleaved streams, more than the
// hardware prefetchers follow well.
//  - Spans that fit (the rows' spans together within kNextBlockBytes): the
//    line this thread reads at the same channels in the next activation
//    block, into L2, a whole pass over the span ahead. Four word blocks ahead
//    in the same rows would lie past the span of a 0.5B model's short rows
//    (q/o_proj: 56 AWQ words a thread) in the other thread's half, leaving
//    each block's first loads waiting on DRAM.
//  - Longer spans (a quantized lm_head: 75,968 channels a thread): the next
//    block's region would not stay in L2 until it is read, so the same rows
//    kAheadWords ahead, into L1.
// 0.5B decode, batch 1, 2 threads (Intel Xeon with AMX), against the old
// four-blocks-ahead prefetch everywhere: AWQ 42.3–43.4 → 47.8–48.0 tok/s,
// GPTQ-int8 35.1–36.2 → 36.2–36.8, GPTQ-int8 with its lm_head quantized
// 43.3–44.5 → 45.7–46.1 (with the next block for the lm_head too: 41); the
// 7B layer's Linears (quant_matmul_bench) within ±4% or faster. A prefetch
// past the matrix never faults.
constexpr int64_t kNextBlockBytes = 256 << 10;
constexpr int64_t kAheadWords = 64;

// Activation block xb of tokens t0 .. t0 + TB: its int8 words (4 inputs
// each), its scale d, and d / 16 for accumulators of in-place high nibbles.
template <int TB>
inline void block_operands(const QuantizedActivations& a, int64_t K, int64_t nxb, int64_t t0, int64_t xb,
                           const int32_t* xw[TB], __m512 dv[TB], __m512 dv16[TB]) {
  for (int t = 0; t < TB; ++t) {
    xw[t] = a.q.data() + ((t0 + t) * K + xb * kActBlock) / 4;
    dv[t] = _mm512_set1_ps(a.d[static_cast<size_t>((t0 + t) * nxb + xb)]);
    dv16[t] = _mm512_mul_ps(dv[t], _mm512_set1_ps(1.0f / 16.0f));
  }
}

template <int BITS, int TB>
void gptq_sweep(const QuantizedActivations& a, const QuantMatrixView& w, int64_t b0, int64_t b1, int64_t t0,
                float* y, std::vector<__m512>& facc, std::vector<__m512>& yacc) {
  constexpr int P = 32 / BITS;
  constexpr int RW = kActBlock / P;  // word rows per activation block
  const int64_t K = w.n_in, N = w.n_out, nb = b1 - b0, gs = w.group_size, nxb = K / kActBlock;
  const __m512i nib = _mm512_set1_epi32(0x0f0f0f0f), nib_hi = _mm512_set1_epi32(static_cast<int>(0xf0f0f0f0u));
  const __m512i maskv = _mm512_set1_epi32((1 << BITS) - 1);
  alignas(64) int32_t div[16], shift[16];
  for (int l = 0; l < 16; ++l) {
    div[l] = l / P;
    shift[l] = (l % P) * BITS;
  }
  const __m512i zdiv = _mm512_load_si512(div), zshift = _mm512_load_si512(shift);
  const __m512 zoff = _mm512_set1_ps(static_cast<float>(w.zero_offset));
  const bool next_block = RW * nb * 64 <= kNextBlockBytes;  // see kNextBlockBytes
  facc.assign(static_cast<size_t>(TB * nb), _mm512_setzero_ps());
  yacc.assign(static_cast<size_t>(TB * nb), _mm512_setzero_ps());
  for (int64_t g = 0; g < a.G; ++g) {
    for (int64_t xb = g * gs / kActBlock; xb < (g + 1) * gs / kActBlock; ++xb) {
      const int32_t* xw[TB];
      __m512 dv[TB], dv16[TB];  // the block's d; d / 16 for the in-place high nibbles
      block_operands<TB>(a, K, nxb, t0, xb, xw, dv, dv16);
      const int32_t* rows = w.qweight + xb * RW * N;
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t n0 = (b0 + b) * 16;
        const __mmask16 m = lanes_mask(N - n0);
        __m512i acc0[TB], acc1[TB];
        for (int t = 0; t < TB; ++t) acc0[t] = acc1[t] = _mm512_setzero_si512();
        for (int r = 0; r < RW; ++r) {
          if (next_block) _mm_prefetch(reinterpret_cast<const char*>(rows + (RW + r) * N + n0), _MM_HINT_T1);
          else _mm_prefetch(reinterpret_cast<const char*>(rows + r * N + n0 + kAheadWords), _MM_HINT_T0);
          const __m512i wv = _mm512_maskz_loadu_epi32(m, rows + r * N + n0);
          if constexpr (BITS == 8) {
            for (int t = 0; t < TB; ++t) {
              if (r % 2 == 0) acc0[t] = _mm512_dpbusd_epi32(acc0[t], wv, _mm512_set1_epi32(xw[t][r]));
              else acc1[t] = _mm512_dpbusd_epi32(acc1[t], wv, _mm512_set1_epi32(xw[t][r]));
            }
          } else {
            // The high nibbles stay in place (16 x their value, one op instead of
            // two); acc1 is scaled by 1/16 with the block's d (exact).
            const __m512i lo = _mm512_and_si512(wv, nib), hi16 = _mm512_and_si512(wv, nib_hi);
            for (int t = 0; t < TB; ++t) {
              acc0[t] = _mm512_dpbusd_epi32(acc0[t], lo, _mm512_set1_epi32(xw[t][2 * r]));
              acc1[t] = _mm512_dpbusd_epi32(acc1[t], hi16, _mm512_set1_epi32(xw[t][2 * r + 1]));
            }
          }
        }
        for (int t = 0; t < TB; ++t) {
          __m512& f = facc[static_cast<size_t>(t * nb + b)];
          if constexpr (BITS == 8) {
            f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(acc0[t], acc1[t])), dv[t], f);
          } else {
            f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc0[t]), dv[t], f);
            f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc1[t]), dv16[t], f);
          }
        }
      }
    }
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t n0 = (b0 + b) * 16;
      const __mmask16 m = lanes_mask(N - n0);
      const __m512 s = load_scales(w.scales, w.scales_dtype, g * N + n0, m);
      __m512i zi =
          _mm512_maskz_loadu_epi32(lanes_mask(std::min<int64_t>(16, N - n0) / P), w.qzeros + g * (N / P) + n0 / P);
      zi = _mm512_and_si512(_mm512_srlv_epi32(_mm512_permutexvar_epi32(zdiv, zi), zshift), maskv);
      const __m512 z = _mm512_add_ps(_mm512_cvtepi32_ps(zi), zoff);
      for (int t = 0; t < TB; ++t) {
        __m512& f = facc[static_cast<size_t>(t * nb + b)];
        __m512& acc = yacc[static_cast<size_t>(t * nb + b)];
        acc = _mm512_fmadd_ps(s, _mm512_fnmadd_ps(z, _mm512_set1_ps(a.gsum[static_cast<size_t>((t0 + t) * a.G + g)]), f),
                              acc);
        f = _mm512_setzero_ps();
      }
    }
  }
  for (int t = 0; t < TB; ++t)
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t n0 = (b0 + b) * 16;
      _mm512_mask_storeu_ps(y + (t0 + t) * N + n0, lanes_mask(N - n0), yacc[static_cast<size_t>(t * nb + b)]);
    }
}

// ---- AWQ: qweight [K, N / 8], 16 words (128 channels) per vector ----
// Nibble i of word c holds channel 8c + kOrder[i] of one input row. Four
// rows' vectors are transposed bytewise (unpack epi8, then epi16), so that
// dword 4L + j' of u_j holds byte j' of word 4L + j (L: the 128-bit lane)
// from rows k..k+3: its low nibbles are channel 8(4L + j) + kOrder[2j'] at
// four consecutive inputs, the high nibbles channel 8(4L + j) + kOrder[2j' + 1].
// Accumulator 2j + h keeps that lane order; scales and zeros are brought to
// it at each group's fold, and the outputs put back in channel order at the end.
constexpr int kOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};

// Four rows' lines at p (W words apart): into L2 the next activation
// block's, into L1 the same rows' further along (kNextBlockBytes says which).
// Always inlined: GCC left this two-way version a call, and AWQ decode lost
// a fifth of its speed.
__attribute__((always_inline)) inline void prefetch_rows(const int32_t* p, int64_t W, bool next_block) {
  if (next_block) {
    for (int i = 0; i < 4; ++i) _mm_prefetch(reinterpret_cast<const char*>(p + kActBlock * W + i * W), _MM_HINT_T1);
  } else {
    for (int i = 0; i < 4; ++i) _mm_prefetch(reinterpret_cast<const char*>(p + kAheadWords + i * W), _MM_HINT_T0);
  }
}

template <int TB>
void awq_sweep(const QuantizedActivations& a, const QuantMatrixView& w, int64_t b0, int64_t b1, int64_t t0, float* y,
               std::vector<__m512>& facc, std::vector<__m512>& yacc) {
  const int64_t K = w.n_in, N = w.n_out, W = N / 8, gs = w.group_size, nb = b1 - b0, nxb = K / kActBlock;
  const __m512i nib = _mm512_set1_epi32(0x0f0f0f0f), nib_hi = _mm512_set1_epi32(static_cast<int>(0xf0f0f0f0u));
  const __m512i nib1 = _mm512_set1_epi32(0xf);
  const bool next_block = kActBlock * nb * 64 <= kNextBlockBytes;  // see kNextBlockBytes
  facc.assign(static_cast<size_t>(TB * nb * 8), _mm512_setzero_ps());
  yacc.assign(static_cast<size_t>(TB * nb * 8), _mm512_setzero_ps());
  // Lane l = 4L + j' of accumulator i = 2j + h: channel 32L + 8j + kOrder[2j' + h] of the block
  // (the scales' gather index), word 4L + j (the zeros' permute), nibble 2j' + h (their shift).
  alignas(64) int32_t sidx[8][16], zword[4][16], zshift[2][16];
  for (int l = 0; l < 16; ++l) {
    const int L = l / 4, jp = l % 4;
    for (int j = 0; j < 4; ++j) {
      zword[j][l] = 4 * L + j;
      for (int h = 0; h < 2; ++h) sidx[2 * j + h][l] = 32 * L + 8 * j + kOrder[2 * jp + h];
    }
    for (int h = 0; h < 2; ++h) zshift[h][l] = 4 * (2 * jp + h);
  }
  alignas(64) float sbuf[128];
  for (int64_t g = 0; g < K / gs; ++g) {
    for (int64_t xb = g * gs / kActBlock; xb < (g + 1) * gs / kActBlock; ++xb) {
      const int32_t* xw[TB];
      __m512 dv[TB], dv16[TB];  // the block's d; d / 16 for the in-place high nibbles
      block_operands<TB>(a, K, nxb, t0, xb, xw, dv, dv16);
      const int32_t* rows = w.qweight + xb * kActBlock * W;
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t c0 = (b0 + b) * 16;
        const __mmask16 wm = lanes_mask(W - c0);
        if constexpr (TB > 2) {
          // Unpacked once into a 4 KiB tile (L1) that all TB tokens read:
          // tile[quad][i] is accumulator i's operand for rows 4 quad .. 4 quad + 3.
          __m512i tile[kActBlock / 4][8];
          for (int r = 0; r < kActBlock; r += 4) {
            const int32_t* p = rows + r * W + c0;
            prefetch_rows(p, W, next_block);
            const __m512i A = _mm512_maskz_loadu_epi32(wm, p), B = _mm512_maskz_loadu_epi32(wm, p + W);
            const __m512i C = _mm512_maskz_loadu_epi32(wm, p + 2 * W), D = _mm512_maskz_loadu_epi32(wm, p + 3 * W);
            const __m512i ab0 = _mm512_unpacklo_epi8(A, B), ab1 = _mm512_unpackhi_epi8(A, B);
            const __m512i cd0 = _mm512_unpacklo_epi8(C, D), cd1 = _mm512_unpackhi_epi8(C, D);
            const __m512i u[4] = {_mm512_unpacklo_epi16(ab0, cd0), _mm512_unpackhi_epi16(ab0, cd0),
                                  _mm512_unpacklo_epi16(ab1, cd1), _mm512_unpackhi_epi16(ab1, cd1)};
            for (int j = 0; j < 4; ++j) {
              tile[r / 4][2 * j] = _mm512_and_si512(u[j], nib);
              tile[r / 4][2 * j + 1] = _mm512_and_si512(u[j], nib_hi);  // 16 x the high nibble
            }
          }
          for (int t = 0; t < TB; ++t) {
            __m512i acc[8];
            for (int i = 0; i < 8; ++i) acc[i] = _mm512_setzero_si512();
            for (int qd = 0; qd < kActBlock / 4; ++qd) {
              const __m512i xv = _mm512_set1_epi32(xw[t][qd]);
              for (int i = 0; i < 8; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], tile[qd][i], xv);
            }
            for (int i = 0; i < 8; ++i) {
              __m512& f = facc[static_cast<size_t>((t * nb + b) * 8 + i)];
              f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[i]), i % 2 ? dv16[t] : dv[t], f);
            }
          }
        } else {
          __m512i acc[TB][8];
          for (int t = 0; t < TB; ++t)
            for (int i = 0; i < 8; ++i) acc[t][i] = _mm512_setzero_si512();
          for (int r = 0; r < kActBlock; r += 4) {
            const int32_t* p = rows + r * W + c0;
            prefetch_rows(p, W, next_block);
            const __m512i A = _mm512_maskz_loadu_epi32(wm, p), B = _mm512_maskz_loadu_epi32(wm, p + W);
            const __m512i C = _mm512_maskz_loadu_epi32(wm, p + 2 * W), D = _mm512_maskz_loadu_epi32(wm, p + 3 * W);
            const __m512i ab0 = _mm512_unpacklo_epi8(A, B), ab1 = _mm512_unpackhi_epi8(A, B);
            const __m512i cd0 = _mm512_unpacklo_epi8(C, D), cd1 = _mm512_unpackhi_epi8(C, D);
            const __m512i u[4] = {_mm512_unpacklo_epi16(ab0, cd0), _mm512_unpackhi_epi16(ab0, cd0),
                                  _mm512_unpacklo_epi16(ab1, cd1), _mm512_unpackhi_epi16(ab1, cd1)};
            __m512i xv[TB];
            for (int t = 0; t < TB; ++t) xv[t] = _mm512_set1_epi32(xw[t][r / 4]);
            for (int j = 0; j < 4; ++j) {
              const __m512i lo = _mm512_and_si512(u[j], nib), hi = _mm512_and_si512(u[j], nib_hi);  // hi: 16 x
              for (int t = 0; t < TB; ++t) {
                acc[t][2 * j] = _mm512_dpbusd_epi32(acc[t][2 * j], lo, xv[t]);
                acc[t][2 * j + 1] = _mm512_dpbusd_epi32(acc[t][2 * j + 1], hi, xv[t]);
              }
            }
          }
          for (int t = 0; t < TB; ++t)
            for (int i = 0; i < 8; ++i) {
              __m512& f = facc[static_cast<size_t>((t * nb + b) * 8 + i)];
              f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[t][i]), i % 2 ? dv16[t] : dv[t], f);
            }
        }
      }
    }
    // Fold the group: scales (channel order, gathered per accumulator) and zeros.
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t c0 = (b0 + b) * 16, valid_words = std::min<int64_t>(16, W - c0);
      for (int c = 0; c < 8; ++c) {
        const int64_t have = 8 * valid_words - 16 * c;
        _mm512_store_ps(sbuf + 16 * c,
                        have > 0 ? load_scales(w.scales, w.scales_dtype, g * N + 8 * c0 + 16 * c, lanes_mask(have))
                                 : _mm512_setzero_ps());
      }
      const __m512i zw = _mm512_maskz_loadu_epi32(lanes_mask(valid_words), w.qzeros + g * W + c0);
      for (int i = 0; i < 8; ++i) {
        const int j = i / 2, h = i % 2;
        const __m512i zi = _mm512_and_si512(
            _mm512_srlv_epi32(_mm512_permutexvar_epi32(_mm512_load_si512(zword[j]), zw), _mm512_load_si512(zshift[h])),
            nib1);
        const __m512 z = _mm512_cvtepi32_ps(zi);
        const __m512 s = _mm512_i32gather_ps(_mm512_load_si512(sidx[i]), sbuf, 4);
        for (int t = 0; t < TB; ++t) {
          __m512& f = facc[static_cast<size_t>((t * nb + b) * 8 + i)];
          __m512& acc = yacc[static_cast<size_t>((t * nb + b) * 8 + i)];
          acc = _mm512_fmadd_ps(s, _mm512_fnmadd_ps(z, _mm512_set1_ps(a.gsum[static_cast<size_t>((t0 + t) * a.G + g)]), f),
                                acc);
          f = _mm512_setzero_ps();
        }
      }
    }
  }
  for (int t = 0; t < TB; ++t)
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t c0 = (b0 + b) * 16, valid_words = std::min<int64_t>(16, W - c0);
      alignas(64) float lanes[8][16];
      for (int i = 0; i < 8; ++i) _mm512_store_ps(lanes[i], yacc[static_cast<size_t>((t * nb + b) * 8 + i)]);
      float* yr = y + (t0 + t) * N + 8 * c0;
      for (int l = 0; l < 16; ++l) {
        const int L = l / 4, jp = l % 4;
        for (int j = 0; j < 4; ++j) {
          const int64_t word = 4 * L + j;
          if (word >= valid_words) continue;
          for (int h = 0; h < 2; ++h) yr[8 * word + kOrder[2 * jp + h]] = lanes[2 * j + h][l];
        }
      }
    }
}

}  // namespace

void int8_activation_matmul(const float* x, int64_t n, const QuantMatrixView& w, float* y) {
  SHARDLM_CHECK(int8_activations_apply(w), "int8_activation_matmul: ", weight_scheme_name(w.scheme), " ", w.bits,
                "-bit ", w.n_out, "x", w.n_in, " group ", w.group_size, " has no int8-activation kernel");
  // The calling thread's scratch; the OpenMP workers reach it through `a`
  // (a thread_local named inside the region would be each worker's own).
  count_kernel("int8/vnni", kernel_weights_name(w.scheme, w.bits), n, w.n_out, w.n_in);
  thread_local QuantizedActivations scratch;
  QuantizedActivations& a = scratch;
  const bool awq = w.scheme == WeightScheme::kAwq;
  quantize_activations(x, n, w.n_in, w.group_size, !awq && w.bits == 4, a);
  const int64_t n_blocks = awq ? (w.n_out / 8 + 15) / 16 : (w.n_out + 15) / 16;
#pragma omp parallel
  {
    const auto [b0, b1] = thread_share(n_blocks);
    thread_local std::vector<__m512> facc, yacc;  // each worker's own, kept between calls (no allocation per step)
    if (b1 > b0) {
      int64_t t = 0;
      if (awq) {
        for (; t + 8 <= n; t += 8) awq_sweep<8>(a, w, b0, b1, t, y, facc, yacc);
        for (; t + 4 <= n; t += 4) awq_sweep<4>(a, w, b0, b1, t, y, facc, yacc);
        for (; t + 2 <= n; t += 2) awq_sweep<2>(a, w, b0, b1, t, y, facc, yacc);
        for (; t < n; ++t) awq_sweep<1>(a, w, b0, b1, t, y, facc, yacc);
      } else if (w.bits == 4) {
        for (; t + 4 <= n; t += 4) gptq_sweep<4, 4>(a, w, b0, b1, t, y, facc, yacc);
        for (; t < n; ++t) gptq_sweep<4, 1>(a, w, b0, b1, t, y, facc, yacc);
      } else {
        for (; t + 4 <= n; t += 4) gptq_sweep<8, 4>(a, w, b0, b1, t, y, facc, yacc);
        for (; t < n; ++t) gptq_sweep<8, 1>(a, w, b0, b1, t, y, facc, yacc);
      }
    }
  }
}

#else

void int8_activation_matmul(const float*, int64_t, const QuantMatrixView& w, float*) {
  fail(ErrorCode::kInternal, "int8_activation_matmul: this build has no AVX-512 VNNI kernels (",
       weight_scheme_name(w.scheme), ")");
}

#endif

}  // namespace shardlm::backend
