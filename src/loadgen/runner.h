// One benchmark run: issue the requests at their arrival times (Poisson or
// all at once), at most max_concurrency in flight, stream every response,
// and compute vLLM-compatible metrics. The dispatch and bookkeeping run on
// the calling thread; each in-flight request owns a worker thread and a
// keep-alive connection (a --max-concurrency N run uses N workers).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "loadgen/dataset.h"
#include "loadgen/http_client.h"
#include "loadgen/metrics.h"
#include "loadgen/spec_decode.h"

namespace shardlm::loadgen {

struct BenchConfig {
  std::string base_url = "http://127.0.0.1:8000";
  std::string model;  // empty: the first id of GET /v1/models
  Endpoint endpoint = Endpoint::kChat;
  ClientOptions client;
  double request_rate = std::numeric_limits<double>::infinity();  // req/s
  int64_t max_concurrency = 0;                                    // 0: unlimited
  uint64_t seed = 0;                                              // arrival times
  std::vector<double> percentiles = {50, 90, 99};
  bool ignore_eos = false;
  nlohmann::json extra_body;  // merged into every request body
  // Counts the tokens of a generated text (the model's tokenizer, --tokenizer):
  // used for responses that carried no usage. Unset: count streamed chunks.
  std::function<int64_t(const std::string&)> count_output_tokens;
};

struct ProgressSnapshot {
  int64_t n_total = 0;
  int64_t n_sent = 0;       // requests that left the client
  int64_t n_done = 0;       // finished, successful or not
  int64_t n_failed = 0;
  int64_t n_in_flight = 0;
  double elapsed_s = 0.0;
};

struct RunHooks {
  const std::atomic<bool>* stop = nullptr;  // set (e.g. by SIGINT) to stop sending and cut off
  std::function<void(const ProgressSnapshot&)> on_progress;  // ~10 Hz, on the calling thread
};

struct BenchmarkResult {
  std::string base_url;
  std::string model;
  Endpoint endpoint = Endpoint::kChat;
  double request_rate = 0.0;
  int64_t max_concurrency = 0;
  int64_t n_prompts = 0;
  std::vector<double> percentiles;
  double duration_s = 0.0;
  bool interrupted = false;
  int64_t n_not_completed = 0;         // never sent or cut off by the interrupt
  std::vector<RequestOutput> outputs;  // finished requests (successful or failed), dataset order
  BenchmarkMetrics metrics;
  // The server's speculative-decoding counters over the run (its /metrics read
  // before and after; other clients' traffic in that window counts too);
  // absent when the server exports none.
  std::optional<SpecDecodeCounters> spec_decode;
};

// Above this many requests in flight we stop adding threads (--max-concurrency unset).
inline constexpr int64_t kMaxWorkers = 1024;

// Probes the server (a refused connection throws the "is the server
// running?" error) and returns config.model or the server's first model.
std::string resolve_model(const BenchConfig& config);

// Runs the requests. Throws only for setup problems (bad URL, dead server,
// model query); failed requests are counted in the result.
BenchmarkResult run_benchmark(const BenchConfig& config, const std::vector<SampleRequest>& requests,
                              const RunHooks& hooks = {});

}  // namespace shardlm::loadgen
