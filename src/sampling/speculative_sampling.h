// Verifying a drafted token against the target model (speculative decoding,
// engine/speculation.h and model/generate.cpp).
//
// The n-gram draft is deterministic: its proposal distribution q is one-hot
// on the drafted token x. Rejection sampling (Leviathan et al. 2023; vLLM's
// rejection sampler) then accepts x with probability min(1, p(x)/q(x)) =
// p(x), and on rejection draws from norm(max(0, p - q)) = p with x removed,
// renormalised. We implement that rule in its coupled form: the target draws
// its token t from p by inverse CDF with the one uniform u the sequence's
// RNG would spend on this position without speculation, and x is accepted
// iff t == x. Then P(accept) = P(t == x) = p(x), and given a rejection t is
// distributed as p(y) / (1 - p(x)) for y != x: the same law. What coupling
// adds is that a seeded request draws the same u per token with speculation
// on or off, so it produces the same tokens either way (and greedy is the
// limit where t = argmax).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace shardlm {

// u in [0, 1) from one 64-bit draw: its top 53 bits (Sampler's rule).
inline double uniform_from_draw(uint64_t x) { return static_cast<double>(x >> 11) * 0x1.0p-53; }

// Inverse CDF over unnormalised weights [n] (>= 0): the first index whose
// running sum (in double) exceeds u * total; the last positive one when u
// is within rounding of 1. The draw behind every non-greedy token of
// Sampler::sample. The sums are taken by blocks of 16 so they vectorise (a
// running sum of a 151,936-token row is a chain of as many dependent adds):
// each block's sum by the fixed tree of sampling/vocab_kernels.h, the total
// and the running sum as the in-order sum of the block sums (then the
// elements after the last block, one by one), and inside the block where
// the running sum passes u * total, element by element from the sum before
// it. If rounding keeps that inner sum from passing, the block's last
// positive weight is drawn. The same index on every path (SHARDLM_ISA); a
// zero weight is drawn only if all are zero.
size_t inverse_cdf_index(std::span<const float> weight, double u);

// The same draw with the block sums given: block_sums[k] = the sum of
// weight[16k .. 16k + 16) as VocabKernels::block_sums computes it, k <
// weight.size() / 16 (the sampler has them from its exp pass).
size_t inverse_cdf_index(std::span<const float> weight, std::span<const double> block_sums, double u);

struct DraftVerdict {
  int32_t token = 0;      // what the target emits at this position
  bool accepted = false;  // token == the draft: verification goes on to the next row
};

// One row of verification: p [vocab] the target's processed distribution at
// this position (probabilities or unnormalised weights, >= 0, after
// temperature/top-k/top-p/min-p/penalties), draft the drafted token, u one
// uniform in [0, 1). The emitted token is distributed exactly as p; the draft
// is accepted with probability p(draft).
DraftVerdict verify_draft_token(std::span<const float> p, int32_t draft, double u);

}  // namespace shardlm
