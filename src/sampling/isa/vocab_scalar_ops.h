// The element operations of sampling/vocab_kernels.h in scalar form (fast_exp
// itself: core/fast_exp_ops.h): the reference every path reproduces bit for
// bit, and the tail (the elements after the last whole vector) of the
// vector paths. Included by each
// sampling/isa/*.cpp, which compile it with their own flags: everything is
// in an unnamed namespace so no definition is shared between them (a shared
// inline function built with -mavx512f could otherwise be linked into the
// scalar path).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/fast_exp_ops.h"
#include "sampling/vocab_kernels.h"

namespace shardlm {
namespace {

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

// The element loops every path shares: the scalar kernels run them over the
// whole row (i = 0), the vector paths over the tail after their last whole
// vector, so each element is treated by the one definition.

// max(m, z[i..n)), NaN skipped (the caller folds -0 into +0 at the end).
inline float max_from(const float* z, size_t i, size_t n, float m) {
  for (; i < n; ++i)
    if (z[i] > m) m = z[i];  // false for NaN
  return m;
}

// The first index in [i, n) whose logit equals (greater: exceeds) v, else n.
inline size_t find_equal_from(const float* z, size_t i, size_t n, float v) {
  for (; i < n; ++i)
    if (z[i] == v) return i;
  return n;
}
inline size_t find_greater_from(const float* z, size_t i, size_t n, float v) {
  for (; i < n; ++i)
    if (z[i] > v) return i;
  return n;
}

// VocabKernels::compact over [i, n), appending at k; returns the new count.
inline size_t compact_from(const float* w, const float* z, size_t i, size_t n, float z_b, int32_t b, int32_t* ids,
                           float* w_out, size_t k) {
  for (; i < n; ++i) {
    if (!kept_scalar(w[i], z[i], i, z_b, b)) continue;
    const float wi = w[i];
    ids[k] = static_cast<int32_t>(i);
    w_out[k++] = wi;
  }
  return k;
}

// VocabKernels::bucket_mass over [i, n); returns the highest bucket hit
// (at least `last`).
inline size_t bucket_mass_from(const float* z, const float* w, size_t i, size_t n, float min_w, float max_l,
                               float scale, double* mass, size_t last) {
  for (; i < n; ++i) {
    if (!(w[i] >= min_w)) continue;
    const size_t kj = bucket_scalar(z[i], max_l, scale);
    mass[kj] += w[i];
    last = kj > last ? kj : last;
  }
  return last;
}

}  // namespace
}  // namespace shardlm
