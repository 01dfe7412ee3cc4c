#include "plan/moe_accounting.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace shardlm {

MoeAccounting moe_accounting(const ModelSpec& spec, KvCacheDType kv) {
  MoeAccounting m;
  const int64_t d = static_cast<int64_t>(dtype_size(spec.dtype));
  for (const TensorSpec& t : expected_tensors(spec)) {
    if (t.optional) continue;  // a tied model's lm_head
    const int64_t bytes = shape_numel(t.shape) * d;
    m.total_weight_bytes += bytes;
    if (t.expert >= 0) m.expert_bytes += bytes;  // the family's table says whose expert it is
  }
  m.shared_bytes = m.total_weight_bytes - m.expert_bytes;
  m.n_moe_layers = spec.n_moe_layers();
  if (spec.is_moe() && m.n_moe_layers > 0) {
    m.bytes_per_expert = m.expert_bytes / (m.n_moe_layers * spec.n_experts);
    m.active_bytes_per_token = m.shared_bytes + m.n_moe_layers * spec.n_experts_per_token * m.bytes_per_expert;
  } else {
    m.active_bytes_per_token = m.total_weight_bytes;
  }
  m.total_params = m.total_weight_bytes / d;
  m.active_params = m.active_bytes_per_token / d;
  m.kv_bytes_per_token = model_kv_bytes_per_token(spec, kv);
  return m;
}

std::string ExpertShare::counts() const {
  std::string out;
  for (size_t i = 0; i < experts_per_rank.size(); ++i) out += (i ? "," : "") + std::to_string(experts_per_rank[i]);
  return out;
}

double ExpertShare::imbalance_percent() const {
  if (bytes_per_rank.empty()) return 0;
  const auto [mn, mx] = std::minmax_element(bytes_per_rank.begin(), bytes_per_rank.end());
  return *mn > 0 ? 100.0 * static_cast<double>(*mx - *mn) / static_cast<double>(*mn) : 0.0;
}

ExpertShare expert_share(const ModelSpec& spec, int tp, bool expert_parallel) {
  SHARDLM_CHECK(spec.is_moe() && tp >= 1);
  ExpertShare share;
  share.tp = tp;
  share.expert_parallel = expert_parallel;
  Layout layout;
  layout.tp = tp;
  layout.expert_parallel = expert_parallel;
  const int64_t d = static_cast<int64_t>(dtype_size(spec.dtype));
  for (int r = 0; r < tp; ++r) {
    const RankShard s = shard_for(spec, layout, r, 0);
    share.experts_per_rank.push_back(s.experts.size());
    // Per expert: gate + up rows and down columns of its intermediate slice.
    const int64_t per_expert = 3 * s.expert_intermediate.size() * spec.hidden_size * d;
    share.bytes_per_rank.push_back(per_expert * s.experts.size() * spec.n_moe_layers());
  }
  return share;
}

MoeCommCost moe_comm_cost(const ModelSpec& spec, int tp, int64_t batch_tokens, int64_t act_bytes) {
  SHARDLM_CHECK(spec.is_moe() && tp >= 1 && batch_tokens >= 0 && act_bytes > 0);
  MoeCommCost c;
  c.tp = tp;
  c.batch_tokens = batch_tokens;
  const double t = tp, k = static_cast<double>(spec.n_experts_per_token);
  const double row = static_cast<double>(batch_tokens) * static_cast<double>(spec.hidden_size) * act_bytes;
  c.all_reduce_bytes = static_cast<int64_t>(4.0 * (t - 1) / t * row + 0.5);
  c.all_to_all_bytes = static_cast<int64_t>((t - 1) / t * row * (2.0 + 2.0 * k / t) + 0.5);
  return c;
}

nlohmann::json moe_json(const ModelSpec& spec, KvCacheDType kv, int tp, int64_t batch_tokens) {
  const MoeAccounting m = moe_accounting(spec, kv);
  nlohmann::json j = {{"n_experts", spec.n_experts},
                      {"n_experts_per_token", spec.n_experts_per_token},
                      {"moe_intermediate_size", spec.moe_intermediate_size},
                      {"n_moe_layers", m.n_moe_layers},
                      {"norm_topk_prob", spec.norm_topk_prob},
                      {"total_weight_bytes", m.total_weight_bytes},
                      {"expert_bytes", m.expert_bytes},
                      {"shared_bytes", m.shared_bytes},
                      {"active_bytes_per_token", m.active_bytes_per_token},
                      {"total_params", m.total_params},
                      {"active_params", m.active_params},
                      {"kv_bytes_per_token", m.kv_bytes_per_token},
                      {"bytes_per_expert", m.bytes_per_expert}};
  for (bool ep : {true, false}) {
    const ExpertShare s = expert_share(spec, tp, ep);
    j[ep ? "expert_parallel" : "tensor_parallel"] = {{"tp", tp},
                                                      {"experts_per_rank", s.experts_per_rank},
                                                      {"expert_bytes_per_rank", s.bytes_per_rank},
                                                      {"imbalance_percent", s.imbalance_percent()}};
  }
  if (batch_tokens > 0 && tp > 1) {
    const MoeCommCost c = moe_comm_cost(spec, tp, batch_tokens, static_cast<int64_t>(dtype_size(spec.dtype)));
    j["token_exchange"] = {{"tp", tp},
                           {"batch_tokens", batch_tokens},
                           {"all_reduce_bytes_per_rank_per_layer", c.all_reduce_bytes},
                           {"all_to_all_bytes_per_rank_per_layer", c.all_to_all_bytes},
                           {"cheaper", c.all_reduce_cheaper() ? "all_reduce" : "all_to_all"},
                           {"used", "all_reduce"}};
  }
  return j;
}

}  // namespace shardlm
