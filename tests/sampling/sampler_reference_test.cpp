// The sampler's fast path (heap / quickselect selection, f32 weights, no
// full-vocabulary sort) against a straightforward reference written here:
// double-precision softmax over the whole vocabulary, a full sort for
// top_k/top_p, dense penalty counts. Same seeds, same draws: the tokens must
// agree, except where the draw u lands within rounding of a cumulative
// boundary (f32 against f64 weights), which the test states and bounds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "sampling/sampler.h"

namespace shardlm {
namespace {

// Reference distribution: vLLM order temperature -> min_p -> top_k -> top_p.
std::vector<double> reference_distribution(const SamplingParams& p, const std::vector<float>& logits) {
  const size_t vocab = logits.size();
  std::vector<double> prob(vocab, 0.0);
  const double inv_t = 1.0 / std::max(p.temperature, kGreedyTemperature);
  double max_z = -std::numeric_limits<double>::infinity();
  for (float l : logits)
    if (!std::isnan(l)) max_z = std::max(max_z, l * inv_t);
  double total = 0.0;
  for (size_t i = 0; i < vocab; ++i) {
    const double z = logits[i] * inv_t;
    prob[i] = std::isnan(logits[i]) || std::isinf(z) ? 0.0 : std::exp(z - max_z);
    total += prob[i];
  }
  if (!(total > 0.0)) {
    std::fill(prob.begin(), prob.end(), 0.0);
    prob[argmax(logits)] = 1.0;
    return prob;
  }
  for (double& x : prob) x /= total;
  if (p.min_p > 0.0) {
    const double threshold = p.min_p * *std::max_element(prob.begin(), prob.end());
    for (double& x : prob)
      if (x < threshold) x = 0.0;
  }
  std::vector<int32_t> kept;
  for (size_t i = 0; i < vocab; ++i)
    if (prob[i] > 0.0) kept.push_back(static_cast<int32_t>(i));
  auto more_likely = [&](int32_t a, int32_t b) { return prob[a] != prob[b] ? prob[a] > prob[b] : a < b; };
  std::sort(kept.begin(), kept.end(), more_likely);
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < kept.size()) {
    for (size_t j = p.top_k; j < kept.size(); ++j) prob[kept[j]] = 0.0;
    kept.resize(p.top_k);
  }
  if (p.top_p < 1.0) {
    double mass = 0.0;
    for (int32_t t : kept) mass += prob[t];
    double before = 0.0;
    size_t n_keep = 0;
    for (int32_t t : kept) {
      if (n_keep > 0 && before >= p.top_p * mass) break;
      before += prob[t];
      ++n_keep;
    }
    for (size_t j = n_keep; j < kept.size(); ++j) prob[kept[j]] = 0.0;
  }
  total = 0.0;
  for (double x : prob) total += x;
  for (double& x : prob) x /= total;
  return prob;
}

// Reference penalties with dense counts: repetition over prompt + output
// (positive / r, negative * r, once per token), then frequency * count +
// presence over the output.
void reference_penalties(const SamplingParams& p, std::vector<float>& l, const std::vector<int32_t>& prompt,
                         const std::vector<int32_t>& output) {
  const size_t vocab = l.size();
  std::vector<int> count(vocab, 0);
  std::vector<bool> seen(vocab, false);
  for (int32_t t : prompt) seen[t] = true;
  for (int32_t t : output) {
    seen[t] = true;
    ++count[t];
  }
  if (p.repetition_penalty != 1.0) {
    const float rp = static_cast<float>(p.repetition_penalty);
    for (size_t t = 0; t < vocab; ++t)
      if (seen[t]) l[t] = l[t] > 0 ? l[t] / rp : l[t] * rp;
  }
  for (size_t t = 0; t < vocab; ++t)
    if (count[t] > 0) l[t] -= static_cast<float>(p.frequency_penalty * count[t] + p.presence_penalty);
}

// Random logits; `ties`: drawn from a few values, so many tokens are equal.
std::vector<float> random_logits(std::mt19937_64& rng, size_t vocab, bool ties, double scale) {
  std::normal_distribution<float> normal(0.0f, static_cast<float>(scale));
  std::vector<float> l(vocab);
  for (float& x : l) x = ties ? std::round(normal(rng)) : normal(rng);
  // A few tokens the grammar or a ban removed, and a NaN that must never win.
  for (int j = 0; j < 5; ++j) l[rng() % vocab] = -std::numeric_limits<float>::infinity();
  l[rng() % vocab] = std::numeric_limits<float>::quiet_NaN();
  return l;
}

struct Case {
  std::string name;
  SamplingParams params;
  size_t vocab;
  bool ties;
  double scale;  // std of the logits
};

std::vector<Case> cases() {
  auto with = [](double t, double top_p, int32_t top_k, double min_p) {
    SamplingParams p;
    p.temperature = t;
    p.top_p = top_p;
    p.top_k = top_k;
    p.min_p = min_p;
    return p;
  };
  std::vector<Case> c = {
      {"plain", with(1.0, 1.0, -1, 0.0), 4000, false, 2.0},
      {"temperature", with(0.7, 1.0, -1, 0.0), 4000, false, 2.0},
      {"top_p", with(1.0, 0.9, -1, 0.0), 4000, false, 2.0},
      {"top_p_flat", with(1.5, 0.95, -1, 0.0), 20000, false, 0.5},  // the kept set is most of the vocabulary
      {"top_p_peaked", with(0.5, 0.8, -1, 0.0), 20000, false, 3.0},
      {"top_p_ties", with(1.0, 0.7, -1, 0.0), 4000, true, 1.5},
      {"top_k_heap", with(1.0, 1.0, 40, 0.0), 20000, false, 2.0},     // k * 16 <= vocab: the heap
      {"top_k_select", with(1.0, 1.0, 900, 0.0), 4000, false, 2.0},   // the nth_element branch
      {"top_k_ties", with(0.8, 1.0, 7, 0.0), 4000, true, 1.0},
      {"top_k_top_p", with(0.9, 0.6, 50, 0.0), 20000, false, 2.0},
      {"min_p", with(1.0, 1.0, -1, 0.05), 4000, false, 2.0},
      {"min_p_top_k_top_p", with(1.2, 0.9, 100, 0.02), 20000, false, 2.0},
      {"min_p_top_p_ties", with(1.0, 0.85, -1, 0.1), 4000, true, 1.0},
      {"top_k_larger_than_kept", with(1.0, 1.0, 3000, 0.3), 4000, false, 2.0},
  };
  Case pen{"penalties", with(0.8, 0.9, 60, 0.0), 4000, false, 2.0};
  pen.params.repetition_penalty = 1.3;
  pen.params.frequency_penalty = 0.4;
  pen.params.presence_penalty = 0.3;
  c.push_back(pen);
  Case pen_bias{"penalties_bias_top_p", with(1.0, 0.8, -1, 0.0), 4000, true, 1.0};
  pen_bias.params.repetition_penalty = 0.7;
  pen_bias.params.presence_penalty = -0.5;
  pen_bias.params.logit_bias = {{3, 5.0f}, {10, -100.0f}};
  c.push_back(pen_bias);
  return c;
}

TEST(SamplerReference, FastPathDrawsTheReferenceTokens) {
  int n_draws = 0, n_near_boundary = 0;
  for (Case c : cases()) {
    SCOPED_TRACE(c.name);
    c.params.seed = 1000 + n_draws;
    std::mt19937_64 data(c.vocab * 31 + c.name.size());
    std::vector<int32_t> prompt;
    for (int j = 0; j < 20; ++j) prompt.push_back(static_cast<int32_t>(data() % c.vocab));
    Sampler fast(c.params, prompt, static_cast<int64_t>(c.vocab));
    std::mt19937_64 ref_rng(*c.params.seed);
    std::vector<int32_t> output;
    for (int step = 0; step < 40; ++step) {
      const std::vector<float> raw = random_logits(data, c.vocab, c.ties, c.scale);
      std::vector<float> l = raw;
      for (const auto& [token, bias] : c.params.logit_bias) l[token] += bias;
      reference_penalties(c.params, l, prompt, output);
      const std::vector<double> prob = reference_distribution(c.params, l);
      const double u = static_cast<double>(ref_rng() >> 11) * 0x1.0p-53;
      int32_t want = -1;
      double cum = 0.0, lo_edge = 0.0;
      for (size_t i = 0; i < prob.size() && want < 0; ++i) {
        if (prob[i] <= 0.0) continue;
        lo_edge = cum;
        cum += prob[i];
        if (cum > u) want = static_cast<int32_t>(i);
      }
      const int32_t got = fast.sample(raw).token;
      ++n_draws;
      if (got != want) {
        // Only a draw within rounding of the edge between two tokens may differ.
        const double gap = std::min(std::abs(u - lo_edge), std::abs(u - cum));
        EXPECT_LT(gap, 1e-5) << "step " << step << ": fast " << got << ", reference " << want << ", u " << u;
        ++n_near_boundary;
      }
      output.push_back(got);
    }
  }
  EXPECT_LE(n_near_boundary, 2) << "of " << n_draws << " draws";
}

TEST(SamplerReference, FastDistributionMatchesTheReference) {
  for (const Case& c : cases()) {
    if (!c.params.logit_bias.empty() || c.params.repetition_penalty != 1.0) continue;  // penalties: above
    SCOPED_TRACE(c.name);
    std::mt19937_64 data(7 + c.vocab);
    for (int rep = 0; rep < 3; ++rep) {
      const std::vector<float> l = random_logits(data, c.vocab, c.ties, c.scale);
      const std::vector<double> want = reference_distribution(c.params, l);
      const std::vector<double> got = sampling_distribution(c.params, l);
      ASSERT_EQ(got.size(), want.size());
      size_t n_support_differs = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_NEAR(got[i], want[i], 1e-6) << "token " << i;
        n_support_differs += (got[i] > 0.0) != (want[i] > 0.0);
      }
      EXPECT_EQ(n_support_differs, 0u);
    }
  }
}

