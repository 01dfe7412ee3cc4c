#include "loadgen/spec_decode.h"

#include <charconv>
#include <cmath>
#include <cstdlib>

namespace shardlm::loadgen {
namespace {

constexpr std::string_view kDrafts = "vllm:spec_decode_num_drafts_total";
constexpr std::string_view kDraftTokens = "vllm:spec_decode_num_draft_tokens_total";
constexpr std::string_view kAccepted = "vllm:spec_decode_num_accepted_tokens_total";
constexpr std::string_view kPerPosition = "vllm:spec_decode_num_accepted_tokens_per_pos_total";

// One sample line: `name{labels} value [timestamp]` or `name value`.
struct Sample {
  std::string_view name, labels;
  double value = 0.0;
};

std::optional<Sample> parse_sample(std::string_view line) {
  if (line.empty() || line.front() == '#') return std::nullopt;
  Sample s;
  size_t end_name = line.find_first_of("{ \t");
  if (end_name == std::string_view::npos) return std::nullopt;
  s.name = line.substr(0, end_name);
  size_t rest = end_name;
  if (line[end_name] == '{') {
    size_t close = line.find('}', end_name);
    if (close == std::string_view::npos) return std::nullopt;
    s.labels = line.substr(end_name + 1, close - end_name - 1);
    rest = close + 1;
  }
  while (rest < line.size() && (line[rest] == ' ' || line[rest] == '\t')) ++rest;
  size_t end_value = line.find_first_of(" \t", rest);
  std::string value(line.substr(rest, end_value == std::string_view::npos ? std::string_view::npos : end_value - rest));
  if (value.empty()) return std::nullopt;
  char* stop = nullptr;
  s.value = std::strtod(value.c_str(), &stop);  // strtod: Prometheus writes +Inf/NaN too
  if (stop != value.c_str() + value.size() || !std::isfinite(s.value)) return std::nullopt;
  return s;
}

// The value of label `key` in `a="x",key="12",...`; -1 when absent or not a small integer.
int label_index(std::string_view labels, std::string_view key) {
  std::string needle = std::string(key) + "=\"";
  size_t at = 0;
  while ((at = labels.find(needle, at)) != std::string_view::npos) {
    if (at == 0 || labels[at - 1] == ',') break;
    at += needle.size();
  }
  if (at == std::string_view::npos) return -1;
  size_t begin = at + needle.size(), end = labels.find('"', begin);
  if (end == std::string_view::npos) return -1;
  int v = -1;
  auto [ptr, ec] = std::from_chars(labels.data() + begin, labels.data() + end, v);
  if (ec != std::errc() || ptr != labels.data() + end || v < 0 || v > 1024) return -1;
  return v;
}

}  // namespace

SpecDecodeCounters SpecDecodeCounters::minus(const SpecDecodeCounters& before) const {
  SpecDecodeCounters d;
  d.drafts = drafts - before.drafts;
  d.draft_tokens = draft_tokens - before.draft_tokens;
  d.accepted_tokens = accepted_tokens - before.accepted_tokens;
  d.accepted_per_position = accepted_per_position;
  for (size_t i = 0; i < d.accepted_per_position.size() && i < before.accepted_per_position.size(); ++i)
    d.accepted_per_position[i] -= before.accepted_per_position[i];
  return d;
}

std::optional<SpecDecodeCounters> parse_spec_decode_counters(std::string_view text) {
  SpecDecodeCounters c;
  bool any = false;
  while (!text.empty()) {
    size_t eol = text.find('\n');
    std::string_view line = text.substr(0, eol);
    text = eol == std::string_view::npos ? std::string_view() : text.substr(eol + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    std::optional<Sample> s = parse_sample(line);
    if (!s) continue;
    if (s->name == kDrafts) {
      c.drafts += s->value;
    } else if (s->name == kDraftTokens) {
      c.draft_tokens += s->value;
    } else if (s->name == kAccepted) {
      c.accepted_tokens += s->value;
    } else if (s->name == kPerPosition) {
      int pos = label_index(s->labels, "position");
      if (pos < 0) continue;
      if (c.accepted_per_position.size() <= size_t(pos)) c.accepted_per_position.resize(size_t(pos) + 1, 0.0);
      c.accepted_per_position[size_t(pos)] += s->value;
    } else {
      continue;
    }
    any = true;
  }
  if (!any) return std::nullopt;
  return c;
}

std::optional<SpecDecodeCounters> fetch_spec_decode_counters(const ServerUrl& url, const ClientOptions& options) {
  std::optional<std::string> body = try_get(url, options, "/metrics");
  if (!body) return std::nullopt;
  return parse_spec_decode_counters(*body);
}

}  // namespace shardlm::loadgen
