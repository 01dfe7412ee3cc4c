// Words for a Plan: the non-obvious parts explained from its own numbers
// (why vLLM refuses a degree and what shardlm does instead, how the layers
// split over stages, why nothing fits), and the text report `plan` prints.
#pragma once

#include <string>
#include <vector>

#include "plan/planner.h"

namespace shardlm {

// One paragraph per finding, generated from the plan's numbers.
std::vector<std::string> explain_plan(const Plan& plan);

// Bytes of K/V projection weights (per replica) and of KV cache per token
// (per replica) that shardlm's KV-head replication adds at this TP degree:
// every rank holds the KV heads its Q heads touch, so a KV head whose group
// straddles ranks is stored on each of them.
struct KvReplicationCost {
  int64_t extra_kv_heads = 0;      // copies beyond n_kv_heads, over the TP ranks of one stage
  int64_t weight_bytes = 0;        // k_proj/v_proj rows (and biases) of those copies, all layers
  int64_t kv_bytes_per_token = 0;  // their K/V per token, all layers
};
KvReplicationCost kv_replication_cost(const ModelSpec& spec, int tp, KvCacheDType kv);

// The full human-readable report (units stated: GiB = 2^30 B, GB = 1e9 B).
std::string render_plan_text(const Plan& plan);

}  // namespace shardlm
