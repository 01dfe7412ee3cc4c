#include <gtest/gtest.h>

#include "engine/metrics.h"

namespace shardlm {
namespace {

TEST(Metrics, PrometheusTextWithVllmNames) {
  Metrics m;
  m.update([](MetricsSnapshot& s) {
    s.num_requests_running = 3;
    s.kv_cache_usage_perc = 0.25;
    s.generation_tokens_total = 17;
    ++s.request_success_total["stop"];
    s.time_to_first_token_seconds.observe(0.003);
    s.time_to_first_token_seconds.observe(0.2);
    s.time_to_first_token_seconds.observe(5000.0);
  });
  std::string t = m.render_prometheus("qwen\"x");
  EXPECT_NE(t.find("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"qwen\\\"x\"} 3\n"),
            std::string::npos) << t;
  EXPECT_NE(t.find("vllm:kv_cache_usage_perc{model_name=\"qwen\\\"x\"} 0.25\n"), std::string::npos);
  EXPECT_NE(t.find("vllm:generation_tokens_total{model_name=\"qwen\\\"x\"} 17\n"), std::string::npos);
  EXPECT_NE(t.find("vllm:request_success_total{model_name=\"qwen\\\"x\",finished_reason=\"stop\"} 1\n"), std::string::npos);
  // Cumulative buckets: 0.003 falls in le=0.005; 0.2 in le=0.25; 5000 only in +Inf.
  EXPECT_NE(t.find("vllm:time_to_first_token_seconds_bucket{model_name=\"qwen\\\"x\",le=\"0.001\"} 0\n"), std::string::npos);
  EXPECT_NE(t.find("vllm:time_to_first_token_seconds_bucket{model_name=\"qwen\\\"x\",le=\"0.005\"} 1\n"), std::string::npos) << t;
  EXPECT_NE(t.find("le=\"2560\"} 2\n"), std::string::npos);
  EXPECT_NE(t.find("vllm:time_to_first_token_seconds_bucket{model_name=\"qwen\\\"x\",le=\"+Inf\"} 3\n"), std::string::npos);
  EXPECT_NE(t.find("vllm:time_to_first_token_seconds_count{model_name=\"qwen\\\"x\"} 3\n"), std::string::npos);
  EXPECT_NE(t.find("# TYPE vllm:e2e_request_latency_seconds histogram"), std::string::npos);
  std::string plain = Metrics().render_prometheus();
  EXPECT_NE(plain.find("vllm:num_preemptions_total 0\n"), std::string::npos);
}

}  // namespace
}  // namespace shardlm
