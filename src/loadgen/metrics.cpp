#include "loadgen/metrics.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "loadgen/stats.h"

namespace shardlm::loadgen {

double MetricSummary::percentile_ms(double p) const {
  for (const auto& [q, v] : percentiles_ms)
    if (q == p) return v;
  return 0.0;
}

std::string percentile_word(double p) {
  if (std::floor(p) == p) return std::to_string(static_cast<int64_t>(p));
  std::ostringstream out;
  out << p;
  return out.str();
}

namespace {

MetricSummary summarize(const std::vector<double>& seconds, const std::vector<double>& percentiles) {
  MetricSummary s;
  s.mean_ms = mean_of(seconds) * 1000.0;
  s.median_ms = median_of(seconds) * 1000.0;
  s.std_ms = std_of(seconds) * 1000.0;
  for (double p : percentiles) s.percentiles_ms.emplace_back(p, percentile_of(seconds, p) * 1000.0);
  return s;
}

}  // namespace

BenchmarkMetrics calculate_metrics(const std::vector<RequestOutput>& outputs, double duration_s,
                                   const std::vector<double>& percentiles) {
  BenchmarkMetrics m;
  std::vector<double> ttfts, tpots, itls, e2els;
  for (const auto& out : outputs) {
    if (!out.success) {
      m.output_lens.push_back(0);
      ++m.failed;
      continue;
    }
    int64_t output_len = out.output_tokens;
    if ((!out.usage_reported && !out.tokens_counted_locally) || output_len <= 0) {
      output_len = std::max<int64_t>(out.n_chunks, 1);
      ++m.n_usage_missing;
    }
    m.output_lens.push_back(output_len);
    m.total_input += out.prompt_len;
    if (output_len > 1) tpots.push_back((out.latency - out.ttft) / static_cast<double>(output_len - 1));
    itls.insert(itls.end(), out.itl.begin(), out.itl.end());
    ttfts.push_back(out.ttft);
    e2els.push_back(out.latency);
    ++m.completed;
  }
  for (int64_t n : m.output_lens) m.total_output += n;
  double dur = duration_s > 0.0 ? duration_s : 1e-9;
  m.request_throughput = static_cast<double>(m.completed) / dur;
  m.output_throughput = static_cast<double>(m.total_output) / dur;
  m.total_token_throughput = static_cast<double>(m.total_input + m.total_output) / dur;
  m.ttft = summarize(ttfts, percentiles);
  m.tpot = summarize(tpots, percentiles);
  m.itl = summarize(itls, percentiles);
  m.e2el = summarize(e2els, percentiles);

  // Peak output rate: chunk arrival times binned into 1-s buckets from the
  // earliest successful start (vLLM counts chunks here, not usage tokens).
  double min_start = 0.0, max_end = 0.0;
  bool any = false;
  for (const auto& out : outputs) {
    if (!out.success) continue;
    if (!any || out.start_time < min_start) min_start = out.start_time;
    if (!any || out.start_time + out.latency > max_end) max_end = out.start_time + out.latency;
    any = true;
  }
  if (any) {
    size_t n_buckets = static_cast<size_t>(std::ceil(max_end - min_start)) + 1;
    std::vector<double> tokens_per_s(n_buckets, 0.0);
    std::vector<std::pair<double, int>> events;
    for (const auto& out : outputs) {
      if (!out.success) continue;
      double t = out.start_time + out.ttft;
      auto add = [&](double when) {
        double rel = when - min_start;
        if (rel < 0) return;
        size_t bucket = static_cast<size_t>(rel);
        if (bucket < n_buckets) tokens_per_s[bucket] += 1.0;
      };
      add(t);
      for (double gap : out.itl) {
        t += gap;
        add(t);
      }
      events.emplace_back(out.start_time, 1);
      events.emplace_back(out.start_time + out.latency, -1);
    }
    // Half-open intervals: a departure at the same instant precedes an arrival.
    std::sort(events.begin(), events.end());
    int64_t current = 0;
    for (const auto& [when, delta] : events) {
      current += delta;
      m.max_concurrent_requests = std::max(m.max_concurrent_requests, current);
    }
    m.max_output_tokens_per_s = *std::max_element(tokens_per_s.begin(), tokens_per_s.end());
  }
  return m;
}

}  // namespace shardlm::loadgen
