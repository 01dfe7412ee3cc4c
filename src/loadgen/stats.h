// Summary statistics with numpy's conventions, so our numbers equal what
// `vllm bench serve` prints for the same samples: np.percentile's default
// "linear" method, np.std with ddof=0, and 0 for an empty sample (vLLM
// evaluates np.mean(xs or 0)).
#pragma once

#include <vector>

namespace shardlm::loadgen {

double mean_of(const std::vector<double>& xs);
double std_of(const std::vector<double>& xs);  // population (ddof=0)
// p in [0, 100]; rank = p/100 * (n-1), linear between the neighbours.
double percentile_of(std::vector<double> xs, double p);
double median_of(const std::vector<double>& xs);

}  // namespace shardlm::loadgen
