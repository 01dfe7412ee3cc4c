#include "sampling/speculative_sampling.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "sampling/vocab_kernels.h"

namespace shardlm {

size_t inverse_cdf_index(std::span<const float> weight, double u) {
  SHARDLM_CHECK(!weight.empty(), "inverse_cdf_index over no weights");
  // [n / 16] block sums, per thread, grown once to the largest row.
  thread_local std::vector<double> block_sum;
  const size_t n_blocks = weight.size() / kVocabLanes, body = n_blocks * kVocabLanes;
  if (block_sum.size() < n_blocks) block_sum.resize(n_blocks);
  vocab_kernels().block_sums(weight.data(), weight.size(), block_sum.data());
  return inverse_cdf_index(
      std::span<const double>(block_sum.data(), n_blocks), weight.subspan(body),
      [&](size_t b, float* out) { std::copy_n(weight.data() + b * kVocabLanes, kVocabLanes, out); }, u);
}

size_t inverse_cdf_index(std::span<const double> block_sum, std::span<const float> tail,
                         const std::function<void(size_t, float*)>& block, double u) {
  const size_t n_blocks = block_sum.size(), body = n_blocks * kVocabLanes, n = body + tail.size();
  SHARDLM_CHECK(n > 0, "inverse_cdf_index over no weights");
  double total = 0.0;
  for (size_t b = 0; b < n_blocks; ++b) total += block_sum[b];
  for (float w : tail) total += w;
  const double target = u * total;
  double cum = 0.0;
  float w[kVocabLanes];
  for (size_t b = 0; b < n_blocks; ++b) {
    if (!(cum + block_sum[b] > target)) {
      cum += block_sum[b];
      continue;
    }
    block(b, w);
    size_t last_positive = 0;  // block_sum[b] > target - cum >= 0: some weight is positive
    for (size_t j = 0; j < kVocabLanes; ++j) {
      cum += w[j];
      if (cum > target) return b * kVocabLanes + j;
      if (w[j] > 0.0f) last_positive = j;
    }
    return b * kVocabLanes + last_positive;
  }
  for (size_t j = 0; j < tail.size(); ++j) {
    cum += tail[j];
    if (cum > target) return body + j;
  }
  // u within rounding of 1: the last positive weight.
  for (size_t j = tail.size(); j-- > 0;)
    if (tail[j] > 0.0f) return body + j;
  for (size_t b = n_blocks; b-- > 0;) {
    if (!(block_sum[b] > 0.0)) continue;
    block(b, w);
    for (size_t j = kVocabLanes; j-- > 0;)
      if (w[j] > 0.0f) return b * kVocabLanes + j;
  }
  return n - 1;  // all zero
}

DraftVerdict verify_draft_token(std::span<const float> p, int32_t draft, double u) {
  DraftVerdict v;
  v.token = static_cast<int32_t>(inverse_cdf_index(p, u));
  v.accepted = v.token == draft;
  return v;
}

}  // namespace shardlm