TEST(SamplerReference, GreedyLogprobsAndTopLogprobsMatchTheReference) {
  std::mt19937_64 data(99);
  for (bool ties : {false, true}) {
    const std::vector<float> l = random_logits(data, 5000, ties, 2.0);
    SamplingParams p{.temperature = 0, .logprobs = 20};
    Sampler s(p, {}, 5000);
    const SampleResult r = s.sample(l);
    EXPECT_EQ(r.token, argmax(l));
    double max_l = -INFINITY, sum = 0.0;
    for (float x : l)
      if (!std::isnan(x)) max_l = std::max(max_l, double(x));
    for (float x : l)
      if (!std::isnan(x)) sum += std::exp(x - max_l);
    const double log_z = max_l + std::log(sum);
    EXPECT_NEAR(r.logprob, l[r.token] - log_z, 1e-5);
    std::vector<int32_t> ids(l.size());
    std::iota(ids.begin(), ids.end(), 0);
    auto key = [&](int32_t i) { return std::isnan(l[i]) ? -INFINITY : l[i]; };
    std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return key(a) != key(b) ? key(a) > key(b) : a < b; });
    ASSERT_EQ(r.top_logprobs.size(), 20u);
    for (size_t j = 0; j < 20; ++j) {
      EXPECT_EQ(r.top_logprobs[j].token, ids[j]) << j;
      EXPECT_NEAR(r.top_logprobs[j].logprob, l[ids[j]] - log_z, 1e-5);
    }
  }
  // Without logprobs and return_logprob off, the log_softmax pass is skipped.
  std::vector<float> l = {1.0f, 2.0f, 0.5f};
  Sampler quiet({.temperature = 0, .return_logprob = false}, {}, 3);
  const SampleResult r = quiet.sample(l);
  EXPECT_EQ(r.token, 1);
  EXPECT_EQ(r.logprob, 0.0f);
  EXPECT_TRUE(r.top_logprobs.empty());
}

TEST(SamplerReference, TopNMatchesAFullSortWithTies) {
  std::vector<float> l = {1.0f, 3.0f, NAN, 3.0f, -INFINITY, 2.0f, 3.0f, 0.0f};
  std::vector<std::pair<float, int32_t>> heap;
  std::vector<int32_t> out;
  top_n(l, 4, heap, out);
  EXPECT_EQ(out, (std::vector<int32_t>{1, 3, 6, 5}));
  top_n(l, 100, heap, out);  // more than the vocabulary: all; NaN counts as -inf, ties by id
  EXPECT_EQ(out, (std::vector<int32_t>{1, 3, 6, 5, 0, 7, 2, 4}));
}

TEST(SamplerReference, AllMaskedFallsBackToArgmax) {
  std::vector<float> l(100, -INFINITY);
  l[42] = NAN;
  Sampler s({.top_p = 0.5, .seed = 3}, {}, 100);
  EXPECT_EQ(s.sample(l).token, 0);  // argmax of all -inf: the lowest id
  l[17] = INFINITY;
  EXPECT_EQ(s.sample(l).token, 17);
}

}  // namespace
}  // namespace shardlm
