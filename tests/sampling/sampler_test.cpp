#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "sampling/sampler.h"
#include "sampling/token_mask.h"

namespace shardlm {
namespace {

// logits whose softmax is exactly {0.1, 0.2, 0.3, 0.4}.
std::vector<float> four_way() {
  return {std::log(1.0f), std::log(2.0f), std::log(3.0f), std::log(4.0f)};
}

std::string validate_message(const SamplingParams& p) {
  try {
    p.validate();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    return e.what();
  }
  return "";
}

TEST(SamplingParams, ValidationNamesTheParameter) {
  EXPECT_EQ(validate_message(SamplingParams{}), "");
  auto with = [](auto set) {
    SamplingParams p;
    set(p);
    return validate_message(p);
  };
  EXPECT_NE(with([](auto& p) { p.temperature = 2.5; }).find("temperature"), std::string::npos);
  EXPECT_NE(with([](auto& p) { p.temperature = -0.1; }).find("temperature"), std::string::npos);
  EXPECT_NE(with([](auto& p) { p.temperature = NAN; }).find("temperature"), std::string::npos);
  EXPECT_NE(with([](auto& p) { p.top_p = 0.0; }).find("top_p"), std::string::npos);
  EXPECT_NE(with([](auto& p) { p.top_p = 1.01; }).find("top_p"), std::string::npos);
  EXPECT_NE(with([](auto& p) { p.top_k = -2; }).find("top_k"), std::string::npos);
  EXPECT_NE(with([](auto& p) { p.min_p = 1.5; }).find("min_p"), std::string::npos);
  EXPECT_NE(with([](auto& p) { p.presence_penalty = 2.1; }).find("presence_penalty"), std::string::npos);
  EXPECT_NE(with([](auto& p) { p.frequency_penalty = -3; }).find("frequency_penalty"), std::string::npos);
  EXPECT_NE(with([](auto& p) { p.repetition_penalty = 0; }).find("repetition_penalty"), std::string::npos);
  EXPECT_NE(with([](auto& p) { p.logprobs = 21; }).find("logprobs"), std::string::npos);
  EXPECT_EQ(with([](auto& p) { p.top_k = 0; }), "");
  EXPECT_EQ(with([](auto& p) { p.temperature = 0; }), "");
  EXPECT_THROW(Sampler(SamplingParams{.temperature = 3}, {}, 4), Error);
}

TEST(Sampler, GreedyIsArgmaxLowestIdOnTies) {
  SamplingParams p{.temperature = 0};
  std::vector<int32_t> prompt;
  Sampler s(p, prompt, 5);
  std::vector<float> logits = {1.0f, 3.0f, NAN, 3.0f, -1.0f};
  EXPECT_EQ(s.sample(logits).token, 1);
  EXPECT_EQ(argmax(std::vector<float>{NAN, -INFINITY, -5.0f}), 2);
  EXPECT_EQ(s.output_ids(), std::vector<int32_t>{1});
}

TEST(Sampler, PenaltiesFollowVllmSemantics) {
  SamplingParams p{.presence_penalty = 0.2, .frequency_penalty = 0.1, .repetition_penalty = 2.0};
  std::vector<float> logits = {2.0f, -2.0f, 1.0f, 0.5f, 0.25f};
  std::vector<uint8_t> in_prompt = {1, 1, 0, 0, 0};
  std::unordered_map<int32_t, int32_t> out = {{2, 2}, {1, 1}};
  apply_penalties(p, logits, in_prompt, out);
  EXPECT_FLOAT_EQ(logits[0], 1.0f);                 // prompt, positive: / 2
  EXPECT_FLOAT_EQ(logits[1], -4.0f - 0.1f - 0.2f);  // prompt+output, negative: * 2, once; then 1x freq + presence
  EXPECT_FLOAT_EQ(logits[2], 0.5f - 0.2f - 0.2f);   // output twice: / 2, 2 x 0.1, presence 0.2
  EXPECT_FLOAT_EQ(logits[3], 0.5f);                 // untouched
  EXPECT_FLOAT_EQ(logits[4], 0.25f);
}

TEST(Sampler, GreedyAppliesRepetitionPenaltyToPromptAndOutput) {
  SamplingParams p{.temperature = 0, .repetition_penalty = 1.1};
  std::vector<int32_t> prompt = {0};
  Sampler s(p, prompt, 3);
  std::vector<float> logits = {3.0f, 2.9f, 2.8f};
  EXPECT_EQ(s.sample(logits).token, 1);  // 3 / 1.1 = 2.727 < 2.9
  EXPECT_EQ(s.sample(logits).token, 2);  // 1 is now an output token: 2.636 < 2.8
}

void expect_probs(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6) << "token " << i;
}

TEST(Sampler, DistributionAfterTemperatureTopKTopPMinP) {
  const auto l = four_way();
  expect_probs(sampling_distribution({}, l), {0.1, 0.2, 0.3, 0.4});
  expect_probs(sampling_distribution({.temperature = 0.5}, l), {1 / 30.0, 4 / 30.0, 9 / 30.0, 16 / 30.0});
  const double z = 1 + std::sqrt(2.0) + std::sqrt(3.0) + 2;  // p^(1/2), renormalised
  expect_probs(sampling_distribution({.temperature = 2.0}, l), {1 / z, std::sqrt(2.0) / z, std::sqrt(3.0) / z, 2 / z});
  expect_probs(sampling_distribution({.top_k = 2}, l), {0, 0, 3 / 7.0, 4 / 7.0});
  expect_probs(sampling_distribution({.top_k = 4}, l), {0.1, 0.2, 0.3, 0.4});
  expect_probs(sampling_distribution({.top_p = 0.5}, l), {0, 0, 3 / 7.0, 4 / 7.0});   // 0.4 < 0.5: keep 0.3 too
  expect_probs(sampling_distribution({.top_p = 0.35}, l), {0, 0, 0, 1});              // 0.4 >= 0.35 alone
  expect_probs(sampling_distribution({.top_p = 0.75}, l), {0, 2 / 9.0, 3 / 9.0, 4 / 9.0});
  expect_probs(sampling_distribution({.min_p = 0.55}, l), {0, 0, 3 / 7.0, 4 / 7.0});  // p < 0.22 dropped
  // top_p applies to what top_k left: {3/7, 4/7}; 4/7 >= 0.5 alone.
  expect_probs(sampling_distribution({.top_p = 0.5, .top_k = 2}, l), {0, 0, 0, 1});
}

TEST(Sampler, FrequenciesMatchTheDistribution) {
  const auto l = four_way();
  std::vector<int32_t> prompt;
  for (SamplingParams p : {SamplingParams{.seed = 42}, SamplingParams{.top_k = 3, .seed = 7},
                           SamplingParams{.temperature = 0.5, .seed = 9}}) {
    const std::vector<double> want = sampling_distribution(p, l);
    Sampler s(p, prompt, 4);
    const int n = 20000;
    std::vector<int> count(4, 0);
    for (int i = 0; i < n; ++i) ++count[s.sample(l).token];
    // Binomial std <= sqrt(0.25 / n) = 0.0035; 0.015 is > 4 sigma.
    for (int t = 0; t < 4; ++t) EXPECT_NEAR(count[t] / double(n), want[t], 0.015) << "token " << t;
    if (p.top_k == 3) {
      EXPECT_EQ(count[0], 0);
    }
  }
}

TEST(Sampler, SeededSequencesDoNotDependOnBatching) {
  const auto l = four_way();
  std::vector<int32_t> prompt = {1};
  SamplingParams p{.temperature = 1.0, .seed = 1234};
  Sampler alone(p, prompt, 4);
  std::vector<int32_t> a;
  for (int i = 0; i < 64; ++i) a.push_back(alone.sample(l).token);
  // Same seed, interleaved with other sequences sampling in between.
  Sampler batched(p, prompt, 4), other1({.seed = 1}, prompt, 4), other2({}, prompt, 4);
  std::vector<int32_t> b;
  for (int i = 0; i < 64; ++i) {
    other1.sample(l);
    b.push_back(batched.sample(l).token);
    other2.sample(l);
  }
  EXPECT_EQ(a, b);
  Sampler different({.temperature = 1.0, .seed = 1235}, prompt, 4);
  std::vector<int32_t> c;
  for (int i = 0; i < 64; ++i) c.push_back(different.sample(l).token);
  EXPECT_NE(a, c);
}

TEST(Sampler, LogprobsAreOfTheRawDistribution) {
  const auto l = four_way();
  std::vector<int32_t> prompt = {3};
  // Penalties, temperature and top_k change the choice, not the logprobs.
  Sampler s({.temperature = 0.3, .top_k = 1, .repetition_penalty = 2.0, .seed = 5, .logprobs = 3}, prompt, 4);
  const SampleResult r = s.sample(l);
  EXPECT_EQ(r.token, 2);  // log 4 / 2 = 0.69 < log 3 = 1.10
  EXPECT_NEAR(r.logprob, std::log(0.3), 1e-6);
  ASSERT_EQ(r.top_logprobs.size(), 3u);
  EXPECT_EQ(r.top_logprobs[0].token, 3);
  EXPECT_NEAR(r.top_logprobs[0].logprob, std::log(0.4), 1e-6);
  EXPECT_EQ(r.top_logprobs[1].token, 2);
  EXPECT_EQ(r.top_logprobs[2].token, 1);
  EXPECT_NEAR(r.top_logprobs[2].logprob, std::log(0.2), 1e-6);
}

TEST(Sampler, RejectsLogitsOfTheWrongSize) {
  std::vector<int32_t> prompt;
  Sampler s({}, prompt, 4);
  std::vector<float> logits(3, 0.0f);
  EXPECT_THROW(s.sample(logits), Error);
  EXPECT_THROW(Sampler({}, prompt, 0), Error);
}

}  // namespace
}  // namespace shardlm

TEST(TokenBitmask, MasksDisallowedAndUncoveredTokens) {
  std::vector<float> logits(70, 1.0f);
  std::vector<uint32_t> mask = {0xFFFFFFFFu, 0x00000005u};  // tokens 0..31, 32 and 34; 64+ uncovered
  shardlm::apply_token_bitmask(logits, mask);
  for (int t = 0; t < 70; ++t) {
    const bool allowed = t < 32 || t == 32 || t == 34;
    EXPECT_EQ(std::isinf(logits[size_t(t)]), !allowed) << t;
  }
}
