// sampling/vocab_kernels.h, AVX2 + FMA path (flags:
// src/sampling/CMakeLists.txt): 8 floats a vector, two per step so a step
// covers the kVocabLanes lanes of the sums, held as four vectors of 4
// doubles (lanes 0-3, 4-7, 8-11, 12-15). Tails go through the scalar
// element operations.
#include <immintrin.h>

#include <limits>

#include "sampling/isa/vocab_scalar_ops.h"

namespace shardlm {

namespace {

// The kVocabLanes lanes in double: a 0-3, b 4-7, c 8-11, d 12-15.
struct Lanes {
  __m256d a = _mm256_setzero_pd(), b = a, c = a, d = a;
  // Adds 16 floats: v0 holds elements 0-7, v1 8-15.
  void add(__m256 v0, __m256 v1) {
    a = _mm256_add_pd(a, _mm256_cvtps_pd(_mm256_castps256_ps128(v0)));
    b = _mm256_add_pd(b, _mm256_cvtps_pd(_mm256_extractf128_ps(v0, 1)));
    c = _mm256_add_pd(c, _mm256_cvtps_pd(_mm256_castps256_ps128(v1)));
    d = _mm256_add_pd(d, _mm256_cvtps_pd(_mm256_extractf128_ps(v1, 1)));
  }
  // lane_tree: j + j+8 (a + c, b + d), then j + j+4, j + j+2, j + j+1.
  double tree() const {
    const __m256d u = _mm256_add_pd(_mm256_add_pd(a, c), _mm256_add_pd(b, d));
    const __m128d v = _mm_add_pd(_mm256_castpd256_pd128(u), _mm256_extractf128_pd(u, 1));
    return _mm_cvtsd_f64(_mm_add_sd(v, _mm_unpackhi_pd(v, v)));
  }
};

inline unsigned mask8(__m256 m) { return static_cast<unsigned>(_mm256_movemask_ps(m)); }

void exp_avx2(const float* x, float* y, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exp8(_mm256_loadu_ps(x + i)));
  for (; i < n; ++i) y[i] = fast_exp_scalar(x[i]);
}

float max_avx2(const float* z, size_t n) {
  __m256 m0 = _mm256_set1_ps(-std::numeric_limits<float>::infinity()), m1 = m0;
  size_t i = 0;
  // max(z, m) keeps m when z is NaN: MAXPS returns its second operand then.
  for (; i + 16 <= n; i += 16) {
    m0 = _mm256_max_ps(_mm256_loadu_ps(z + i), m0);
    m1 = _mm256_max_ps(_mm256_loadu_ps(z + i + 8), m1);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_max_ps(m0, m1));
  float m = -std::numeric_limits<float>::infinity();
  for (float v : lanes) m = v > m ? v : m;
  m = max_from(z, i, n, m);
  return m == 0.0f ? 0.0f : m;
}

size_t find_equal_avx2(const float* z, size_t n, float v) {
  const __m256 vv = _mm256_set1_ps(v);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const unsigned m = mask8(_mm256_cmp_ps(_mm256_loadu_ps(z + i), vv, _CMP_EQ_OQ));
    if (m) return i + static_cast<size_t>(__builtin_ctz(m));
  }
  return find_equal_from(z, i, n, v);
}

size_t find_greater_avx2(const float* z, size_t n, float v) {
  const __m256 vv = _mm256_set1_ps(v);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const unsigned m = mask8(_mm256_cmp_ps(_mm256_loadu_ps(z + i), vv, _CMP_GT_OQ));
    if (m) return i + static_cast<size_t>(__builtin_ctz(m));
  }
  return find_greater_from(z, i, n, v);
}

ExpWeights weights_avx2(const float* z, size_t n, float max_l, float inv_t, float min_w, float* w,
                        double* block_sums) {
  const __m256 vmax = _mm256_set1_ps(max_l), vinv = _mm256_set1_ps(inv_t), vmin = _mm256_set1_ps(min_w);
  const __m256 zero = _mm256_setzero_ps();
  Lanes lanes;
  ExpWeights out;
  auto weight8 = [&](const float* src, float* dst) {
    const __m256 e = exp8(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(src), vmax), vinv));
    const __m256 wi = _mm256_and_ps(e, _mm256_cmp_ps(e, vmin, _CMP_GE_OQ));  // NaN -> 0
    _mm256_storeu_ps(dst, wi);
    out.n_positive += static_cast<size_t>(__builtin_popcount(mask8(_mm256_cmp_ps(wi, zero, _CMP_GT_OQ))));
    return wi;
  };
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 w0 = weight8(z + i, w + i);
    const __m256 w1 = weight8(z + i + 8, w + i + 8);
    lanes.add(w0, w1);
    if (block_sums) {
      Lanes block;
      block.add(w0, w1);  // 0 + w is w: the lanes are the block's elements
      block_sums[i / 16] = block.tree();
    }
  }
  out.mass = lanes.tree();
  for (; i < n; ++i) {
    w[i] = weight_scalar(z[i], max_l, inv_t, min_w);
    out.n_positive += w[i] > 0.0f;
    out.mass += w[i];
  }
  return out;
}

double sum_exp_avx2(const float* z, size_t n, float max_l) {
  const __m256 vmax = _mm256_set1_ps(max_l);
  auto term8 = [&](const float* src) {
    const __m256 v = _mm256_loadu_ps(src);
    return _mm256_and_ps(exp8(_mm256_sub_ps(v, vmax)), _mm256_cmp_ps(v, v, _CMP_ORD_Q));
  };
  Lanes lanes;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) lanes.add(term8(z + i), term8(z + i + 8));
  double sum = lanes.tree();
  for (; i < n; ++i) sum += std::isnan(z[i]) ? 0.0f : fast_exp_scalar(z[i] - max_l);
  return sum;
}

