#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>

#include "core/error.h"
#include "engine/sampling_options.h"

namespace shardlm {
namespace {

std::vector<float> logits_from_probs(const std::vector<double>& p) {
  std::vector<float> l;
  for (double x : p) l.push_back(x > 0 ? float(std::log(x)) : -1e30f);
  return l;
}

std::map<int32_t, int> histogram(const std::vector<double>& probs, const SamplingOptions& o, int n) {
  std::map<int32_t, int> h;
  std::vector<int32_t> no_out;
  for (int i = 0; i < n; ++i) {
    auto l = logits_from_probs(probs);
    SamplingContext ctx;
    ctx.seed = uint64_t(i) * 7919;
    ++h[sample_token(l, o, ctx).token_id];
  }
  return h;
}

TEST(Sampling, GreedyAndBanned) {
  SamplingOptions o;
  o.temperature = 0;
  std::vector<float> l{0.1f, 3.0f, 2.0f};
  SamplingContext ctx;
  EXPECT_EQ(sample_token(l, o, ctx).token_id, 1);
  std::vector<int32_t> banned{1};
  ctx.banned_token_ids = banned;
  l = {0.1f, 3.0f, 2.0f};
  EXPECT_EQ(sample_token(l, o, ctx).token_id, 2);
}

TEST(Sampling, TemperatureFollowsTheDistribution) {
  SamplingOptions o;
  auto h = histogram({0.5, 0.3, 0.2}, o, 20000);
  EXPECT_NEAR(h[0] / 20000.0, 0.5, 0.02);
  EXPECT_NEAR(h[1] / 20000.0, 0.3, 0.02);
  EXPECT_NEAR(h[2] / 20000.0, 0.2, 0.02);
}

TEST(Sampling, TopKTopPMinPTruncate) {
  SamplingOptions o;
  o.top_k = 2;
  auto h = histogram({0.4, 0.3, 0.2, 0.1}, o, 5000);
  EXPECT_EQ(h.count(2) + h.count(3), 0u);
  EXPECT_NEAR(h[0] / 5000.0, 4.0 / 7.0, 0.03);
  o = {};
  o.top_p = 0.65f;  // 0.4 + 0.3 reaches it
  h = histogram({0.4, 0.3, 0.2, 0.1}, o, 5000);
  EXPECT_EQ(h.count(2) + h.count(3), 0u);
  o = {};
  o.min_p = 0.4f;  // keep p >= 0.16
  h = histogram({0.4, 0.3, 0.2, 0.1}, o, 5000);
  EXPECT_EQ(h.count(3), 0u);
  EXPECT_GT(h[2], 0);
}

TEST(Sampling, Penalties) {
  SamplingOptions o;
  o.temperature = 0;
  o.repetition_penalty = 2.0f;
  std::vector<int32_t> prompt{0};
  SamplingContext ctx;
  ctx.prompt_ids = prompt;
  std::vector<float> l{3.0f, 2.0f};
  EXPECT_EQ(sample_token(l, o, ctx).token_id, 1);  // 3/2 < 2
  o = {};
  o.temperature = 0;
  o.frequency_penalty = 0.6f;
  std::vector<int32_t> out{0, 0};
  ctx = {};
  ctx.output_ids = out;
  l = {3.0f, 2.0f};
  EXPECT_EQ(sample_token(l, o, ctx).token_id, 1);  // 3 - 1.2 < 2
  o.frequency_penalty = 0;
  o.presence_penalty = 0.9f;
  l = {3.0f, 2.0f};
  EXPECT_EQ(sample_token(l, o, ctx).token_id, 0);  // 3 - 0.9 > 2
}

TEST(Sampling, SeedDeterminesTheDraw) {
  SamplingOptions o;
  std::vector<double> p(50, 0.02);
  std::vector<int32_t> outs[2];
  for (int run = 0; run < 2; ++run)
    for (int i = 0; i < 20; ++i) {
      auto l = logits_from_probs(p);
      SamplingContext ctx;
      ctx.seed = 42;
      std::vector<int32_t> prev(i, 0);
      ctx.output_ids = prev;
      outs[run].push_back(sample_token(l, o, ctx).token_id);
    }
  EXPECT_EQ(outs[0], outs[1]);
  std::set<int32_t> distinct(outs[0].begin(), outs[0].end());
  EXPECT_GT(distinct.size(), 5u);
}

TEST(Sampling, ValidateNamesTheField) {
  SamplingOptions o;
  o.temperature = -1;
  try {
    validate(o, 10);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("temperature"), std::string::npos);
  }
  o = {};
  o.logprobs = 21;
  EXPECT_THROW(validate(o, 100), Error);
  o = {};
  o.repetition_penalty = 0;
  EXPECT_THROW(validate(o, 100), Error);
  EXPECT_NO_THROW(validate(SamplingOptions{}, 100));
}

}  // namespace
}  // namespace shardlm
