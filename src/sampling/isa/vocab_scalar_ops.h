// The element operations of sampling/vocab_kernels.h in scalar form: the
// reference every path reproduces bit for bit, and the tail (the elements
// after the last whole vector) of the vector paths. Included by each
// sampling/isa/*.cpp, which compile it with their own flags: everything is
// in an unnamed namespace so no definition is shared between them (a shared
// inline function built with -mavx512f could otherwise be linked into the
// scalar path).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "sampling/vocab_kernels.h"

namespace shardlm {
namespace {

// fast_exp's constants (sampling/vocab_kernels.h). ln2 = kLn2Hi + kLn2Lo
// to 2^-53; the polynomial is Cephes' expf on [-ln2/2, ln2/2], written as
// exp(r) ~ 1 + r (1 + r (1/2 + r (c3 + ...))), Horner from the top.
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

// The sampler's weight of one logit (VocabKernels::weights).
inline float weight_scalar(float z, float max_l, float inv_t, float min_w) {
  const float w = fast_exp_scalar((z - max_l) * inv_t);
  return w >= min_w ? w : 0.0f;  // false for NaN
}

// The fixed tree that combines the kVocabLanes lane sums (lane j += lane
// j + 8, then j + 4, j + 2, j + 1).
inline double lane_tree(double* lane) {
  for (size_t half = kVocabLanes / 2; half >= 1; half /= 2)
    for (size_t j = 0; j < half; ++j) lane[j] += lane[j + half];
  return lane[0];
}

// A logit's top_p bucket (VocabKernels::bucket_mass).
inline size_t bucket_scalar(float z, float max_l, float scale) {
  const float b = (max_l - z) * scale;
  return b < static_cast<float>(kMassBuckets - 1) ? static_cast<size_t>(b) : kMassBuckets - 1;
}

// The scalar version of the kernel's ranking test (VocabKernels::compact).
inline bool kept_scalar(float w, float z, size_t i, float z_b, int32_t b) {
  return w > 0.0f && (z > z_b || (z == z_b && static_cast<int64_t>(i) <= b));
}

}  // namespace
}  // namespace shardlm
