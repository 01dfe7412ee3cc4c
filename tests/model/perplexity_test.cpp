// perplexity_local: teacher-forced NLL through the decode path, windows, layouts, bad input.
#include "model/perplexity.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "model/generate.h"
#include "random_weights.h"

namespace shardlm {
namespace {

using testing::qwen25_7b_like;
using testing::random_weights;

double nll_of(const std::vector<float>& logits, int32_t target) {
  double mx = logits[0];
  for (float v : logits) mx = std::max(mx, static_cast<double>(v));
  double sum = 0.0;
  for (float v : logits) sum += std::exp(v - mx);
  return std::log(sum) - (logits[static_cast<size_t>(target)] - mx);
}

class Perplexity : public ::testing::Test {
 protected:
  ModelSpec spec = qwen25_7b_like(256, 2, 256, 96);
  std::shared_ptr<const WeightSource> weights = random_weights(spec, 11);
};

TEST_F(Perplexity, EqualsTheNllOfGeneratedTokensUnderTheirOwnLogits) {
  // Greedy generation from one token gives tokens t and the logits each came
  // from; the perplexity of [prompt, t...] must score exactly those logits.
  GenerateOptions g;
  g.max_tokens = 12;
  g.block_size = 4;
  const GenerateResult r = generate_local(spec, weights, {7}, g, /*keep_all_logits=*/true);
  ASSERT_EQ(r.step_logits.size(), 12u);
  double want = 0.0;
  for (size_t i = 0; i < r.tokens.size(); ++i) want += nll_of(r.step_logits[i], r.tokens[i]);
  std::vector<int32_t> ids = {7};
  ids.insert(ids.end(), r.tokens.begin(), r.tokens.end());
  PerplexityOptions p;
  p.block_size = 4;
  const PerplexityResult got = perplexity_local(spec, weights, ids, p);
  EXPECT_EQ(got.n_scored, 12);
  EXPECT_EQ(got.n_windows, 1);
  EXPECT_NEAR(got.nll_sum, want, 1e-9 * std::abs(want));
  EXPECT_NEAR(got.perplexity(), std::exp(want / 12), 1e-9 * got.perplexity());
}

TEST_F(Perplexity, WindowsScoreEveryTokenButTheFirstOnceAndMaxTokensStops) {
  const std::vector<int32_t> ids = {1, 5, 9, 2, 40, 41, 3, 77, 12, 8};
  PerplexityOptions p;
  p.context = 4;
  const PerplexityResult all = perplexity_local(spec, weights, ids, p);
  EXPECT_EQ(all.n_scored, 9);
  EXPECT_EQ(all.n_windows, 3);  // [0..4], [4..8], [8..9]
  // The first window alone equals a run over just its tokens.
  const PerplexityResult first = perplexity_local(spec, weights, {1, 5, 9, 2, 40}, p);
  p.max_scored = 4;
  const PerplexityResult capped = perplexity_local(spec, weights, ids, p);
  EXPECT_EQ(capped.n_scored, 4);
  EXPECT_EQ(capped.n_windows, 1);
  EXPECT_NEAR(capped.nll_sum, first.nll_sum, 1e-12);
  EXPECT_GT(all.nll_sum, first.nll_sum);
}

TEST_F(Perplexity, UnevenLayoutsGiveTheTp1Value) {
  const std::vector<int32_t> ids = {3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26};
  PerplexityOptions p;
  const double base = perplexity_local(spec, weights, ids, p).nll_sum;
  for (auto [tp, pp] : {std::pair{3, 2}, std::pair{5, 1}, std::pair{1, 2}}) {
    p.layout.tp = tp;
    p.layout.pp = pp;
    EXPECT_NEAR(perplexity_local(spec, weights, ids, p).nll_sum, base, 1e-4 * std::abs(base)) << tp << "x" << pp;
  }
}

TEST_F(Perplexity, RefusesBadInputWithTheReason) {
  PerplexityOptions p;
  EXPECT_THROW(perplexity_local(spec, weights, {4}, p), Error);
  try {
    perplexity_local(spec, weights, {4, 96}, p);
    FAIL() << "an id outside the vocabulary was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("outside the vocabulary"), std::string::npos) << e.what();
  }
  p.context = spec.max_position_embeddings + 1;
  try {
    perplexity_local(spec, weights, {4, 5}, p);
    FAIL() << "a context above max_position_embeddings was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--context"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardlm
