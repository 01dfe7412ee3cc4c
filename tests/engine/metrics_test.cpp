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

TEST(Metrics, ExecutorRestartsAndTheLastFailure) {
  Metrics m;
  std::string plain = m.render_prometheus();
  EXPECT_NE(plain.find("# TYPE shardlm:executor_restarts_total counter\nshardlm:executor_restarts_total 0\n"),
            std::string::npos) << plain;
  EXPECT_NE(plain.find("shardlm:executor_up 1\n"), std::string::npos) << plain;
  EXPECT_EQ(plain.find("executor_last_failure_info"), std::string::npos) << "no failure yet, no reason";
  // A reason with quotes and a newline, longer than the 200-byte cut, with
  // a two-byte UTF-8 character straddling the cut.
  std::string reason = "rank 2 (tp 0, pp 1) failed: \"boom\"\n" + std::string(200 - 36, 'x') + "\xC3\xA9tail";
  m.update([&](MetricsSnapshot& s) {
    s.executor_failures_total = 2;
    s.executor_restarts_total = 1;
    s.executor_up = false;
    s.executor_last_recovery_seconds = 0.125;
    s.executor_last_failure = reason;
  });
  std::string t = m.render_prometheus("m");
  EXPECT_NE(t.find("shardlm:executor_failures_total{model_name=\"m\"} 2\n"), std::string::npos) << t;
  EXPECT_NE(t.find("shardlm:executor_restarts_total{model_name=\"m\"} 1\n"), std::string::npos) << t;
  EXPECT_NE(t.find("shardlm:executor_up{model_name=\"m\"} 0\n"), std::string::npos) << t;
  EXPECT_NE(t.find("shardlm:executor_last_recovery_seconds{model_name=\"m\"} 0.125\n"), std::string::npos) << t;
  const std::string want = "shardlm:executor_last_failure_info{model_name=\"m\",reason=\"rank 2 (tp 0, pp 1) failed: "
                           "\\\"boom\\\"\\n" + std::string(200 - 36, 'x') + "\"} 1\n";
  EXPECT_NE(t.find(want), std::string::npos) << t;
}

}  // namespace
}  // namespace shardlm
