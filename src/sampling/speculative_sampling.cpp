#include "sampling/speculative_sampling.h"

#include "core/error.h"

namespace shardlm {

size_t inverse_cdf_index(std::span<const float> weight, double u) {
  SHARDLM_CHECK(!weight.empty(), "inverse_cdf_index over no weights");
  double total = 0.0;
  for (float w : weight) total += w;
  const double target = u * total;
  double cum = 0.0;
  for (size_t j = 0; j < weight.size(); ++j) {
    cum += weight[j];
    if (cum > target) return j;
  }
  return weight.size() - 1;  // u within rounding of 1
}

DraftVerdict verify_draft_token(std::span<const float> p, int32_t draft, double u) {
  DraftVerdict v;
  v.token = static_cast<int32_t>(inverse_cdf_index(p, u));
  v.accepted = v.token == draft;
  return v;
}

}  // namespace shardlm
