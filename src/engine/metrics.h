// Engine metrics with vLLM's names and buckets, so existing Grafana
// dashboards work: written by the engine thread, read (snapshot or
// Prometheus text) from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace shardlm {

struct Histogram {
  std::vector<double> bounds;    // [n_buckets] upper bounds, ascending; +Inf is implicit
  std::vector<uint64_t> counts;  // [n_buckets + 1] per bucket (not cumulative); last = above every bound
  double sum = 0.0;
  uint64_t count = 0;
  explicit Histogram(std::vector<double> upper_bounds = {});
  void observe(double value);
};

struct MetricsSnapshot {
  int64_t num_requests_running = 0;      // sequences scheduled (gauge)
  int64_t num_requests_waiting = 0;      // sequences queued or preempted (gauge)
  double kv_cache_usage_perc = 0.0;      // fraction of KV blocks in use, [0, 1] (gauge)
  int64_t kv_blocks_in_use = 0;          // KV blocks referenced now (gauge; every rank of the replica holds them)
  int64_t kv_blocks_in_use_peak = 0;     // the most any step held since start (gauge)
  // Hybrid models (Gemma 3): the local (sliding-window) layers' own pool
  // (SchedulerStats::n_local_blocks_used); the two above count the global layers' pool.
  int64_t kv_local_blocks_in_use = 0;
  int64_t kv_local_blocks_in_use_peak = 0;
  int64_t prompt_tokens_total = 0;       // counters from here on
  int64_t generation_tokens_total = 0;
  int64_t num_preemptions_total = 0;
  int64_t kv_blocks_slid_total = 0;      // blocks released for leaving a sliding window (SchedulerStats::n_blocks_slid)
  int64_t prefix_cache_queries_total = 0;  // tokens
  int64_t prefix_cache_hits_total = 0;     // tokens
  int64_t pipeline_overlapped_batches_total = 0;  // submitted while an earlier batch was in the pipeline
  int64_t grammar_masks_deferred_total = 0;
  int64_t burst_holds_total = 0;            // times an idle engine held a burst's first submissions (engine/arrivals.h)
  double burst_hold_seconds_total = 0.0;    // how long those holds lasted, summed  // new grammar states whose masks were computed off the engine thread
  // Speculative decoding (vLLM's spec_decode_* counters), rendered while
  // spec_decode_positions > 0 (the engine's num_speculative_tokens).
  int32_t spec_decode_positions = 0;
  int64_t spec_decode_num_drafts_total = 0;          // sequence-steps that verified at least one draft
  int64_t spec_decode_num_draft_tokens_total = 0;    // tokens drafted (and verified)
  int64_t spec_decode_num_accepted_tokens_total = 0;  // drafts the target produced itself
  std::vector<int64_t> spec_decode_num_accepted_tokens_per_pos_total;  // [positions]: accepted at draft position i
  std::map<std::string, int64_t> request_success_total;  // by finished_reason: stop, length, abort
  // The model executor (rank group): failures that broke it, in-place
  // restarts that brought it back, whether it serves now, and the last
  // failure's message (names the rank) and recovery time.
  int64_t executor_failures_total = 0;
  int64_t executor_restarts_total = 0;
  bool executor_up = true;                       // gauge: 1 serving, 0 down or restarting
  double executor_last_recovery_seconds = 0.0;   // failure seen -> serving again (0: never restarted)
  std::string executor_last_failure;             // empty: never failed
  Histogram time_to_first_token_seconds;
  Histogram inter_token_latency_seconds;
  Histogram e2e_request_latency_seconds;
  MetricsSnapshot();
};

class Metrics {
 public:
  MetricsSnapshot snapshot() const;
  // Prometheus text exposition (version 0.0.4), names prefixed "vllm:",
  // each sample labelled model_name="..." when model_name is not empty.
  std::string render_prometheus(const std::string& model_name = "") const;

  // Engine-thread updates.
  template <typename F>
  void update(F&& f) {
    std::lock_guard<std::mutex> lock(mutex_);
    f(data_);
  }

 private:
  mutable std::mutex mutex_;
  MetricsSnapshot data_;
};

}  // namespace shardlm
