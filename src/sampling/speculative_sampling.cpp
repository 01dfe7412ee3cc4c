#include "sampling/speculative_sampling.h"

#include <vector>

#include "core/error.h"
#include "sampling/vocab_kernels.h"

namespace shardlm {

size_t inverse_cdf_index(std::span<const float> weight, double u) {
  SHARDLM_CHECK(!weight.empty(), "inverse_cdf_index over no weights");
  // [n / 16] block sums, per thread, grown once to the largest row.
  thread_local std::vector<double> block_sum;
  const size_t n_blocks = weight.size() / kVocabLanes;
  if (block_sum.size() < n_blocks) block_sum.resize(n_blocks);
  vocab_kernels().block_sums(weight.data(), weight.size(), block_sum.data());
  return inverse_cdf_index(weight, std::span<const double>(block_sum.data(), n_blocks), u);
}

size_t inverse_cdf_index(std::span<const float> weight, std::span<const double> block_sum, double u) {
  SHARDLM_CHECK(!weight.empty(), "inverse_cdf_index over no weights");
  const size_t n = weight.size(), n_blocks = n / kVocabLanes, body = n_blocks * kVocabLanes;
  SHARDLM_CHECK(block_sum.size() == n_blocks, "inverse_cdf_index: ", block_sum.size(), " block sums for ", n,
                " weights (expected ", n_blocks, ")");
  double total = 0.0;
  for (size_t b = 0; b < n_blocks; ++b) total += block_sum[b];
  for (size_t j = body; j < n; ++j) total += weight[j];
  const double target = u * total;
  double cum = 0.0;
  for (size_t b = 0; b < n_blocks; ++b) {
    if (!(cum + block_sum[b] > target)) {
      cum += block_sum[b];
      continue;
    }
    size_t last_positive = b * kVocabLanes;  // block_sum[b] > target - cum >= 0: some weight is positive
    for (size_t j = b * kVocabLanes; j < (b + 1) * kVocabLanes; ++j) {
      cum += weight[j];
      if (cum > target) return j;
      if (weight[j] > 0.0f) last_positive = j;
    }
    return last_positive;
  }
  for (size_t j = body; j < n; ++j) {
    cum += weight[j];
    if (cum > target) return j;
  }
  // u within rounding of 1: the last positive weight (the last if all are zero).
  for (size_t j = n; j-- > 0;)
    if (weight[j] > 0.0f) return j;
  return n - 1;
}

DraftVerdict verify_draft_token(std::span<const float> p, int32_t draft, double u) {
  DraftVerdict v;
  v.token = static_cast<int32_t>(inverse_cdf_index(p, u));
  v.accepted = v.token == draft;
  return v;
}

}  // namespace shardlm
