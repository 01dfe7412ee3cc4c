#include "loadgen/stats.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace shardlm::loadgen {

double mean_of(const std::vector<double>& xs) {
  if (xs.empty()) return 0.0;
  double sum = 0.0;
  for (double x : xs) sum += x;
  return sum / static_cast<double>(xs.size());
}

double std_of(const std::vector<double>& xs) {
  if (xs.empty()) return 0.0;
  double m = mean_of(xs);
  double ss = 0.0;
  for (double x : xs) ss += (x - m) * (x - m);
  return std::sqrt(ss / static_cast<double>(xs.size()));
}

double percentile_of(std::vector<double> xs, double p) {
  if (!(p >= 0.0 && p <= 100.0))
    fail(ErrorCode::kInvalidArgument, "percentile ", p, " is outside [0, 100]");
  if (xs.empty()) return 0.0;
  std::sort(xs.begin(), xs.end());
  double rank = p / 100.0 * static_cast<double>(xs.size() - 1);
  size_t lo = static_cast<size_t>(std::floor(rank));
  size_t hi = std::min(lo + 1, xs.size() - 1);
  double frac = rank - static_cast<double>(lo);
  // numpy's _lerp, including its switch to the upper end for t >= 0.5, so the
  // last bits agree too.
  double diff = xs[hi] - xs[lo];
  return frac >= 0.5 ? xs[hi] - diff * (1.0 - frac) : xs[lo] + diff * frac;
}

double median_of(const std::vector<double>& xs) { return percentile_of(xs, 50.0); }

}  // namespace shardlm::loadgen
