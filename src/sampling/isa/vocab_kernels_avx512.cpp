// sampling/vocab_kernels.h, AVX-512 path (F, BW, DQ, VL; flags:
// src/sampling/CMakeLists.txt): 16 floats a vector, which are exactly the
// kVocabLanes lanes of the sums, held as two vectors of 8 doubles (lanes
// 0-7 and 8-15). Tails go through the scalar element operations.
// GCC 12 reports its own _mm512_undefined_* inside the intrinsics headers as
// "used uninitialized" (GCC bug 105593, as backend/cpu/quant_ops.cpp notes):
// not this code's.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <limits>

#include "sampling/isa/vocab_scalar_ops.h"

namespace shardlm {

namespace {

// Adds the 16 floats of v into the lanes (lo: 0-7, hi: 8-15) in double.
inline void add_lanes(__m512d& lo, __m512d& hi, __m512 v) {
  lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
  hi = _mm512_add_pd(hi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
}

// lane_tree over (lo, hi): j + j+8, then j + j+4, j + j+2, j + j+1.
inline double lane_tree16(__m512d lo, __m512d hi) {
  const __m512d t = _mm512_add_pd(lo, hi);
  const __m256d u = _mm256_add_pd(_mm512_castpd512_pd256(t), _mm512_extractf64x4_pd(t, 1));
  const __m128d v = _mm_add_pd(_mm256_castpd256_pd128(u), _mm256_extractf128_pd(u, 1));
  return _mm_cvtsd_f64(_mm_add_sd(v, _mm_unpackhi_pd(v, v)));
}

// A block's first tree level: lane j of the result is w[j] + w[j + 8].
inline __m512d block_pairs(__m512 v) {
  return _mm512_add_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(v)),
                       _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
}

// Block sums eight blocks at a time: the rest of each block's tree (j + j+4,
// j + j+2, j + j+1) done for eight blocks by shuffles across their vectors
// instead of one horizontal reduction each (a third of the exp pass).
// Each sum adds the same pairs as lane_tree16, so the bits are the same.
class BlockSums {
 public:
  explicit BlockSums(double* out) : out_(out) {}
  void push(__m512d pairs) {
    t_[count_++] = pairs;
    if (count_ == 8) flush8();
  }
  // The blocks short of eight, one by one.
  void finish() {
    for (size_t b = 0; b < count_; ++b) *out_++ = tree8(t_[b]);
    count_ = 0;
  }

 private:
  static double tree8(__m512d t) {
    const __m256d u = _mm256_add_pd(_mm512_castpd512_pd256(t), _mm512_extractf64x4_pd(t, 1));
    const __m128d v = _mm_add_pd(_mm256_castpd256_pd128(u), _mm256_extractf128_pd(u, 1));
    return _mm_cvtsd_f64(_mm_add_sd(v, _mm_unpackhi_pd(v, v)));
  }
  void flush8() {
    // j + j+4: u[i] holds blocks 2i (lanes 0-3) and 2i+1 (lanes 4-7).
    __m512d u[4];
    for (int i = 0; i < 4; ++i)
      u[i] = _mm512_add_pd(_mm512_shuffle_f64x2(t_[2 * i], t_[2 * i + 1], 0x44),
                           _mm512_shuffle_f64x2(t_[2 * i], t_[2 * i + 1], 0xee));
    // j + j+2: v[k]'s 128-bit chunk c holds block 4k + c (lanes j = 0, 1).
    __m512d v[2];
    for (int k = 0; k < 2; ++k)
      v[k] = _mm512_add_pd(_mm512_shuffle_f64x2(u[2 * k], u[2 * k + 1], 0x88),
                           _mm512_shuffle_f64x2(u[2 * k], u[2 * k + 1], 0xdd));
    // j + j+1: lanes hold blocks 0, 4, 1, 5, 2, 6, 3, 7; put them in order.
    const __m512d s = _mm512_add_pd(_mm512_unpacklo_pd(v[0], v[1]), _mm512_unpackhi_pd(v[0], v[1]));
    _mm512_storeu_pd(out_, _mm512_permutexvar_pd(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), s));
    out_ += 8;
    count_ = 0;
  }
  __m512d t_[8];
  size_t count_ = 0;
  double* out_;
};

void exp_avx512(const float* x, float* y, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, exp16(_mm512_loadu_ps(x + i)));
  for (; i < n; ++i) y[i] = fast_exp_scalar(x[i]);
}

