// Which rows a device sampler may take (sampling/device_sampling.h): each
// feature the device sampler lacks sends its row, and only its row, to the
// host, and each reason is logged once.
#include <gtest/gtest.h>

#include "core/error.h"
#include "sampling/device_sampling.h"

namespace shardlm {
namespace {

TEST(DeviceSamplingPlan, EachMissingFeatureSendsItsRowToTheHost) {
  SamplingParams plain, greedy_seeded, seeded, biased, lp;
  plain.temperature = 0.8;
  plain.top_k = 40;
  plain.top_p = 0.9;
  SamplingParams penalised;
  penalised.presence_penalty = 0.5;  // the kernel has them; their counts are not uploaded yet
  greedy_seeded.temperature = 0.0;
  greedy_seeded.seed = 7;        // greedy draws nothing: the seed changes nothing
  seeded.seed = 7;
  biased.logit_bias = {{5, -100.0f}};
  lp.logprobs = 3;
  const std::vector<RowSamplingNeeds> rows{
      {&plain}, {&seeded}, {&biased}, {&plain, /*grammar=*/true}, {&plain, false, /*banned_tokens=*/true},
      {&lp},    {&plain, false, false, /*logprobs=*/true},          {&greedy_seeded}, {&penalised}};
  const StepSamplingPlan p = plan_step_sampling(rows, /*device_sampler=*/true);
  EXPECT_EQ(p.device_rows, (std::vector<int64_t>{0, 7}));
  EXPECT_EQ(p.host_rows, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 8}));
  EXPECT_EQ(p.reasons, (std::vector<SamplingFallback>{SamplingFallback::kSeed, SamplingFallback::kLogitBias,
                                                      SamplingFallback::kGrammar, SamplingFallback::kBannedTokens,
                                                      SamplingFallback::kLogprobs, SamplingFallback::kLogprobs,
                                                      SamplingFallback::kPenalties}));
  EXPECT_FALSE(p.all_host());
}

TEST(DeviceSamplingPlan, WithoutADeviceSamplerEveryRowIsHost) {
  SamplingParams plain;
  const StepSamplingPlan p = plan_step_sampling({{&plain}, {&plain}}, /*device_sampler=*/false);
  EXPECT_TRUE(p.all_host());
  EXPECT_EQ(p.host_rows.size(), 2u);
  EXPECT_EQ(p.reasons[0], SamplingFallback::kNoDeviceSampler);
  EXPECT_TRUE(plan_step_sampling({}, true).all_host());  // nothing to sample
}

TEST(DeviceSamplingPlan, EachReasonIsLoggedOnce) {
  SamplingFallbackLog log;
  const std::string first = log.note(SamplingFallback::kLogitBias);
  EXPECT_NE(first.find("rows with logit_bias are sampled on the host"), std::string::npos) << first;
  EXPECT_EQ(log.note(SamplingFallback::kLogitBias), "");
  EXPECT_NE(log.note(SamplingFallback::kGrammar), "");
  EXPECT_EQ(log.note(SamplingFallback::kNone), "");
  EXPECT_EQ(log.note(SamplingFallback::kNoDeviceSampler), "");
  EXPECT_THROW(row_sampling_fallback(RowSamplingNeeds{}, true), Error);
}

}  // namespace
}  // namespace shardlm
