// --sweep-concurrency: one run per max-concurrency value, a summary table,
// and a gnuplot PNG of output throughput against p99 TTFT and p99 TPOT.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "loadgen/runner.h"

namespace shardlm::loadgen {

struct SweepPoint {
  int64_t concurrency = 0;
  BenchmarkResult result;
};

// Parses "1,2,4,8"; throws kInvalidArgument naming `flag` on a bad list.
std::vector<int64_t> parse_int_list(const std::string& text, const std::string& flag);
std::vector<double> parse_double_list(const std::string& text, const std::string& flag);

// Runs each concurrency in turn (percentiles gain 99 if absent, for the
// table). `before_each` lets the caller print a header per run. Stops early
// when hooks.stop is set, keeping the points measured so far.
std::vector<SweepPoint> run_sweep(const BenchConfig& config, const std::vector<SampleRequest>& requests,
                                  const std::vector<int64_t>& concurrencies, const RunHooks& hooks,
                                  const std::function<void(int64_t concurrency)>& before_each = {},
                                  const std::function<void(const SweepPoint&)>& after_each = {});

// As above, with the requests of point i (0-based, in sweep order) from
// make_requests(i). `shardlm bench` draws a synthetic dataset with seed + i
// there, so that no point replays the prompts of an earlier one and measures
// the server's prefix cache instead of its prefill.
std::vector<SweepPoint> run_sweep(const BenchConfig& config,
                                  const std::function<std::vector<SampleRequest>(size_t point)>& make_requests,
                                  const std::vector<int64_t>& concurrencies, const RunHooks& hooks,
                                  const std::function<void(int64_t concurrency)>& before_each = {},
                                  const std::function<void(const SweepPoint&)>& after_each = {});

// Columns: concurrency, req/s, output tok/s, p99 TTFT (ms), p99 TPOT (ms), failed.
std::string format_sweep_table(const std::vector<SweepPoint>& points);

// Writes PNG_PATH plus its inputs PNG_PATH.dat and PNG_PATH.gp (rerun with
// `gnuplot PNG_PATH.gp`). Throws kNotFound when gnuplot is missing.
void write_sweep_plot(const std::vector<SweepPoint>& points, const std::string& png_path,
                      const std::string& title);

}  // namespace shardlm::loadgen
