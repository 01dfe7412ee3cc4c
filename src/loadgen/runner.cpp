#include "loadgen/runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "core/error.h"
#include "loadgen/arrivals.h"

namespace shardlm::loadgen {

std::string resolve_model(const BenchConfig& config) {
  ServerUrl url = parse_server_url(config.base_url);
  probe_server(url, std::max(1.0, config.client.connect_timeout_s));
  if (!config.model.empty()) return config.model;
  return fetch_first_model(url, config.client);
}

namespace {

using Clock = std::chrono::steady_clock;

struct Pending {
  size_t index;
  double arrival_s;
};

struct SharedState {
  std::mutex mu;
  std::condition_variable work_cv;
  std::condition_variable done_cv;
  std::deque<Pending> queue;
  bool closing = false;
  int64_t n_idle = 0;
  int64_t n_sent = 0;
  int64_t n_done = 0;
  int64_t n_failed = 0;
  std::vector<std::optional<RequestOutput>> results;
  std::vector<OpenAiClient*> clients;
};

}  // namespace

BenchmarkResult run_benchmark(const BenchConfig& config, const std::vector<SampleRequest>& requests,
                              const RunHooks& hooks) {
  if (requests.empty()) fail(ErrorCode::kInvalidArgument, "no requests to send (--num-prompts is 0?)");
  if (config.max_concurrency < 0)
    fail(ErrorCode::kInvalidArgument, "--max-concurrency must be positive (got ", config.max_concurrency, ")");
  for (double p : config.percentiles)
    if (!(p > 0.0 && p < 100.0))
      fail(ErrorCode::kInvalidArgument, "--percentiles values must be in (0, 100) (got ", p, ")");
  ServerUrl url = parse_server_url(config.base_url);

  BenchmarkResult result;
  result.base_url = url.display();
  result.model = resolve_model(config);
  result.endpoint = config.endpoint;
  result.request_rate = config.request_rate;
  result.max_concurrency = config.max_concurrency;
  result.n_prompts = static_cast<int64_t>(requests.size());
  result.percentiles = config.percentiles;

  RequestSpec spec;
  spec.endpoint = config.endpoint;
  spec.model = result.model;
  spec.ignore_eos = config.ignore_eos;
  spec.extra_body = config.extra_body;
  for (const auto& r : requests) build_payload(spec, r);  // reject bad combinations before sending

  // Before the first request: a server that speculates counts from here.
  const std::optional<SpecDecodeCounters> spec_before = fetch_spec_decode_counters(url, config.client);

  const int64_t n = static_cast<int64_t>(requests.size());
  std::vector<double> arrivals = poisson_arrival_times(n, config.request_rate, config.seed);
  const int64_t worker_limit = config.max_concurrency > 0 ? config.max_concurrency : std::min(n, kMaxWorkers);

  SharedState state;
  state.results.resize(requests.size());
  std::vector<std::thread> workers;
  const Clock::time_point epoch = Clock::now();

  auto worker_main = [&]() {
    OpenAiClient client(url, config.client);
    {
      std::lock_guard<std::mutex> lock(state.mu);
      state.clients.push_back(&client);
    }
    for (;;) {
      Pending job;
      {
        std::unique_lock<std::mutex> lock(state.mu);
        state.work_cv.wait(lock, [&] { return !state.queue.empty() || state.closing; });
        if (state.closing) break;
        job = state.queue.front();
        state.queue.pop_front();
        --state.n_idle;
        ++state.n_sent;
      }
      RequestOutput out = client.send(spec, requests[job.index], epoch);
      out.queue_time = std::max(0.0, out.start_time - job.arrival_s);
      std::lock_guard<std::mutex> lock(state.mu);
      if (!out.success && !out.cancelled) ++state.n_failed;
      state.results[job.index] = std::move(out);
      ++state.n_done;
      ++state.n_idle;
      state.done_cv.notify_all();
    }
    std::lock_guard<std::mutex> lock(state.mu);
    state.clients.erase(std::find(state.clients.begin(), state.clients.end(), &client));
  };

  auto snapshot = [&](double elapsed) {
    ProgressSnapshot s;
    s.n_total = n;
    s.n_sent = state.n_sent;
    s.n_done = state.n_done;
    s.n_failed = state.n_failed;
    s.n_in_flight = state.n_sent - state.n_done;
    s.elapsed_s = elapsed;
    return s;
  };

  size_t next = 0;
  Clock::time_point last_progress = epoch;
  bool interrupted = false;
  {
    std::unique_lock<std::mutex> lock(state.mu);
    for (;;) {
      if (hooks.stop != nullptr && hooks.stop->load()) {
        interrupted = true;
        break;
      }
      double now_s = std::chrono::duration<double>(Clock::now() - epoch).count();
      while (next < requests.size() && arrivals[next] <= now_s) {
        state.queue.push_back({next, arrivals[next]});
        if (static_cast<int64_t>(state.queue.size()) > state.n_idle &&
            static_cast<int64_t>(workers.size()) < worker_limit) {
          ++state.n_idle;
          workers.emplace_back(worker_main);
        }
        state.work_cv.notify_one();
        ++next;
      }
      if (next == requests.size() && state.n_done == n) break;
      if (hooks.on_progress && Clock::now() - last_progress >= std::chrono::milliseconds(100)) {
        last_progress = Clock::now();
        auto s = snapshot(now_s);
        lock.unlock();
        hooks.on_progress(s);
        lock.lock();
        continue;
      }
      double wait_s = 0.1;
      if (next < requests.size()) wait_s = std::min(wait_s, std::max(0.0, arrivals[next] - now_s));
      state.done_cv.wait_for(lock, std::chrono::duration<double>(wait_s));
    }
    result.duration_s = std::chrono::duration<double>(Clock::now() - epoch).count();
    state.closing = true;
    state.queue.clear();
    if (interrupted)
      for (OpenAiClient* c : state.clients) c->cancel();
    state.work_cv.notify_all();
    if (hooks.on_progress) {
      auto s = snapshot(result.duration_s);
      lock.unlock();
      hooks.on_progress(s);
    }
  }
  for (auto& w : workers) w.join();
  if (std::optional<SpecDecodeCounters> after = fetch_spec_decode_counters(url, config.client))
    result.spec_decode = after->minus(spec_before.value_or(SpecDecodeCounters{}));

  result.interrupted = interrupted;
  for (auto& r : state.results) {
    if (r && !r->cancelled)
      result.outputs.push_back(std::move(*r));
    else
      ++result.n_not_completed;
  }
  if (config.count_output_tokens) {
    for (auto& o : result.outputs) {
      if (!o.success || o.usage_reported) continue;
      o.output_tokens = config.count_output_tokens(o.generated_text);
      o.tokens_counted_locally = true;
    }
  }
  result.metrics = calculate_metrics(result.outputs, result.duration_s, config.percentiles);
  return result;
}

}  // namespace shardlm::loadgen
