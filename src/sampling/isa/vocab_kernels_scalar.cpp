// sampling/vocab_kernels.h, scalar path: the reference order of every sum,
// built without AVX (flags: src/sampling/CMakeLists.txt), for CPUs without
// AVX2 and for the tests that compare the vector paths against it.
#include <limits>

#include "sampling/isa/vocab_scalar_ops.h"

namespace shardlm {

namespace {

void exp_scalar(const float* x, float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] = fast_exp_scalar(x[i]);
}

float max_scalar(const float* z, size_t n) {
  const float m = max_from(z, 0, n, -std::numeric_limits<float>::infinity());
  return m == 0.0f ? 0.0f : m;  // +0 for either zero, whichever came first
}

size_t find_equal_scalar(const float* z, size_t n, float v) { return find_equal_from(z, 0, n, v); }

size_t find_greater_scalar(const float* z, size_t n, float v) { return find_greater_from(z, 0, n, v); }

void block_sums_scalar(const float* w, size_t n, double* sums) {
  for (size_t blk = 0; blk < n / kVocabLanes; ++blk) {
    double lane[kVocabLanes];
    for (size_t j = 0; j < kVocabLanes; ++j) lane[j] = w[blk * kVocabLanes + j];
    sums[blk] = lane_tree(lane);
  }
}

ExpWeights weights_scalar(const float* z, size_t n, float max_l, float inv_t, float min_w, float* w,
                          double* block_sums) {
  double lane[kVocabLanes] = {};
  ExpWeights out;
  const size_t body = n - n % kVocabLanes;
  for (size_t i = 0; i < n; ++i) {
    const float wi = weight_scalar(z[i], max_l, inv_t, min_w);
    w[i] = wi;
    out.n_positive += wi > 0.0f;
    if (i < body) lane[i % kVocabLanes] += wi;
  }
  out.mass = lane_tree(lane);
  for (size_t i = body; i < n; ++i) out.mass += w[i];
  if (block_sums) block_sums_scalar(w, n, block_sums);
  return out;
}

double sum_exp_scalar(const float* z, size_t n, float max_l) {
  double lane[kVocabLanes] = {};
  const size_t body = n - n % kVocabLanes;
  auto term = [&](size_t i) { return std::isnan(z[i]) ? 0.0f : fast_exp_scalar(z[i] - max_l); };
  for (size_t i = 0; i < body; ++i) lane[i % kVocabLanes] += term(i);
  double sum = lane_tree(lane);
  for (size_t i = body; i < n; ++i) sum += term(i);
  return sum;
}

size_t compact_scalar(const float* w, const float* z, size_t n, float z_b, int32_t b, int32_t* ids, float* w_out) {
  return compact_from(w, z, 0, n, z_b, b, ids, w_out, 0);
}

size_t bucket_mass_scalar(const float* z, const float* w, size_t n, float min_w, float max_l, float scale,
                          double* mass) {
  return bucket_mass_from(z, w, 0, n, min_w, max_l, scale, mass, 0);
}

size_t collect_bucket_scalar(const float* z, const float* w, size_t n, float min_w, float max_l, float scale, size_t k,
                             int32_t* ids) {
  size_t c = 0;
  for (size_t i = 0; i < n; ++i)
    if (w[i] >= min_w && bucket_scalar(z[i], max_l, scale) == k) ids[c++] = static_cast<int32_t>(i);
  return c;
}

}  // namespace

float fast_exp(float x) { return fast_exp_scalar(x); }

const VocabKernels& vocab_kernels_scalar() {
  static const VocabKernels k{exp_scalar,     max_scalar,         find_equal_scalar,       find_greater_scalar,
                              weights_scalar, sum_exp_scalar,     compact_scalar,
                              bucket_mass_scalar, collect_bucket_scalar, block_sums_scalar};
  return k;
}

}  // namespace shardlm
