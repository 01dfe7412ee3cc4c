#include "loadgen/report.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <sstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace shardlm::loadgen {

namespace {

// Python's "{:<40} {:<10}".format(label, value).
std::string row(const std::string& label, const std::string& value) {
  std::string out = label;
  if (out.size() < 40) out.append(40 - out.size(), ' ');
  out += ' ';
  out += value;
  if (value.size() < 10) out.append(10 - value.size(), ' ');
  out += '\n';
  return out;
}

std::string fixed2(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f", v);
  return buf;
}

// Python's "{s:{c}^{n}}": centred, the odd padding character on the right.
std::string centred(const std::string& s, char fill, size_t width = 50) {
  if (s.size() >= width) return s + "\n";
  size_t pad = width - s.size();
  return std::string(pad / 2, fill) + s + std::string(pad - pad / 2, fill) + "\n";
}

std::string metric_block(const MetricSummary& m, const std::string& name, const std::string& header) {
  std::string out = centred(header, '-');
  out += row("Mean " + name + " (ms):", fixed2(m.mean_ms));
  out += row("Median " + name + " (ms):", fixed2(m.median_ms));
  for (const auto& [p, v] : m.percentiles_ms) out += row("P" + percentile_word(p) + " " + name + " (ms):", fixed2(v));
  return out;
}

// The server's counters over the run (spec_decode.h); rates in percent,
// per position as accepted ÷ drafts (how often a draft got that far).
std::string spec_decode_block(const SpecDecodeCounters& c) {
  std::string out = centred("Speculative Decoding", '-');
  out += row("Acceptance rate (%):", fixed2(100.0 * c.acceptance_rate()));
  out += row("Acceptance length:", fixed2(c.acceptance_length()));
  out += row("Drafts:", std::to_string(std::llround(c.drafts)));
  out += row("Draft tokens:", std::to_string(std::llround(c.draft_tokens)));
  out += row("Accepted tokens:", std::to_string(std::llround(c.accepted_tokens)));
  std::string per_position;
  for (double a : c.accepted_per_position)
    per_position += (per_position.empty() ? "" : " ") + fixed2(c.drafts > 0 ? 100.0 * a / c.drafts : 0.0);
  if (!per_position.empty()) out += row("Per-position acceptance (%):", per_position);
  return out;
}

void add_metric(nlohmann::ordered_json& j, const std::string& key, const MetricSummary& m) {
  j["mean_" + key + "_ms"] = m.mean_ms;
  j["median_" + key + "_ms"] = m.median_ms;
  j["std_" + key + "_ms"] = m.std_ms;
  for (const auto& [p, v] : m.percentiles_ms) j["p" + percentile_word(p) + "_" + key + "_ms"] = v;
}

}  // namespace

std::string format_notes(const BenchmarkResult& r) {
  std::string out;
  if (r.metrics.failed > 0) {
    out += "Failed requests during benchmark run detected (capping to 10):\n";
    int shown = 0;
    for (const auto& o : r.outputs) {
      if (o.success) continue;
      out += str_cat("Error ", shown, ": ", o.error, "\n");
      if (++shown == 10) break;
    }
  }
  if (r.metrics.n_usage_missing > 0)
    out += str_cat("Note: ", r.metrics.n_usage_missing, " of ", r.metrics.completed,
                   " successful responses carried no usage (stream_options.include_usage); their "
                   "output tokens are counted as streamed chunks, so token counts and TPOT are "
                   "approximate.\n");
  if (r.interrupted)
    out += str_cat("Interrupted after ", fixed2(r.duration_s), " s: results cover the ",
                   r.outputs.size(), " finished requests; ", r.n_not_completed,
                   " not sent or cut off are excluded.\n");
  return out;
}

std::string format_result_table(const BenchmarkResult& r) {
  const auto& m = r.metrics;
  std::string out = centred(" Serving Benchmark Result ", '=');
  out += row("Successful requests:", std::to_string(m.completed));
  out += row("Failed requests:", std::to_string(m.failed));
  if (r.max_concurrency > 0) out += row("Maximum request concurrency:", std::to_string(r.max_concurrency));
  if (!std::isinf(r.request_rate)) out += row("Request rate configured (RPS):", fixed2(r.request_rate));
  out += row("Benchmark duration (s):", fixed2(r.duration_s));
  out += row("Total input tokens:", std::to_string(m.total_input));
  out += row("Total generated tokens:", std::to_string(m.total_output));
  out += row("Request throughput (req/s):", fixed2(m.request_throughput));
  out += row("Output token throughput (tok/s):", fixed2(m.output_throughput));
  out += row("Peak output token throughput (tok/s):", fixed2(m.max_output_tokens_per_s));
  out += row("Peak concurrent requests:", fixed2(static_cast<double>(m.max_concurrent_requests)));
  out += row("Total token throughput (tok/s):", fixed2(m.total_token_throughput));
  out += metric_block(m.ttft, "TTFT", "Time to First Token");
  out += metric_block(m.tpot, "TPOT", "Time per Output Token (excl. 1st token)");
  out += metric_block(m.itl, "ITL", "Inter-token Latency");
  out += metric_block(m.e2el, "E2EL", "End-to-end Latency");
  if (r.spec_decode) out += spec_decode_block(*r.spec_decode);
  out += std::string(50, '=') + "\n";
  return out;
}

