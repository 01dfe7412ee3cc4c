// Per-request measurements and the aggregate metrics of one benchmark run,
// defined exactly as vLLM's `vllm bench serve` (vllm/benchmarks/serve.py,
// calculate_metrics) defines them, so results can be compared side by side:
//   ttft  send → first chunk carrying `choices`
//   itl   every gap between successive `choices` chunks
//   tpot  (latency − ttft) / (output_tokens − 1), only for output_tokens > 1
//   e2el  send → last `choices` chunk (the trailing usage chunk is not a token)
// Times are seconds in RequestOutput and milliseconds in the summaries.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace shardlm::loadgen {

struct RequestOutput {
  bool success = false;
  std::string error;            // empty on success
  double start_time = 0.0;      // s since the run began, when the request was sent
  double queue_time = 0.0;      // s waited for a --max-concurrency slot
  double ttft = 0.0;            // s
  double latency = 0.0;         // s
  std::vector<double> itl;      // s, [n_chunks - 1]
  int64_t prompt_len = 0;       // usage.prompt_tokens, else the dataset's estimate
  int64_t output_tokens = 0;    // usage.completion_tokens; 0 when the server sent no usage
  int64_t n_chunks = 0;         // chunks that carried `choices`
  bool usage_reported = false;  // the server sent a usage object
  bool tokens_counted_locally = false;  // no usage: output_tokens from the model's tokenizer
  bool cancelled = false;       // cut off by an interrupt: excluded from all metrics
  std::string generated_text;
};

struct MetricSummary {
  double mean_ms = 0.0;
  double median_ms = 0.0;
  double std_ms = 0.0;
  std::vector<std::pair<double, double>> percentiles_ms;  // (p, value)
  double percentile_ms(double p) const;  // one of the selected ones; 0 if absent
};

struct BenchmarkMetrics {
  int64_t completed = 0;
  int64_t failed = 0;
  int64_t total_input = 0;
  int64_t total_output = 0;
  double request_throughput = 0.0;      // req/s
  double output_throughput = 0.0;       // tok/s
  double total_token_throughput = 0.0;  // tok/s
  MetricSummary ttft, tpot, itl, e2el;
  double max_output_tokens_per_s = 0.0;  // busiest 1-s bucket of chunk arrivals
  int64_t max_concurrent_requests = 0;   // peak overlap of [start, start + latency)
  // Successful requests without server usage: their output length is the
  // number of chunks (vLLM would retokenize the text; we have no tokenizer).
  int64_t n_usage_missing = 0;
  std::vector<int64_t> output_lens;  // [n_requests], 0 for failed ones
};

BenchmarkMetrics calculate_metrics(const std::vector<RequestOutput>& outputs, double duration_s,
                                   const std::vector<double>& percentiles);

// "99" for 99.0, "99.9" otherwise — the key spelling vLLM uses (p99_ttft_ms).
std::string percentile_word(double p);

}  // namespace shardlm::loadgen