float max_avx512(const float* z, size_t n) {
  __m512 m0 = _mm512_set1_ps(-std::numeric_limits<float>::infinity()), m1 = m0;
  size_t i = 0;
  // max(z, m) keeps m when z is NaN: MAXPS returns its second operand then.
  for (; i + 32 <= n; i += 32) {
    m0 = _mm512_max_ps(_mm512_loadu_ps(z + i), m0);
    m1 = _mm512_max_ps(_mm512_loadu_ps(z + i + 16), m1);
  }
  for (; i + 16 <= n; i += 16) m0 = _mm512_max_ps(_mm512_loadu_ps(z + i), m0);
  float m = _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
  m = max_from(z, i, n, m);
  return m == 0.0f ? 0.0f : m;
}

size_t find_equal_avx512(const float* z, size_t n, float v) {
  const __m512 vv = _mm512_set1_ps(v);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __mmask16 m = _mm512_cmp_ps_mask(_mm512_loadu_ps(z + i), vv, _CMP_EQ_OQ);
    if (m) return i + static_cast<size_t>(__builtin_ctz(m));
  }
  return find_equal_from(z, i, n, v);
}

size_t find_greater_avx512(const float* z, size_t n, float v) {
  const __m512 vv = _mm512_set1_ps(v);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __mmask16 m = _mm512_cmp_ps_mask(_mm512_loadu_ps(z + i), vv, _CMP_GT_OQ);
    if (m) return i + static_cast<size_t>(__builtin_ctz(m));
  }
  return find_greater_from(z, i, n, v);
}

ExpWeights weights_avx512(const float* z, size_t n, float max_l, float inv_t, float min_w, float* w,
                          double* block_sums) {
  const __m512 vmax = _mm512_set1_ps(max_l), vinv = _mm512_set1_ps(inv_t), vmin = _mm512_set1_ps(min_w);
  __m512d lo = _mm512_setzero_pd(), hi = lo;
  BlockSums sums(block_sums);
  ExpWeights out;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(z + i), vmax), vinv);
    const __m512 e = exp16(x);
    const __m512 wi = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(e, vmin, _CMP_GE_OQ), e);  // NaN -> 0
    _mm512_storeu_ps(w + i, wi);
    out.n_positive += static_cast<size_t>(
        __builtin_popcount(_mm512_cmp_ps_mask(wi, _mm512_setzero_ps(), _CMP_GT_OQ)));
    add_lanes(lo, hi, wi);
    if (block_sums) sums.push(block_pairs(wi));
  }
  sums.finish();
  out.mass = lane_tree16(lo, hi);
  for (; i < n; ++i) {
    w[i] = weight_scalar(z[i], max_l, inv_t, min_w);
    out.n_positive += w[i] > 0.0f;
    out.mass += w[i];
  }
  return out;
}

double sum_exp_avx512(const float* z, size_t n, float max_l) {
  const __m512 vmax = _mm512_set1_ps(max_l);
  __m512d lo = _mm512_setzero_pd(), hi = lo;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(z + i);
    const __m512 e = exp16(_mm512_sub_ps(v, vmax));
    add_lanes(lo, hi, _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), e));
  }
  double sum = lane_tree16(lo, hi);
  for (; i < n; ++i) sum += std::isnan(z[i]) ? 0.0f : fast_exp_scalar(z[i] - max_l);
  return sum;
}

// Packs the ids and weights of the kept lanes to out + k with full 16-wide
// stores (a register compress: compress-to-memory is slow on Zen 4): the
// entries past the packed ones lie in [k, i + 16), already read, and are
// overwritten later or left past the end of the result.
size_t compact_avx512(const float* w, const float* z, size_t n, float z_b, int32_t b, int32_t* ids, float* w_out) {
  const __m512 vzb = _mm512_set1_ps(z_b), zero = _mm512_setzero_ps();
  const __m512i vb = _mm512_set1_epi32(b);
  __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i step = _mm512_set1_epi32(16);
  size_t k = 0, i = 0;
  for (; i + 16 <= n; i += 16, idx = _mm512_add_epi32(idx, step)) {
    const __m512 wv = _mm512_loadu_ps(w + i), zv = _mm512_loadu_ps(z + i);
    const __mmask16 tie = _mm512_mask_cmple_epi32_mask(_mm512_cmp_ps_mask(zv, vzb, _CMP_EQ_OQ), idx, vb);
    const __mmask16 m =
        _mm512_mask_cmp_ps_mask(_mm512_cmp_ps_mask(zv, vzb, _CMP_GT_OQ) | tie, wv, zero, _CMP_GT_OQ);
    if (!m) continue;
    _mm512_storeu_si512(ids + k, _mm512_maskz_compress_epi32(m, idx));
    _mm512_storeu_ps(w_out + k, _mm512_maskz_compress_ps(m, wv));
    k += static_cast<size_t>(__builtin_popcount(m));
  }
  return compact_from(w, z, i, n, z_b, b, ids, w_out, k);
}