// AVX2 has no compress: the set bits of each 8-wide mask are walked.
size_t compact_avx2(const float* w, const float* z, size_t n, float z_b, int32_t b, int32_t* ids, float* w_out) {
  const __m256 vzb = _mm256_set1_ps(z_b), zero = _mm256_setzero_ps();
  size_t k = 0, i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 wv = _mm256_loadu_ps(w + i), zv = _mm256_loadu_ps(z + i);
    unsigned m = mask8(_mm256_cmp_ps(wv, zero, _CMP_GT_OQ));
    unsigned above = mask8(_mm256_cmp_ps(zv, vzb, _CMP_GT_OQ));
    const unsigned tie = mask8(_mm256_cmp_ps(zv, vzb, _CMP_EQ_OQ));
    // Ties with the boundary are kept up to and including b itself.
    for (unsigned t = tie; t; t &= t - 1) {
      const size_t j = i + static_cast<size_t>(__builtin_ctz(t));
      if (static_cast<int64_t>(j) <= b) above |= 1u << (j - i);
    }
    m &= above;
    if (m == 0xffu) {  // a whole vector kept: the common case of a flat row
      _mm256_storeu_ps(w_out + k, wv);
      for (size_t j = 0; j < 8; ++j) ids[k + j] = static_cast<int32_t>(i + j);
      k += 8;
      continue;
    }
    for (; m; m &= m - 1) {
      const size_t j = i + static_cast<size_t>(__builtin_ctz(m));
      ids[k] = static_cast<int32_t>(j);
      w_out[k++] = w[j];  // w[j] is not yet overwritten: k <= j
    }
  }
  return compact_from(w, z, i, n, z_b, b, ids, w_out, k);
}

// The buckets of 8 logits, as bucket_scalar computes them (lanes whose
// bucket is meaningless, NaN or -inf logits, are masked out by the caller).
inline __m256i bucket8(__m256 z, __m256 vmax, __m256 vscale) {
  const __m256 b = _mm256_mul_ps(_mm256_sub_ps(vmax, z), vscale);
  return _mm256_cvttps_epi32(_mm256_min_ps(b, _mm256_set1_ps(static_cast<float>(kMassBuckets - 1))));
}

size_t bucket_mass_avx2(const float* z, const float* w, size_t n, float min_w, float max_l, float scale,
                        double* mass) {
  const __m256 vmin = _mm256_set1_ps(min_w), vmax = _mm256_set1_ps(max_l), vscale = _mm256_set1_ps(scale);
  size_t last = 0, i = 0;
  alignas(32) int32_t k[8];
  for (; i + 8 <= n; i += 8) {
    unsigned m = mask8(_mm256_cmp_ps(_mm256_loadu_ps(w + i), vmin, _CMP_GE_OQ));
    if (!m) continue;
    _mm256_store_si256(reinterpret_cast<__m256i*>(k), bucket8(_mm256_loadu_ps(z + i), vmax, vscale));
    for (; m; m &= m - 1) {  // in id order
      const int j = __builtin_ctz(m);
      const size_t kj = static_cast<size_t>(k[j]);
      mass[kj] += w[i + static_cast<size_t>(j)];
      last = kj > last ? kj : last;
    }
  }
  return bucket_mass_from(z, w, i, n, min_w, max_l, scale, mass, last);
}

size_t collect_bucket_avx2(const float* z, const float* w, size_t n, float min_w, float max_l, float scale, size_t k,
                           int32_t* ids) {
  const __m256 vmin = _mm256_set1_ps(min_w), vmax = _mm256_set1_ps(max_l), vscale = _mm256_set1_ps(scale);
  const __m256i vk = _mm256_set1_epi32(static_cast<int32_t>(k));
  size_t c = 0, i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 in = _mm256_and_ps(_mm256_cmp_ps(_mm256_loadu_ps(w + i), vmin, _CMP_GE_OQ),
                                    _mm256_castsi256_ps(_mm256_cmpeq_epi32(bucket8(_mm256_loadu_ps(z + i), vmax, vscale), vk)));
    for (unsigned m = mask8(in); m; m &= m - 1) ids[c++] = static_cast<int32_t>(i + static_cast<size_t>(__builtin_ctz(m)));
  }
  for (; i < n; ++i)
    if (w[i] >= min_w && bucket_scalar(z[i], max_l, scale) == k) ids[c++] = static_cast<int32_t>(i);
  return c;
}

void block_sums_avx2(const float* w, size_t n, double* sums) {
  for (size_t blk = 0; blk < n / 16; ++blk) {
    Lanes lanes;
    lanes.add(_mm256_loadu_ps(w + blk * 16), _mm256_loadu_ps(w + blk * 16 + 8));  // 0 + w is w
    sums[blk] = lanes.tree();
  }
}

}  // namespace

const VocabKernels& vocab_kernels_avx2() {
  static const VocabKernels k{exp_avx2,     max_avx2,         find_equal_avx2,       find_greater_avx2,
                              weights_avx2, sum_exp_avx2,     compact_avx2,
                              bucket_mass_avx2, collect_bucket_avx2, block_sums_avx2};
  return k;
}

}  // namespace shardlm
