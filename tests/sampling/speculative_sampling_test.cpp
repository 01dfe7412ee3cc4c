// Verification of a drafted token (sampling/speculative_sampling.h) keeps the
// target distribution: over 200k trials per case on a 5-token vocabulary, for
// several target distributions p and drafted tokens x, the emitted token's
// histogram passes a chi-square test against p, the draft is accepted at rate
// p(x), and the token emitted on rejection follows p with x removed and
// renormalised. A deliberately wrong rule fails the same test, so it has power.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "sampling/speculative_sampling.h"

namespace shardlm {
namespace {

constexpr int kTrials = 200000;
// Chi-square upper critical values at alpha = 0.001 by degrees of freedom (1..4).
constexpr double kChi2Critical[] = {0.0, 10.83, 13.82, 16.27, 18.47};

// Pearson's statistic of counts against expected probabilities (cells with
// probability 0 must be empty); *dof = non-empty cells - 1.
double chi_square(const std::vector<int64_t>& counts, const std::vector<double>& prob, int64_t n, int* dof) {
  double stat = 0.0;
  int cells = 0;
  for (size_t i = 0; i < prob.size(); ++i) {
    if (prob[i] == 0.0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " has probability 0 but was drawn";
      continue;
    }
    const double e = prob[i] * double(n);
    stat += (double(counts[i]) - e) * (double(counts[i]) - e) / e;
    ++cells;
  }
  *dof = cells - 1;
  return stat;
}

struct Case {
  std::vector<float> p;
  int32_t draft;
};

std::vector<Case> cases() {
  return {
      {{0.1f, 0.2f, 0.3f, 0.25f, 0.15f}, 2},  // a middling draft
      {{0.7f, 0.1f, 0.1f, 0.05f, 0.05f}, 0},  // a likely draft
      {{0.7f, 0.1f, 0.1f, 0.05f, 0.05f}, 4},  // an unlikely one
      {{0.0f, 0.5f, 0.0f, 0.3f, 0.2f}, 0},    // filtered out (top-k): never accepted
      {{2.0f, 1.0f, 1.0f, 0.5f, 0.5f}, 1},    // unnormalised weights, as the sampler keeps them
  };
}

TEST(SpeculativeSampling, EmittedTokensFollowTheTargetAndDraftsAreAcceptedAtPOfX) {
  std::mt19937_64 rng(2025);
  for (const Case& c : cases()) {
    double total = 0.0;
    for (float w : c.p) total += w;
    std::vector<double> p;
    for (float w : c.p) p.push_back(double(w) / total);
    std::vector<int64_t> emitted(5, 0), on_reject(5, 0);
    int64_t n_accepted = 0;
    for (int t = 0; t < kTrials; ++t) {
      const DraftVerdict v = verify_draft_token(c.p, c.draft, uniform_from_draw(rng()));
      ++emitted[size_t(v.token)];
      EXPECT_EQ(v.accepted, v.token == c.draft);
      if (v.accepted) {
        ++n_accepted;
      } else {
        ++on_reject[size_t(v.token)];
      }
    }
    int dof = 0;
    const double marginal = chi_square(emitted, p, kTrials, &dof);
    EXPECT_LT(marginal, kChi2Critical[dof]) << "draft " << c.draft << ": the output marginal is not p";

    const double px = p[size_t(c.draft)];
    const double z = (double(n_accepted) - kTrials * px) / std::sqrt(kTrials * px * (1.0 - px) + 1e-12);
    if (px == 0.0) {
      EXPECT_EQ(n_accepted, 0);
    } else {
      EXPECT_LT(std::abs(z), 4.0) << "draft " << c.draft << ": accepted " << n_accepted << " of " << kTrials
                                  << ", expected p(x) = " << px;
    }

    std::vector<double> residual = p;  // p without x, renormalised
    residual[size_t(c.draft)] = 0.0;
    for (double& q : residual) q /= 1.0 - px;
    const double rejected = chi_square(on_reject, residual, kTrials - n_accepted, &dof);
    EXPECT_LT(rejected, kChi2Critical[dof]) << "draft " << c.draft << ": the token after a rejection is not p - x";
  }
}

TEST(SpeculativeSampling, TheTestCatchesARuleThatResamplesWithTheDraftKept) {
  // Accept x with probability p(x), else draw again from the whole of p (x
  // included): x comes out too often. The chi-square above must see it.
  std::mt19937_64 rng(7);
  const std::vector<float> w = {0.1f, 0.2f, 0.3f, 0.25f, 0.15f};
  const std::vector<double> p = {0.1, 0.2, 0.3, 0.25, 0.15};
  const int32_t x = 2;
  std::vector<int64_t> emitted(5, 0);
  for (int t = 0; t < kTrials; ++t) {
    const bool accept = uniform_from_draw(rng()) < p[x];
    const int32_t token = accept ? x : static_cast<int32_t>(inverse_cdf_index(w, uniform_from_draw(rng())));
    ++emitted[size_t(token)];
  }
  int dof = 0;
  EXPECT_GT(chi_square(emitted, p, kTrials, &dof), kChi2Critical[dof]);
}

TEST(SpeculativeSampling, InverseCdfPicksTheFirstIndexWhoseRunningSumExceedsU) {
  const std::vector<float> w = {1.0f, 0.0f, 3.0f};
  EXPECT_EQ(inverse_cdf_index(w, 0.0), 0u);
  EXPECT_EQ(inverse_cdf_index(w, 0.2499), 0u);
  EXPECT_EQ(inverse_cdf_index(w, 0.25), 2u);  // a zero weight is never picked
  EXPECT_EQ(inverse_cdf_index(w, 0.999999), 2u);
  EXPECT_EQ(uniform_from_draw(~uint64_t(0)), 1.0 - 0x1.0p-53);
  EXPECT_EQ(uniform_from_draw(0), 0.0);
}

}  // namespace
}  // namespace shardlm
