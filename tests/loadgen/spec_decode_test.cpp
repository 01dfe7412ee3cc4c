// The speculative-decoding counters `shardlm bench` reads from /metrics.
#include "loadgen/spec_decode.h"

#include <gtest/gtest.h>

namespace shardlm::loadgen {
namespace {

TEST(SpecDecodeCounters, ParsesVllmNamesSummingLabelSetsAndPositions) {
  const std::string text =
      "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.\n"
      "# TYPE vllm:spec_decode_num_drafts_total counter\n"
      "vllm:spec_decode_num_drafts_total{model_name=\"a\"} 10\n"
      "vllm:spec_decode_num_drafts_total{model_name=\"b\"} 5\r\n"
      "vllm:spec_decode_num_draft_tokens_total{model_name=\"a\"} 40\n"
      "vllm:spec_decode_num_accepted_tokens_total{model_name=\"a\"} 2.5e1\n"
      "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"a\",position=\"1\"} 7\n"
      "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"a\",position=\"0\"} 9\n"
      "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"b\",position=\"0\"} 1\n"
      "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"b\",xposition=\"3\"} 99\n"
      "vllm:spec_decode_num_drafts_total_other 1000\n"
      "vllm:num_requests_running{model_name=\"a\"} 3\n"
      "vllm:spec_decode_num_draft_tokens_total{model_name=\"a\"} NaN\n"
      "vllm:spec_decode_num_draft_tokens_total{model_name=\"a\"}\n";
  auto c = parse_spec_decode_counters(text);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->drafts, 15.0);
  EXPECT_EQ(c->draft_tokens, 40.0);
  EXPECT_EQ(c->accepted_tokens, 25.0);
  ASSERT_EQ(c->accepted_per_position.size(), 2u);
  EXPECT_EQ(c->accepted_per_position[0], 10.0);
  EXPECT_EQ(c->accepted_per_position[1], 7.0);
  EXPECT_DOUBLE_EQ(c->acceptance_rate(), 25.0 / 40.0);
  EXPECT_DOUBLE_EQ(c->acceptance_length(), 1.0 + 25.0 / 15.0);
}

TEST(SpecDecodeCounters, AbsentWithoutTheCountersAndSubtractsARun) {
  EXPECT_FALSE(parse_spec_decode_counters("vllm:num_requests_running 0\n# nothing else\n").has_value());
  EXPECT_FALSE(parse_spec_decode_counters("").has_value());
  SpecDecodeCounters before{4, 16, 8, {5, 3}}, after{10, 40, 30, {9, 7, 2}};
  SpecDecodeCounters d = after.minus(before);
  EXPECT_EQ(d.drafts, 6.0);
  EXPECT_EQ(d.draft_tokens, 24.0);
  EXPECT_EQ(d.accepted_tokens, 22.0);
  EXPECT_EQ(d.accepted_per_position, (std::vector<double>{4, 4, 2}));
  EXPECT_EQ(SpecDecodeCounters{}.acceptance_rate(), 0.0);
  EXPECT_EQ(SpecDecodeCounters{}.acceptance_length(), 0.0);
}

}  // namespace
}  // namespace shardlm::loadgen
