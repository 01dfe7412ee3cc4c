#include "engine/metrics.h"

#include <algorithm>
#include <charconv>
#include <sstream>

namespace shardlm {

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds(std::move(upper_bounds)), counts(bounds.size() + 1, 0) {}

void Histogram::observe(double value) {
  size_t i = std::lower_bound(bounds.begin(), bounds.end(), value) - bounds.begin();  // le semantics
  ++counts[i];
  sum += value;
  ++count;
}

// Bucket bounds as vLLM's prometheus logger (v0.8+).
MetricsSnapshot::MetricsSnapshot()
    : time_to_first_token_seconds({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                                   5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}),
      inter_token_latency_seconds({0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                                   5.0, 7.5, 10.0, 20.0, 40.0, 80.0}),
      e2e_request_latency_seconds({0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}) {}

MetricsSnapshot Metrics::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return data_;
}

namespace {

std::string num(double v) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v);  // shortest round-trip form: 0.005, 2560
  return std::string(buf, res.ptr);
}

std::string escape_label(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') { out += "\\n"; continue; }
    out += c;
  }
  return out;
}

class Writer {
 public:
  explicit Writer(const std::string& model) : base_(model.empty() ? "" : "model_name=\"" + escape_label(model) + "\"") {}
  void head(const std::string& name, const char* type, const char* help) {
    out_ << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
  }
  void sample(const std::string& name, double v, const std::string& extra = "") {
    std::string labels = base_;
    if (!extra.empty()) labels += (labels.empty() ? "" : ",") + extra;
    out_ << name;
    if (!labels.empty()) out_ << '{' << labels << '}';
    out_ << ' ' << num(v) << '\n';
  }
  void gauge(const std::string& name, const char* help, double v) {
    head(name, "gauge", help);
    sample(name, v);
  }
  void counter(const std::string& name, const char* help, double v) {
    head(name, "counter", help);
    sample(name, v);
  }
  void histogram(const std::string& name, const char* help, const Histogram& h) {
    head(name, "histogram", help);
    uint64_t cum = 0;
    for (size_t i = 0; i < h.bounds.size(); ++i) {
      cum += h.counts[i];
      sample(name + "_bucket", double(cum), "le=\"" + num(h.bounds[i]) + "\"");
    }
    sample(name + "_bucket", double(h.count), "le=\"+Inf\"");
    sample(name + "_sum", h.sum);
    sample(name + "_count", double(h.count));
  }
  std::ostringstream out_;

 private:
  std::string base_;
};

}  // namespace

std::string Metrics::render_prometheus(const std::string& model_name) const {
  MetricsSnapshot m = snapshot();
  Writer w(model_name);
  w.gauge("vllm:num_requests_running", "Number of requests in model execution batches.", double(m.num_requests_running));
  w.gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", double(m.num_requests_waiting));
  w.gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", m.kv_cache_usage_perc);
  w.counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.", double(m.prompt_tokens_total));
  w.counter("vllm:generation_tokens_total", "Number of generation tokens processed.", double(m.generation_tokens_total));
  w.counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.", double(m.num_preemptions_total));
  w.counter("shardlm:kv_blocks_slid_total",
            "KV blocks released because they left a sliding window (every layer's, or a hybrid model's local layers').",
            double(m.kv_blocks_slid_total));
  w.gauge("shardlm:kv_local_blocks_in_use",
          "KV blocks in use in the local sliding-window layers' own pool (hybrid models such as Gemma 3; else 0).",
          double(m.kv_local_blocks_in_use));
  w.gauge("shardlm:kv_local_blocks_in_use_peak", "The most local-pool KV blocks in use in any step since start.",
          double(m.kv_local_blocks_in_use_peak));
  w.counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.",
            double(m.prefix_cache_queries_total));
  w.counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.",
            double(m.prefix_cache_hits_total));
  w.counter("shardlm:pipeline_overlapped_batches_total",
            "Micro-batches submitted while an earlier one was still in the pipeline (PP stages kept busy).",
            double(m.pipeline_overlapped_batches_total));
  w.counter("shardlm:grammar_masks_deferred_total",
            "Structured-output masks of new grammar states computed off the engine thread while their sequence waited.",
            double(m.grammar_masks_deferred_total));
  w.counter("shardlm:burst_holds_total",
            "Times an idle engine held the first requests of a burst while the HTTP server read the rest (--burst-window-ms).",
            double(m.burst_holds_total));
  w.counter("shardlm:burst_hold_seconds_total", "Time those holds lasted, summed (it counts in the held requests' TTFT).",
            m.burst_hold_seconds_total);
  w.counter("shardlm:executor_failures_total", "Model executor failures that broke the rank group.",
            double(m.executor_failures_total));
  w.counter("shardlm:executor_restarts_total", "In-place restarts of the model executor after a failure.",
            double(m.executor_restarts_total));
  w.gauge("shardlm:executor_up", "1 while the model executor serves, 0 while it is down or restarting.",
          m.executor_up ? 1.0 : 0.0);
  w.gauge("shardlm:executor_last_recovery_seconds", "Failure seen to executor serving again, of the last restart.",
          m.executor_last_recovery_seconds);
  if (!m.executor_last_failure.empty()) {
    // An info-style gauge: the reason is a label (cut to keep series small).
    constexpr size_t kMaxReason = 200;
    size_t cut = std::min(kMaxReason, m.executor_last_failure.size());
    while (cut > 0 && cut < m.executor_last_failure.size() &&
           (static_cast<unsigned char>(m.executor_last_failure[cut]) & 0xC0) == 0x80)
      --cut;  // never split a UTF-8 sequence
    std::string reason = m.executor_last_failure.substr(0, cut);
    w.head("shardlm:executor_last_failure_info", "gauge", "The last model executor failure; the reason names the rank.");
    w.sample("shardlm:executor_last_failure_info", 1.0, "reason=\"" + escape_label(reason) + "\"");
  }
  if (m.spec_decode_positions > 0) {
    w.counter("vllm:spec_decode_num_drafts_total", "Number of spec decoding drafts.",
              double(m.spec_decode_num_drafts_total));
    w.counter("vllm:spec_decode_num_draft_tokens_total", "Number of draft tokens.",
              double(m.spec_decode_num_draft_tokens_total));
    w.counter("vllm:spec_decode_num_accepted_tokens_total", "Number of accepted tokens.",
              double(m.spec_decode_num_accepted_tokens_total));
    w.head("vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter", "Accepted tokens per draft position.");
    for (int32_t i = 0; i < m.spec_decode_positions; ++i) {
      const auto& per_pos = m.spec_decode_num_accepted_tokens_per_pos_total;
      w.sample("vllm:spec_decode_num_accepted_tokens_per_pos_total",
               size_t(i) < per_pos.size() ? double(per_pos[size_t(i)]) : 0.0,
               "position=\"" + std::to_string(i) + "\"");
    }
  }
  w.head("vllm:request_success_total", "counter", "Count of successfully processed requests.");
  for (const char* reason : {"stop", "length", "abort"}) {
    auto it = m.request_success_total.find(reason);
    w.sample("vllm:request_success_total", it == m.request_success_total.end() ? 0.0 : double(it->second),
             std::string("finished_reason=\"") + reason + "\"");
  }
  w.histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
              m.time_to_first_token_seconds);
  w.histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
              m.inter_token_latency_seconds);
  w.histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
              m.e2e_request_latency_seconds);
  return w.out_.str();
}

}  // namespace shardlm
