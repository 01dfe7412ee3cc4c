// The SIMD vocabulary of the CPU kernels: one f32 vector type (16 lanes on
// AVX-512, 8 on AVX2+FMA+F16C) and a widening load per stored dtype, so a
// kernel is written once for both ISAs. SHARDLM_SIMD is defined when either
// is available; without it the kernels fall back to scalar loops.
// Internal to the backend layer (included by its .cpp files only).
#pragma once

#include <cstdint>

#include "core/dtype.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define SHARDLM_AVX2 1
#define SHARDLM_SIMD 1
#endif

// Each ISA's functions live in their own inline namespace: a kernel built for
// several ISAs (backend/cpu/rows_gemm.h) includes this header under different
// flags, and Vec-typed functions of the same name must not be merged by the
// linker across those translation units.
#if defined(__AVX512F__) && defined(__AVX512BW__)
#define SHARDLM_SIMD_ABI isa_avx512
#elif defined(SHARDLM_AVX2)
#define SHARDLM_SIMD_ABI isa_avx2
#else
#define SHARDLM_SIMD_ABI isa_scalar
#endif

namespace shardlm::backend::simd {
inline namespace SHARDLM_SIMD_ABI {

// E4M3 bytes are widened through f16: sign-extended to 16 bits and shifted
// left by 7, a byte's sign lands on bit 15 and its 7 exponent/mantissa bits
// on bits 7..13 (mask 0xBF80 clears bit 14, a copy of the sign). As an f16
// that is the value × 2^-8, subnormals included (exponent bias 7 against
// f16's 15), and vcvtph2ps turns it into a normal f32. Moving the bits into
// an f32's places instead gives the value × 2^-120, a subnormal f32 for
// |value| < 2^-6, and each FMA on a subnormal takes a microcode assist
// (measured 16× slower on uniformly random bytes).
constexpr float kFp8F16Rebias = 256.0f;
constexpr short kFp8F16Mask = static_cast<short>(0xBF80);

#if defined(__AVX512F__) && defined(__AVX512BW__)
// 16 lanes: widen 16 stored elements to f32.
using Vec = __m512;
constexpr int64_t kLanes = 16;
// 16 E4M3 bytes as f32, each the value × 2^-8 (see kFp8F16Rebias).
inline Vec load_fp8_over_256(const uint8_t* p) {
  const __m256i h = _mm256_slli_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 7);
  return _mm512_cvtph_ps(_mm256_and_si256(h, _mm256_set1_epi16(kFp8F16Mask)));
}
template <DType D>
inline Vec loadv(const void* base, int64_t i) {
  if constexpr (D == DType::kF32) {
    return _mm512_loadu_ps(static_cast<const float*>(base) + i);
  } else if constexpr (D == DType::kBF16) {
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(base) + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else if constexpr (D == DType::kF8E4M3) {
    return _mm512_mul_ps(load_fp8_over_256(static_cast<const uint8_t*>(base) + i), _mm512_set1_ps(kFp8F16Rebias));
  } else {
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(base) + i));
    return _mm512_cvtph_ps(h);
  }
}
inline Vec loadx(const float* p) { return _mm512_loadu_ps(p); }
inline void storex(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline Vec setv(float a) { return _mm512_set1_ps(a); }
inline Vec zerov() { return _mm512_setzero_ps(); }
inline Vec fmav(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline Vec mulv(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
inline float hsum(Vec v) { return _mm512_reduce_add_ps(v); }
#elif defined(SHARDLM_AVX2)
// 8 lanes.
using Vec = __m256;
constexpr int64_t kLanes = 8;
// 8 E4M3 bytes as f32, each the value × 2^-8 (see kFp8F16Rebias).
inline Vec load_fp8_over_256(const uint8_t* p) {
  const __m128i h = _mm_slli_epi16(_mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))), 7);
  return _mm256_cvtph_ps(_mm_and_si128(h, _mm_set1_epi16(kFp8F16Mask)));
}
template <DType D>
inline Vec loadv(const void* base, int64_t i) {
  if constexpr (D == DType::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(base) + i);
  } else if constexpr (D == DType::kBF16) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else if constexpr (D == DType::kF8E4M3) {
    return _mm256_mul_ps(load_fp8_over_256(static_cast<const uint8_t*>(base) + i), _mm256_set1_ps(kFp8F16Rebias));
  } else {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + i));
    return _mm256_cvtph_ps(h);
  }
}
inline Vec loadx(const float* p) { return _mm256_loadu_ps(p); }
inline void storex(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline Vec setv(float a) { return _mm256_set1_ps(a); }
inline Vec zerov() { return _mm256_setzero_ps(); }
inline Vec fmav(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline Vec mulv(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
inline float hsum(Vec v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define SHARDLM_SIMD_TRANSPOSE 1
// After transpose(), v[c] holds column kTransposedColumn[c] of the block (the
// unpack stages leave columns 1 and 2 of every four swapped; callers store
// v[c] where that column goes, which undoes it for free).
constexpr int kTransposedColumn[16] = {0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15};

// In-register transpose of a 16 × 16 f32 block v[row][column], up to the
// column order above: 64 shuffles for 256 elements.
inline void transpose(Vec v[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(v[i], v[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(v[i], v[i + 1]);
  }
  for (int i = 0; i < 16; i += 4)
    for (int j = 0; j < 2; ++j) {
      v[i + j] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + j]), _mm512_castps_pd(t[i + j + 2])));
      v[i + j + 2] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + j]), _mm512_castps_pd(t[i + j + 2])));
    }
  // Each 128-bit lane q of v[4a + b] now holds rows 4a..4a+3 of column 4q + {0, 2, 1, 3}[b].
  for (int i = 0; i < 16; i += 8)
    for (int j = 0; j < 4; ++j) {
      t[i + j] = _mm512_shuffle_f32x4(v[i + j], v[i + j + 4], 0x88);      // lanes 0,2 | 0,2
      t[i + j + 4] = _mm512_shuffle_f32x4(v[i + j], v[i + j + 4], 0xdd);  // lanes 1,3 | 1,3
    }
  for (int j = 0; j < 8; ++j) {
    v[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
    v[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xdd);
  }
}
#endif

// Prefetch the cache line holding p into L1 (a hint: p may be past the end).
inline void prefetch(const void* p) {
#ifdef SHARDLM_SIMD
  _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0);
#else
  (void)p;
#endif
}

}  // inline namespace SHARDLM_SIMD_ABI
}  // namespace shardlm::backend::simd
