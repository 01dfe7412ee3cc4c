// What a serving backend is running, for GET /v1/deployment and the web
// page's deployment tab: the layout, and per rank what plan predicted
// beside what the rank's allocator actually obtained. Plain data: the
// engine backend fills it from its LoadReport, tests fill it by hand.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace shardlm::server {

struct IndexRange {
  int64_t begin = 0;  // [begin, end), global indices
  int64_t end = 0;
};

struct RankDeployment {
  int replica = 0;                 // data-parallel replica
  int rank = 0;                    // within the replica: tp fastest, then pp
  int tp_rank = 0;
  int pp_rank = 0;
  std::string device;              // "cpu", "cuda:0"
  int64_t memory_bytes = 0;        // the device memory (or the CPU pool) this rank was sized for
  int64_t capacity_bytes = 0;      // floor(memory × utilization): what the bar is drawn against
  // Planned by plan's memory budget (the same function plan prints).
  int64_t planned_weight_bytes = 0;
  int64_t planned_kv_cache_bytes = 0;
  int64_t planned_workspace_bytes = 0;
  int64_t planned_reserve_bytes = 0;
  // Measured by the rank's allocator (bytes it obtained); nullopt: not
  // measured on this path (workspace is not metered today).
  std::optional<int64_t> measured_weight_bytes;
  std::optional<int64_t> measured_kv_cache_bytes;
  std::optional<int64_t> measured_workspace_bytes;
  int64_t n_kv_blocks = 0;
  int64_t kv_bytes_per_token = 0;
  IndexRange q_heads;
  IndexRange kv_heads;
  IndexRange experts;              // empty for a dense model
  IndexRange layers;
};

struct Deployment {
  bool available = false;          // false: the backend cannot describe itself (yet)
  std::string model;               // served model name
  std::string architecture;        // "Qwen2ForCausalLM"
  std::string dtype;               // weights' dtype, "bf16"
  int tp = 1, pp = 1, dp = 1, ep = 1;
  bool moe = false;
  int64_t n_layers = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, n_experts = 0, n_experts_per_token = 0;
  int64_t max_model_len = 0;
  int64_t block_size = 0;
  int64_t kv_tokens_per_replica = 0;
  double measured_tolerance = 0.0;  // allowed |measured − planned| / planned (0 on the CPU, 1% on a GPU)
  std::vector<RankDeployment> ranks;  // every rank of every replica, replica-major
};

// The JSON body of GET /v1/deployment (exact byte counts; null where not measured).
nlohmann::ordered_json deployment_json(const Deployment& d);

// `shardlm router`: the deployment_json() bodies of its backends as one,
// each backend's replicas renumbered after the previous backend's, the
// layout's dp the total. Throws nlohmann::json::exception on a malformed part.
nlohmann::ordered_json merge_deployments(const std::vector<nlohmann::ordered_json>& parts);

}  // namespace shardlm::server
