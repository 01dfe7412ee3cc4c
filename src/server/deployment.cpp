#include "server/deployment.h"

#include <nlohmann/json.hpp>

namespace shardlm::server {

namespace {

using ordered_json = nlohmann::ordered_json;

ordered_json range_json(const IndexRange& r) {
  return {{"begin", r.begin}, {"end", r.end}, {"count", r.end - r.begin}};
}

ordered_json optional_bytes(const std::optional<int64_t>& v) { return v ? ordered_json(*v) : ordered_json(nullptr); }

}  // namespace

ordered_json deployment_json(const Deployment& d) {
  ordered_json ranks = ordered_json::array();
  for (const RankDeployment& r : d.ranks) {
    ranks.push_back({
        {"replica", r.replica},
        {"rank", r.rank},
        {"tp_rank", r.tp_rank},
        {"pp_rank", r.pp_rank},
        {"device", r.device},
        {"memory_bytes", r.memory_bytes},
        {"capacity_bytes", r.capacity_bytes},
        {"planned",
         {{"weights", r.planned_weight_bytes},
          {"kv_cache", r.planned_kv_cache_bytes},
          {"workspace", r.planned_workspace_bytes},
          {"reserve", r.planned_reserve_bytes}}},
        {"measured",
         {{"weights", optional_bytes(r.measured_weight_bytes)},
          {"kv_cache", optional_bytes(r.measured_kv_cache_bytes)},
          {"workspace", optional_bytes(r.measured_workspace_bytes)}}},
        {"n_kv_blocks", r.n_kv_blocks},
        {"kv_bytes_per_token", r.kv_bytes_per_token},
        {"q_heads", range_json(r.q_heads)},
        {"kv_heads", range_json(r.kv_heads)},
        {"experts", range_json(r.experts)},
        {"layers", range_json(r.layers)},
    });
  }
  return {
      {"object", "deployment"},
      {"model", d.model},
      {"architecture", d.architecture},
      {"dtype", d.dtype},
      {"layout", {{"tp", d.tp}, {"pp", d.pp}, {"dp", d.dp}, {"ep", d.ep}}},
      {"moe", d.moe},
      {"n_layers", d.n_layers},
      {"n_heads", d.n_heads},
      {"n_kv_heads", d.n_kv_heads},
      {"head_dim", d.head_dim},
      {"n_experts", d.n_experts},
      {"n_experts_per_token", d.n_experts_per_token},
      {"max_model_len", d.max_model_len},
      {"block_size", d.block_size},
      {"kv_tokens_per_replica", d.kv_tokens_per_replica},
      {"measured_tolerance", d.measured_tolerance},
      {"units", "bytes"},
      {"ranks", ranks},
  };
}

ordered_json merge_deployments(const std::vector<ordered_json>& parts) {
  if (parts.empty()) return ordered_json::object();
  ordered_json out = parts[0];
  out["ranks"] = ordered_json::array();
  int64_t base = 0;
  for (const ordered_json& part : parts) {
    int64_t n_replicas = part.at("layout").at("dp").get<int64_t>();
    for (ordered_json rank : part.at("ranks")) {
      rank["replica"] = base + rank.at("replica").get<int64_t>();
      out["ranks"].push_back(std::move(rank));
    }
    base += n_replicas;
  }
  out["layout"]["dp"] = base;
  out["kv_tokens_per_replica"] = parts[0].at("kv_tokens_per_replica");
  return out;
}

}  // namespace shardlm::server
