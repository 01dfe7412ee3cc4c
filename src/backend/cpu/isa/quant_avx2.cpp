// backend/cpu/quant_ops_isa.h's AVX2 kernels (flags: src/backend/CMakeLists.txt):
// AWQ and GPTQ with f32 activations, 8 output channels per ymm vector,
// dequantized in registers (never into memory), threaded over output
// channels with OpenMP. Per group the kernels accumulate Σ x·q and Σ x and
// apply the group's scale and zero once: y += s × (Σ x·q − z × Σ x).
#include <immintrin.h>
#include <omp.h>

// std::vector<__m256> drops the vector type's attributes from the template
// argument (GCC warns), not its 32-byte alignment: C++17's aligned new keeps it.
#pragma GCC diagnostic ignored "-Wignored-attributes"

#include <algorithm>
#include <utility>
#include <vector>

#include "backend/cpu/quant_ops_isa.h"
#include "core/dtype.h"
#include "core/error.h"

namespace shardlm::backend::quant_avx2 {

namespace {

// The lowest `valid` of 8 lanes set (maskload/maskstore masks).
inline __m256i lanes_mask(int64_t valid) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::min<int64_t>(valid, 8))), lane);
}

// 8 scales from `index` of a row of F16, BF16 or F32 (lanes from `valid` on are 0).
inline __m256 load_scales(const void* base, DType dtype, int64_t index, int64_t valid) {
  if (valid >= 8) {
    switch (dtype) {
      case DType::kF16:
        return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + index)));
      case DType::kBF16:
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + index))),
            16));
      default: return _mm256_loadu_ps(static_cast<const float*>(base) + index);
    }
  }
  alignas(32) float lanes[8] = {};
  for (int64_t l = 0; l < valid; ++l) lanes[l] = load_as_f32(base, dtype, static_cast<size_t>(index + l));
  return _mm256_load_ps(lanes);
}

// The share of `n_units` a thread takes: contiguous, so that each thread
// streams whole runs of every packed row.
inline std::pair<int64_t, int64_t> thread_share(int64_t n_units) {
  const int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
  return {n_units * t / n, n_units * (t + 1) / n};
}

// ---- GPTQ: qweight [n_in / P, n_out], P = 32 / BITS rows per word ----

// The 8 zero points (stored + zero_offset) of channels [n0, n0 + valid) in group g.
template <int BITS>
__m256 gptq_zeros(const QuantMatrixView& w, int64_t g, int64_t n0, int64_t valid) {
  constexpr int P = 32 / BITS;
  alignas(32) float z[8] = {};
  const int32_t* row = w.qzeros + g * (w.n_out / P);
  for (int64_t l = 0; l < valid; ++l) {
    const int64_t n = n0 + l;
    const uint32_t word = static_cast<uint32_t>(row[n / P]);
    z[l] = static_cast<float>((word >> ((n % P) * BITS)) & ((1u << BITS) - 1u)) + static_cast<float>(w.zero_offset);
  }
  return _mm256_load_ps(z);
}

// Groups follow the rows and each group is whole words (group_size % P == 0):
// the thread sweeps its channel blocks [b0, b1) word row by word row, one
// forward stream through qweight, keeping TB × blocks partial sums in a
// per-thread scratch (L1/L2). A word row's P rows are summed in registers.
template <int BITS, int TB>
void gptq_sweep(const float* x, const QuantMatrixView& w, int64_t b0, int64_t b1, int64_t t0, float* y,
                std::vector<__m256>& qacc, std::vector<__m256>& yacc) {
  constexpr int P = 32 / BITS;
  const int64_t K = w.n_in, N = w.n_out, gs = w.group_size, nb = b1 - b0;
  const __m256i fieldmask = _mm256_set1_epi32((1 << BITS) - 1);
  qacc.assign(static_cast<size_t>(TB * nb), _mm256_setzero_ps());
  yacc.assign(static_cast<size_t>(TB * nb), _mm256_setzero_ps());
  const float* xr[TB];
  for (int t = 0; t < TB; ++t) xr[t] = x + (t0 + t) * K;
  for (int64_t g = 0; g < K / gs; ++g) {
    float sx[TB] = {};
    for (int64_t r = g * gs / P; r < (g + 1) * gs / P; ++r) {
      for (int t = 0; t < TB; ++t)
        for (int i = 0; i < P; ++i) sx[t] += xr[t][r * P + i];
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t n0 = (b0 + b) * 8;
        const int32_t* src = w.qweight + r * N + n0;
        const __m256i wv = N - n0 >= 8 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src))
                                       : _mm256_maskload_epi32(src, lanes_mask(N - n0));
        __m256 a[TB];
        for (int t = 0; t < TB; ++t) a[t] = qacc[t * nb + b];
        for (int i = 0; i < P; ++i) {
          const __m256 q = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(wv, i * BITS), fieldmask));
          for (int t = 0; t < TB; ++t) a[t] = _mm256_fmadd_ps(_mm256_set1_ps(xr[t][r * P + i]), q, a[t]);
        }
        for (int t = 0; t < TB; ++t) qacc[t * nb + b] = a[t];
      }
    }
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t n0 = (b0 + b) * 8, valid = std::min<int64_t>(8, N - n0);
      const __m256 s = load_scales(w.scales, w.scales_dtype, g * N + n0, valid);
      const __m256 z = gptq_zeros<BITS>(w, g, n0, valid);
      for (int t = 0; t < TB; ++t) {
        __m256& q = qacc[t * nb + b];
        yacc[t * nb + b] = _mm256_fmadd_ps(s, _mm256_fnmadd_ps(z, _mm256_set1_ps(sx[t]), q), yacc[t * nb + b]);
        q = _mm256_setzero_ps();
      }
    }
  }
  for (int t = 0; t < TB; ++t)
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t n0 = (b0 + b) * 8;
      _mm256_maskstore_ps(y + (t0 + t) * N + n0, lanes_mask(N - n0), yacc[t * nb + b]);
    }
}

