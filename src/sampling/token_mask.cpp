#include "sampling/token_mask.h"

#include <algorithm>
#include <limits>

namespace shardlm {

void apply_token_bitmask(std::span<float> logits, std::span<const uint32_t> bitmask) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const size_t n = logits.size();
  const size_t covered = std::min(n, bitmask.size() * 32);
  for (size_t w = 0; w * 32 < covered; ++w) {
    const uint32_t bits = bitmask[w];
    if (bits == ~uint32_t(0)) continue;
    const size_t end = std::min(covered, w * 32 + 32);
    for (size_t t = w * 32; t < end; ++t)
      if (!((bits >> (t & 31)) & 1)) logits[t] = kNegInf;
  }
  std::fill(logits.begin() + std::ptrdiff_t(covered), logits.end(), kNegInf);
}

}  // namespace shardlm
