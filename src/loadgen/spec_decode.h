// A server's speculative-decoding counters, read from its Prometheus /metrics
// before and after a `shardlm bench` run, so the report can say what the run's
// drafts achieved as the server counted them (vLLM's names, which shardlm
// serve exports too):
//   vllm:spec_decode_num_drafts_total                 drafts (one per sequence and step)
//   vllm:spec_decode_num_draft_tokens_total           tokens proposed
//   vllm:spec_decode_num_accepted_tokens_total        tokens accepted
//   vllm:spec_decode_num_accepted_tokens_per_pos_total{position="i"}
// Samples of one name with other labels (several models, replicas) are summed.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "loadgen/http_client.h"

namespace shardlm::loadgen {

struct SpecDecodeCounters {
  double drafts = 0.0;
  double draft_tokens = 0.0;
  double accepted_tokens = 0.0;
  std::vector<double> accepted_per_position;  // index: draft position

  // What happened between `before` and this reading.
  SpecDecodeCounters minus(const SpecDecodeCounters& before) const;
  double acceptance_rate() const { return draft_tokens > 0 ? accepted_tokens / draft_tokens : 0.0; }
  // Tokens a draft step produced on average: the target's own token plus the accepted ones.
  double acceptance_length() const { return drafts > 0 ? 1.0 + accepted_tokens / drafts : 0.0; }
};

// The counters in a Prometheus text exposition; nullopt when it has none of
// them (a server without speculation, or one that does not export them).
std::optional<SpecDecodeCounters> parse_spec_decode_counters(std::string_view prometheus_text);

// GET /metrics and parse it; nullopt when the server has no /metrics (any
// failure: the report then leaves the section out), never throws for it.
std::optional<SpecDecodeCounters> fetch_spec_decode_counters(const ServerUrl& url, const ClientOptions& options);

}  // namespace shardlm::loadgen