// Any row's group (act-order, or groups that split a word): one block of 8
// channels from n0, rows in order; whenever a row's group differs from the
// previous row's, the finished run is folded in with its scale and zero.
template <int BITS, int TB>
void gptq_block(const float* x, const QuantMatrixView& w, int64_t n0, int64_t t0, float* y) {
  constexpr int P = 32 / BITS;
  const int64_t K = w.n_in, N = w.n_out, valid = std::min<int64_t>(8, N - n0);
  const __m256i fieldmask = _mm256_set1_epi32((1 << BITS) - 1), m = lanes_mask(valid);
  const float* xr[TB];
  __m256 qacc[TB], yacc[TB];
  float sx[TB];
  for (int t = 0; t < TB; ++t) {
    xr[t] = x + (t0 + t) * K;
    qacc[t] = yacc[t] = _mm256_setzero_ps();
    sx[t] = 0.0f;
  }
  auto flush = [&](int64_t g) {
    const __m256 s = load_scales(w.scales, w.scales_dtype, g * N + n0, valid);
    const __m256 z = gptq_zeros<BITS>(w, g, n0, valid);
    for (int t = 0; t < TB; ++t) {
      yacc[t] = _mm256_fmadd_ps(s, _mm256_fnmadd_ps(z, _mm256_set1_ps(sx[t]), qacc[t]), yacc[t]);
      qacc[t] = _mm256_setzero_ps();
      sx[t] = 0.0f;
    }
  };
  int64_t cur = -1;
  for (int64_t r = 0; r < K / P; ++r) {
    const __m256i wv = _mm256_maskload_epi32(w.qweight + r * N + n0, m);
    for (int i = 0; i < P; ++i) {
      const int64_t k = r * P + i, g = w.g_idx[k] - w.group_offset;
      if (g != cur) {
        if (cur >= 0) flush(cur);
        cur = g;
      }
      const __m256 q = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(wv, i * BITS), fieldmask));
      for (int t = 0; t < TB; ++t) {
        qacc[t] = _mm256_fmadd_ps(_mm256_set1_ps(xr[t][k]), q, qacc[t]);
        sx[t] += xr[t][k];
      }
    }
  }
  if (cur >= 0) flush(cur);
  for (int t = 0; t < TB; ++t) _mm256_maskstore_ps(y + (t0 + t) * N + n0, m, yacc[t]);
}

template <int BITS>
bool gptq_groups_are_word_runs(const QuantMatrixView& w) {
  constexpr int P = 32 / BITS;
  if (w.group_size <= 0 || w.group_size % P != 0 || w.n_in % w.group_size != 0) return false;
  for (int64_t k = 0; k < w.n_in; ++k)
    if (w.g_idx[k] - w.group_offset != k / w.group_size) return false;
  return true;
}

template <int BITS>
void gptq_matmul(const float* x, int64_t n, const QuantMatrixView& w, float* y) {
  const int64_t n_blocks = (w.n_out + 7) / 8;
  if (gptq_groups_are_word_runs<BITS>(w)) {
#pragma omp parallel
    {
      const auto [b0, b1] = thread_share(n_blocks);
      thread_local std::vector<__m256> qacc, yacc;  // each worker's own, kept between calls
      if (b1 > b0) {
        int64_t t = 0;
        for (; t + 4 <= n; t += 4) gptq_sweep<BITS, 4>(x, w, b0, b1, t, y, qacc, yacc);
        for (; t < n; ++t) gptq_sweep<BITS, 1>(x, w, b0, b1, t, y, qacc, yacc);
      }
    }
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < n_blocks; ++b) {
    int64_t t = 0;
    for (; t + 4 <= n; t += 4) gptq_block<BITS, 4>(x, w, b * 8, t, y);
    for (; t < n; ++t) gptq_block<BITS, 1>(x, w, b * 8, t, y);
  }
}

