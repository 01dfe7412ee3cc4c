// When each request is issued, as vLLM's get_request() schedules them:
// exponential inter-arrival gaps (a Poisson process) at `rate` req/s, the
// cumulative times rescaled so the last arrival lands at n/rate exactly
// (vLLM does this so runs with different seeds have the same offered load);
// rate = inf sends everything at t = 0.
#pragma once

#include <cstdint>
#include <vector>

namespace shardlm::loadgen {

// [n] seconds from the start of the run, non-decreasing.
std::vector<double> poisson_arrival_times(int64_t n, double rate, uint64_t seed,
                                          bool normalize = true);

}  // namespace shardlm::loadgen
