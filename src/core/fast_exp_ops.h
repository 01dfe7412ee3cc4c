// fast_exp (declared in sampling/vocab_kernels.h, which documents its
// accuracy) as inline element and vector operations: the scalar form every
// path reproduces bit for bit, and the same operations 16 (AVX-512) and 8
// (AVX2) at a time where the including file is compiled for them. Shared by
// the sampler's per-ISA kernels (sampling/isa/) and the CPU backend's
// elementwise ops (SiLU, attention's softmax), so that both round exp the
// same way. Everything is in an unnamed namespace: each file that includes
// it gets its own copy built with its own flags, and no inline function
// built with -mavx512f can be linked into a scalar path.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace shardlm {
namespace {

// ln2 = kLn2Hi + kLn2Lo to 2^-53; the polynomial is Cephes' expf on
// [-ln2/2, ln2/2], written as exp(r) ~ 1 + r (1 + r (1/2 + r (c3 + ...))),
// Horner from the top.
constexpr float kLog2e = 0x1.715476p+0f;
constexpr float kLn2Hi = 0x1.62e43p-1f;
constexpr float kLn2Lo = -0x1.05c61p-29f;
// Inputs are clamped to [kExpMin, kExpMax] first so n fits the two scale
// factors' exponents: exp(-104) is under half the least subnormal (rounds
// to 0) and exp(89) over FLT_MAX (rounds to +inf).
constexpr float kExpMin = -104.0f;
constexpr float kExpMax = 89.0f;
constexpr float kExpPoly[8] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f,
                               1.6666665459e-1f, 5.0000001201e-1f, 1.0f,             1.0f};

// 2^e as an f32 for e in [-126, 127].
inline float pow2_scalar(int32_t e) {
  const uint32_t bits = static_cast<uint32_t>(e + 127) << 23;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline float fast_exp_scalar(float x) {
  float xc = x >= kExpMin ? x : kExpMin;  // NaN -> kExpMin, as MAXPS does; its result is replaced below
  xc = xc <= kExpMax ? xc : kExpMax;
  const float n = std::nearbyint(xc * kLog2e);  // n in [-150, 128]; round to nearest even
  float r = std::fma(-n, kLn2Hi, xc);
  r = std::fma(-n, kLn2Lo, r);
  float p = kExpPoly[0];
  for (int k = 1; k < 8; ++k) p = std::fma(p, r, kExpPoly[k]);
  // 2^n in two exact halves, each in [-75, 64]: p * 2^h is exact, the last
  // multiply rounds once (subnormal or overflowing results included).
  const int32_t ni = static_cast<int32_t>(n);
  const int32_t h = ni >> 1;
  const float y = (p * pow2_scalar(h)) * pow2_scalar(ni - h);
  return std::isnan(x) ? x : y;
}

#if defined(__AVX512F__)
// fast_exp_scalar, 16 at a time: the same operations in the same order.
inline __m512 exp16(__m512 x) {
  __m512 xc = _mm512_max_ps(x, _mm512_set1_ps(kExpMin));  // NaN -> kExpMin (MAXPS returns the second operand)
  xc = _mm512_min_ps(xc, _mm512_set1_ps(kExpMax));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), xc);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kExpPoly[0]);
  for (int k = 1; k < 8; ++k) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpPoly[k]));
  const __m512i ni = _mm512_cvtps_epi32(n);  // exact: n is integral
  const __m512i h = _mm512_srai_epi32(ni, 1);
  const __m512i bias = _mm512_set1_epi32(127);
  const __m512 s1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(h, bias), 23));
  const __m512 s2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_sub_epi32(ni, h), bias), 23));
  const __m512 y = _mm512_mul_ps(_mm512_mul_ps(p, s1), s2);
  return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
// fast_exp_scalar, 8 at a time: the same operations in the same order.
inline __m256 exp8(__m256 x) {
  __m256 xc = _mm256_max_ps(x, _mm256_set1_ps(kExpMin));  // NaN -> kExpMin (MAXPS returns the second operand)
  xc = _mm256_min_ps(xc, _mm256_set1_ps(kExpMax));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), xc);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kExpPoly[0]);
  for (int k = 1; k < 8; ++k) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpPoly[k]));
  const __m256i ni = _mm256_cvtps_epi32(n);  // exact: n is integral
  const __m256i h = _mm256_srai_epi32(ni, 1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(h, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, h), bias), 23));
  const __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
  return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}
#endif

}  // namespace
}  // namespace shardlm