// ---- AWQ: qweight [n_in, n_out / 8], one word = 8 channels of one row ----
// Nibble i of word c holds channel 8c + kAwqPackOrder[i] (0, 2, 4, 6, 1, 3,
// 5, 7), so channel 8c + j sits at nibble kNibbleOf[j]: a broadcast word
// shifted per lane gives the 8 channels in their natural order.
inline __m256i awq_unpack(int32_t word) {
  const __m256i shifts = _mm256_setr_epi32(0, 16, 4, 20, 8, 24, 12, 28);  // 4 × kNibbleOf = {0,4,1,5,2,6,3,7}
  return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(word), shifts), _mm256_set1_epi32(0xf));
}

// The thread's words [c0, c1) for tokens [t0, t0 + TB): per group, eight rows
// at a time (eight forward streams through qweight), each word's partial sums
// held in registers over the eight rows and in a per-thread scratch between.
template <int TB>
void awq_sweep(const float* x, const QuantMatrixView& w, int64_t c0, int64_t c1, int64_t t0, float* y,
               std::vector<__m256>& qacc, std::vector<__m256>& yacc) {
  const int64_t K = w.n_in, N = w.n_out, W = N / 8, gs = w.group_size, nc = c1 - c0;
  qacc.assign(static_cast<size_t>(TB * nc), _mm256_setzero_ps());
  yacc.assign(static_cast<size_t>(TB * nc), _mm256_setzero_ps());
  const float* xr[TB];
  for (int t = 0; t < TB; ++t) xr[t] = x + (t0 + t) * K;
  for (int64_t g = 0; g < K / gs; ++g) {
    float sx[TB] = {};
    for (int64_t k0 = g * gs; k0 < (g + 1) * gs; k0 += 8) {  // group sizes are multiples of 8
      for (int t = 0; t < TB; ++t)
        for (int kk = 0; kk < 8; ++kk) sx[t] += xr[t][k0 + kk];
      for (int64_t c = 0; c < nc; ++c) {
        __m256 a[TB];
        for (int t = 0; t < TB; ++t) a[t] = qacc[t * nc + c];
        for (int kk = 0; kk < 8; ++kk) {
          const __m256 q = _mm256_cvtepi32_ps(awq_unpack(w.qweight[(k0 + kk) * W + c0 + c]));
          for (int t = 0; t < TB; ++t) a[t] = _mm256_fmadd_ps(_mm256_set1_ps(xr[t][k0 + kk]), q, a[t]);
        }
        for (int t = 0; t < TB; ++t) qacc[t * nc + c] = a[t];
      }
    }
    for (int64_t c = 0; c < nc; ++c) {
      const __m256 s = load_scales(w.scales, w.scales_dtype, g * N + 8 * (c0 + c), 8);
      const __m256 z = _mm256_cvtepi32_ps(awq_unpack(w.qzeros[g * W + c0 + c]));
      for (int t = 0; t < TB; ++t) {
        __m256& q = qacc[t * nc + c];
        yacc[t * nc + c] = _mm256_fmadd_ps(s, _mm256_fnmadd_ps(z, _mm256_set1_ps(sx[t]), q), yacc[t * nc + c]);
        q = _mm256_setzero_ps();
      }
    }
  }
  for (int t = 0; t < TB; ++t)
    for (int64_t c = 0; c < nc; ++c) _mm256_storeu_ps(y + (t0 + t) * N + 8 * (c0 + c), yacc[t * nc + c]);
}

void awq_matmul(const float* x, int64_t n, const QuantMatrixView& w, float* y) {
  const int64_t n_words = w.n_out / 8;
#pragma omp parallel
  {
    const auto [c0, c1] = thread_share(n_words);
    thread_local std::vector<__m256> qacc, yacc;
    if (c1 > c0) {
      int64_t t = 0;
      for (; t + 4 <= n; t += 4) awq_sweep<4>(x, w, c0, c1, t, y, qacc, yacc);
      for (; t + 2 <= n; t += 2) awq_sweep<2>(x, w, c0, c1, t, y, qacc, yacc);
      for (; t < n; ++t) awq_sweep<1>(x, w, c0, c1, t, y, qacc, yacc);
    }
  }
}

}  // namespace

void quant_matmul(const float* x, int64_t n, const QuantMatrixView& w, float* y) {
  switch (w.scheme) {
    case WeightScheme::kAwq:
      SHARDLM_CHECK(w.bits == 4 && w.n_out % 8 == 0 && w.group_size % 8 == 0, "quant_avx2: awq ", w.n_out, "x",
                    w.n_in, " group ", w.group_size);
      return awq_matmul(x, n, w, y);
    case WeightScheme::kGptq:
      if (w.bits == 4) return gptq_matmul<4>(x, n, w, y);
      SHARDLM_CHECK(w.bits == 8, "quant_avx2: gptq with ", w.bits, " bits");
      return gptq_matmul<8>(x, n, w, y);
    case WeightScheme::kFp8:
    case WeightScheme::kDense: break;
  }
  fail(ErrorCode::kInternal, "quant_avx2::quant_matmul on a ", weight_scheme_name(w.scheme), " matrix");
}

}  // namespace shardlm::backend::quant_avx2
