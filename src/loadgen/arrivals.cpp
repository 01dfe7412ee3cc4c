#include "loadgen/arrivals.h"

#include <cmath>
#include <random>

#include "core/error.h"

namespace shardlm::loadgen {

std::vector<double> poisson_arrival_times(int64_t n, double rate, uint64_t seed, bool normalize) {
  if (!(rate > 0.0))
    fail(ErrorCode::kInvalidArgument, "--request-rate must be positive or 'inf' (got ", rate, ")");
  std::vector<double> times(static_cast<size_t>(std::max<int64_t>(n, 0)), 0.0);
  if (std::isinf(rate) || times.empty()) return times;
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> gap(rate);
  double t = 0.0;
  for (auto& time : times) {
    t += gap(rng);
    time = t;
  }
  if (normalize && times.back() > 0.0) {
    double scale = (static_cast<double>(n) / rate) / times.back();
    for (auto& time : times) time *= scale;
  }
  return times;
}

}  // namespace shardlm::loadgen
