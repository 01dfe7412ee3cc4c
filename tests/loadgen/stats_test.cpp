#include <gtest/gtest.h>

#include "loadgen/metrics.h"
#include "loadgen/stats.h"

namespace shardlm::loadgen {
namespace {

// Values from numpy 1.24: np.percentile(xs, p) with the default method.
TEST(Stats, PercentileMatchesNumpyLinear) {
  std::vector<double> xs = {15, 20, 35, 40, 50};
  EXPECT_DOUBLE_EQ(percentile_of(xs, 50), 35.0);
  EXPECT_DOUBLE_EQ(percentile_of(xs, 90), 46.0);   // rank 3.6: 40 + 0.6*10
  EXPECT_DOUBLE_EQ(percentile_of(xs, 99), 49.6);   // rank 3.96
  EXPECT_DOUBLE_EQ(percentile_of(xs, 25), 20.0);   // rank 1
  EXPECT_DOUBLE_EQ(percentile_of(xs, 0), 15.0);
  EXPECT_DOUBLE_EQ(percentile_of(xs, 100), 50.0);
  std::vector<double> unsorted = {3, 1, 4, 1, 5, 9, 2, 6};
  EXPECT_DOUBLE_EQ(percentile_of(unsorted, 50), 3.5);
  EXPECT_NEAR(percentile_of(unsorted, 99), 8.79, 1e-12);  // sorted[6]=6, [7]=9, rank 6.93
  EXPECT_DOUBLE_EQ(percentile_of({7.0}, 99), 7.0);
  EXPECT_DOUBLE_EQ(percentile_of({}, 99), 0.0);  // vLLM: np.percentile(xs or 0)
  EXPECT_THROW(percentile_of(xs, 101), std::exception);
}

TEST(Stats, MeanMedianPopulationStd) {
  std::vector<double> xs = {2, 4, 4, 4, 5, 5, 7, 9};
  EXPECT_DOUBLE_EQ(mean_of(xs), 5.0);
  EXPECT_DOUBLE_EQ(std_of(xs), 2.0);  // ddof=0
  EXPECT_DOUBLE_EQ(median_of(xs), 4.5);
  EXPECT_DOUBLE_EQ(mean_of({}), 0.0);
  EXPECT_DOUBLE_EQ(std_of({}), 0.0);
}

RequestOutput ok(double start, double ttft, std::vector<double> itl, int64_t out_tokens, int64_t prompt) {
  RequestOutput o;
  o.success = true;
  o.start_time = start;
  o.ttft = ttft;
  o.itl = std::move(itl);
  o.latency = ttft;
  for (double g : o.itl) o.latency += g;
  o.output_tokens = out_tokens;
  o.usage_reported = true;
  o.n_chunks = static_cast<int64_t>(o.itl.size()) + 1;
  o.prompt_len = prompt;
  return o;
}

// Hand-computed against vLLM's calculate_metrics for the same three outputs.
TEST(Metrics, MatchesHandComputedValues) {
  std::vector<RequestOutput> outs;
  outs.push_back(ok(0.0, 0.100, {0.010, 0.030}, 3, 10));  // latency 0.14, tpot 0.02
  outs.push_back(ok(0.5, 0.300, {0.020}, 2, 20));         // latency 0.32, tpot 0.02
  outs.push_back(ok(1.2, 0.200, {}, 1, 30));              // latency 0.2, no tpot
  RequestOutput bad;
  bad.error = "HTTP 500: boom";
  outs.push_back(bad);
  BenchmarkMetrics m = calculate_metrics(outs, 2.0, {50, 99});
  EXPECT_EQ(m.completed, 3);
  EXPECT_EQ(m.failed, 1);
  EXPECT_EQ(m.total_input, 60);
  EXPECT_EQ(m.total_output, 6);
  EXPECT_EQ(m.output_lens, (std::vector<int64_t>{3, 2, 1, 0}));
  EXPECT_DOUBLE_EQ(m.request_throughput, 1.5);
  EXPECT_DOUBLE_EQ(m.output_throughput, 3.0);
  EXPECT_DOUBLE_EQ(m.total_token_throughput, 33.0);
  EXPECT_NEAR(m.ttft.mean_ms, 200.0, 1e-9);
  EXPECT_NEAR(m.ttft.median_ms, 200.0, 1e-9);
  EXPECT_NEAR(m.ttft.std_ms, 81.6496580927726, 1e-9);  // np.std([.1,.3,.2])*1000
  EXPECT_NEAR(m.ttft.percentile_ms(99), 298.0, 1e-9);   // rank 1.98 over [100,200,300]
  EXPECT_NEAR(m.tpot.mean_ms, 20.0, 1e-9);
  EXPECT_NEAR(m.itl.mean_ms, 20.0, 1e-9);               // [10, 30, 20]
  EXPECT_NEAR(m.itl.percentile_ms(50), 20.0, 1e-9);
  EXPECT_NEAR(m.itl.percentile_ms(99), 29.8, 1e-9);
  EXPECT_NEAR(m.e2el.mean_ms, (140.0 + 320.0 + 200.0) / 3, 1e-9);
  // Chunks at 0.1, 0.11, 0.14, 0.8, 0.82 fall in second 0 and 1.4 in second 1.
  EXPECT_DOUBLE_EQ(m.max_output_tokens_per_s, 5.0);
  // [0, .14) [.5, .82) [1.2, 1.4): never overlap.
  EXPECT_EQ(m.max_concurrent_requests, 1);
}

TEST(Metrics, PeakConcurrencyAndChunkFallback) {
  std::vector<RequestOutput> outs;
  for (int i = 0; i < 4; ++i) outs.push_back(ok(0.1 * i, 0.5, {0.1, 0.1}, 3, 5));
  outs[3].usage_reported = false;  // counted as its 3 chunks
  outs[3].output_tokens = 0;
  BenchmarkMetrics m = calculate_metrics(outs, 1.0, {99});
  EXPECT_EQ(m.max_concurrent_requests, 4);  // all overlap at t = 0.3..0.7
  EXPECT_EQ(m.n_usage_missing, 1);
  EXPECT_EQ(m.total_output, 12);
  EXPECT_EQ(percentile_word(99), "99");
  EXPECT_EQ(percentile_word(99.9), "99.9");
}

}  // namespace
}  // namespace shardlm::loadgen