nlohmann::ordered_json result_to_json(const BenchmarkResult& r) {
  using json = nlohmann::ordered_json;
  const auto& m = r.metrics;
  json j;
  char date[32];
  std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y%m%d-%H%M%S", std::localtime(&now));
  j["date"] = date;
  const char* backend = r.endpoint == Endpoint::kChat ? "openai-chat" : "openai";
  j["endpoint_type"] = backend;
  j["backend"] = backend;
  j["label"] = nullptr;
  j["model_id"] = r.model;
  j["tokenizer_id"] = nullptr;
  j["num_prompts"] = r.n_prompts;
  j["request_rate"] = std::isinf(r.request_rate) ? json("inf") : json(r.request_rate);
  j["burstiness"] = 1.0;
  j["max_concurrency"] = r.max_concurrency > 0 ? json(r.max_concurrency) : json(nullptr);
  j["duration"] = r.duration_s;
  j["completed"] = m.completed;
  j["failed"] = m.failed;
  j["total_input_tokens"] = m.total_input;
  j["total_output_tokens"] = m.total_output;
  j["request_throughput"] = m.request_throughput;
  j["request_goodput"] = nullptr;
  j["output_throughput"] = m.output_throughput;
  j["total_token_throughput"] = m.total_token_throughput;
  json input_lens = json::array(), ttfts = json::array(), itls = json::array(), latencies = json::array(),
       start_times = json::array(), queue_times = json::array(), texts = json::array(),
       errors = json::array();
  for (const auto& o : r.outputs) {
    input_lens.push_back(o.prompt_len);
    ttfts.push_back(o.ttft);
    itls.push_back(o.itl);
    latencies.push_back(o.latency);
    start_times.push_back(o.start_time);
    queue_times.push_back(o.queue_time);
    texts.push_back(o.generated_text);
    errors.push_back(o.error);
  }
  j["input_lens"] = input_lens;
  j["output_lens"] = m.output_lens;
  j["ttfts"] = ttfts;
  j["itls"] = itls;
  j["latencies"] = latencies;
  j["start_times"] = start_times;
  j["queue_times"] = queue_times;
  j["generated_texts"] = texts;
  j["errors"] = errors;
  j["max_output_tokens_per_s"] = m.max_output_tokens_per_s;
  j["max_concurrent_requests"] = m.max_concurrent_requests;
  add_metric(j, "ttft", m.ttft);
  add_metric(j, "tpot", m.tpot);
  add_metric(j, "itl", m.itl);
  add_metric(j, "e2el", m.e2el);
  // shardlm extras.
  j["base_url"] = r.base_url;
  j["interrupted"] = r.interrupted;
  j["num_not_completed"] = r.n_not_completed;
  j["num_usage_missing"] = m.n_usage_missing;
  if (r.spec_decode) {
    const SpecDecodeCounters& c = *r.spec_decode;
    j["spec_decode_acceptance_rate"] = 100.0 * c.acceptance_rate();
    j["spec_decode_acceptance_length"] = c.acceptance_length();
    j["spec_decode_num_drafts"] = std::llround(c.drafts);
    j["spec_decode_draft_tokens"] = std::llround(c.draft_tokens);
    j["spec_decode_accepted_tokens"] = std::llround(c.accepted_tokens);
    json per_position = json::array();
    for (double a : c.accepted_per_position) per_position.push_back(c.drafts > 0 ? 100.0 * a / c.drafts : 0.0);
    j["spec_decode_per_position_acceptance_rates"] = per_position;
  }
  return j;
}

void save_result_json(const BenchmarkResult& result, const std::string& path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail(ErrorCode::kIo, "cannot write --save-result file ", path, "; check the directory exists");
  out << result_to_json(result).dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
  if (!out) fail(ErrorCode::kIo, "writing --save-result file ", path, " failed (disk full?)");
}

}  // namespace shardlm::loadgen
