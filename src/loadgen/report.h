// Printing and saving a run the way `vllm bench serve` does: the same table
// ("============ Serving Benchmark Result ============", 40-column labels)
// and the same JSON keys (mean_ttft_ms, p99_itl_ms, ttfts, itls, ...), plus
// a few shardlm extras (base_url, interrupted, num_usage_missing, ...).
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>

#include "loadgen/runner.h"

namespace shardlm::loadgen {

// Notes that precede the table: failed-request errors (first 10, as vLLM),
// the chunk-count fallback, an interrupt.
std::string format_notes(const BenchmarkResult& result);
std::string format_result_table(const BenchmarkResult& result);
nlohmann::ordered_json result_to_json(const BenchmarkResult& result);  // keys in vLLM's order
// Writes result_to_json to path; throws kIo naming the path on failure.
void save_result_json(const BenchmarkResult& result, const std::string& path);

}  // namespace shardlm::loadgen