// The buckets of 16 logits, as bucket_scalar computes them (lanes whose
// bucket is meaningless, NaN or -inf logits, are masked out by the caller).
inline __m512i bucket16(__m512 z, __m512 vmax, __m512 vscale) {
  const __m512 b = _mm512_mul_ps(_mm512_sub_ps(vmax, z), vscale);
  return _mm512_cvttps_epi32(_mm512_min_ps(b, _mm512_set1_ps(static_cast<float>(kMassBuckets - 1))));
}

size_t bucket_mass_avx512(const float* z, const float* w, size_t n, float min_w, float max_l, float scale,
                          double* mass) {
  const __m512 vmin = _mm512_set1_ps(min_w), vmax = _mm512_set1_ps(max_l), vscale = _mm512_set1_ps(scale);
  size_t last = 0, i = 0;
  alignas(64) int32_t k[16];
  for (; i + 16 <= n; i += 16) {
    const __m512 wv = _mm512_loadu_ps(w + i);
    __mmask16 m = _mm512_cmp_ps_mask(wv, vmin, _CMP_GE_OQ);
    if (!m) continue;
    _mm512_store_si512(k, bucket16(_mm512_loadu_ps(z + i), vmax, vscale));
    for (; m; m &= static_cast<__mmask16>(m - 1)) {  // in id order
      const int j = __builtin_ctz(m);
      const size_t kj = static_cast<size_t>(k[j]);
      mass[kj] += w[i + static_cast<size_t>(j)];
      last = kj > last ? kj : last;
    }
  }
  return bucket_mass_from(z, w, i, n, min_w, max_l, scale, mass, last);
}

size_t collect_bucket_avx512(const float* z, const float* w, size_t n, float min_w, float max_l, float scale,
                             size_t k, int32_t* ids) {
  const __m512 vmin = _mm512_set1_ps(min_w), vmax = _mm512_set1_ps(max_l), vscale = _mm512_set1_ps(scale);
  const __m512i vk = _mm512_set1_epi32(static_cast<int32_t>(k));
  __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i step = _mm512_set1_epi32(16);
  size_t c = 0, i = 0;
  for (; i + 16 <= n; i += 16, idx = _mm512_add_epi32(idx, step)) {
    const __mmask16 m = _mm512_mask_cmpeq_epi32_mask(_mm512_cmp_ps_mask(_mm512_loadu_ps(w + i), vmin, _CMP_GE_OQ),
                                                     bucket16(_mm512_loadu_ps(z + i), vmax, vscale), vk);
    if (!m) continue;
    _mm512_storeu_si512(ids + c, _mm512_maskz_compress_epi32(m, idx));  // c + 16 <= i + 16 <= n
    c += static_cast<size_t>(__builtin_popcount(m));
  }
  for (; i < n; ++i)
    if (w[i] >= min_w && bucket_scalar(z[i], max_l, scale) == k) ids[c++] = static_cast<int32_t>(i);
  return c;
}

void block_sums_avx512(const float* w, size_t n, double* sums) {
  BlockSums out(sums);
  for (size_t blk = 0; blk < n / 16; ++blk) out.push(block_pairs(_mm512_loadu_ps(w + blk * 16)));
  out.finish();
}

}  // namespace

const VocabKernels& vocab_kernels_avx512() {
  static const VocabKernels k{exp_avx512,     max_avx512,         find_equal_avx512,       find_greater_avx512,
                              weights_avx512, sum_exp_avx512,     compact_avx512,
                              bucket_mass_avx512, collect_bucket_avx512, block_sums_avx512};
  return k;
}

}  // namespace shardlm
