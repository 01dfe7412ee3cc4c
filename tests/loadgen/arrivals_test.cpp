#include <gtest/gtest.h>

#include <cmath>

#include "loadgen/arrivals.h"
#include "loadgen/stats.h"

namespace shardlm::loadgen {
namespace {

std::vector<double> gaps(const std::vector<double>& t) {
  std::vector<double> g;
  double prev = 0.0;
  for (double x : t) {
    g.push_back(x - prev);
    prev = x;
  }
  return g;
}

TEST(Arrivals, PoissonGapsHaveTheRequestedMeanAndExponentialSpread) {
  const double rate = 20.0;
  auto raw = poisson_arrival_times(4000, rate, 0, /*normalize=*/false);
  auto g = gaps(raw);
  EXPECT_NEAR(mean_of(g), 1.0 / rate, 0.05 / rate);  // within 5%
  // Exponential: std == mean (coefficient of variation 1).
  EXPECT_NEAR(std_of(g) / mean_of(g), 1.0, 0.08);
  // Median of an exponential is ln 2 / rate.
  EXPECT_NEAR(median_of(g), std::log(2.0) / rate, 0.1 / rate);
  for (size_t i = 1; i < raw.size(); ++i) EXPECT_GE(raw[i], raw[i - 1]);
}

TEST(Arrivals, NormalizedScheduleEndsAtNOverRateAsVllm) {
  auto t = poisson_arrival_times(200, 20.0, 0);
  EXPECT_NEAR(t.back(), 10.0, 1e-9);
  EXPECT_NEAR(mean_of(gaps(t)), 0.05, 1e-12);
  EXPECT_NEAR(std_of(gaps(t)) / mean_of(gaps(t)), 1.0, 0.25);
  EXPECT_EQ(poisson_arrival_times(200, 20.0, 0), t);  // seeded
  EXPECT_NE(poisson_arrival_times(200, 20.0, 1), t);
}

TEST(Arrivals, InfiniteRateSendsAllAtZero) {
  auto t = poisson_arrival_times(5, INFINITY, 3);
  EXPECT_EQ(t, std::vector<double>(5, 0.0));
  EXPECT_THROW(poisson_arrival_times(5, 0.0, 3), std::exception);
}

}  // namespace
}  // namespace shardlm::loadgen
