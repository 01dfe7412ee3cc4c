// What a mixture-of-experts model costs, in exact bytes from its tensor
// shapes: every expert's weights (what memory must hold) against the weights
// one token reads (what decode speed follows), and each rank's share of the
// experts under expert parallelism and under tensor parallelism.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "loader/model_spec.h"
#include "plan/memory_budget.h"
#include "plan/sharding.h"

namespace shardlm {

struct MoeAccounting {
  int64_t total_weight_bytes = 0;   // every tensor, every expert
  int64_t expert_bytes = 0;         // the experts' w1/w2/w3 (gate/up/down) of every MoE layer
  int64_t shared_bytes = 0;         // everything else (attention, norms, routers, dense MLPs, embedding, lm_head)
  int64_t active_bytes_per_token = 0;  // shared + k/E of the experts: the weights one token's forward uses
  int64_t total_params = 0;         // total_weight_bytes / dtype bytes
  int64_t active_params = 0;        // active_bytes_per_token / dtype bytes (Qwen3-30B-A3B: 3.3 B)
  int64_t kv_bytes_per_token = 0;   // whole model
  int64_t bytes_per_expert = 0;     // one expert of one layer
  int64_t n_moe_layers = 0;
};

MoeAccounting moe_accounting(const ModelSpec& spec, KvCacheDType kv);

// Expert bytes (all MoE layers of the model) on each of `tp` ranks: with EP
// whole experts in near-equal counts, without EP a slice of every expert.
struct ExpertShare {
  int tp = 1;
  bool expert_parallel = false;
  std::vector<int64_t> experts_per_rank;  // [tp] experts held per MoE layer
  std::vector<int64_t> bytes_per_rank;    // [tp] expert bytes over every MoE layer
  // "22,22,21,21,21,21"
  std::string counts() const;
  // (max − min) / min, in percent; 0 when even.
  double imbalance_percent() const;
};
ExpertShare expert_share(const ModelSpec& spec, int tp, bool expert_parallel);

// How tokens reach their experts, in bytes per rank per MoE layer at a step
// of `batch_tokens`, on `tp` ranks of a stage whose attention is tensor-
// parallel (every rank holds every token), activations of `act_bytes`:
//   all-reduce (what shardlm runs): each rank computes its experts' partial
//     output for all tokens; the ring all-reduce after the MLP moves
//     2(t−1)/t × B × hidden × act_bytes, as after attention;
//   all_to_all: attention's all-reduce becomes a reduce-scatter (each rank
//     keeps B/t tokens), each token is dispatched to the ranks of its k
//     experts and combined back (k(t−1)/t copies per token each way, no
//     dedupe), and an all-gather rebuilds every token for the next attention:
//     (t−1)/t × B × hidden × act_bytes × (2 + 2k/t) counting both collectives
//     of the layer, against 4(t−1)/t × B × hidden × act_bytes for the two all-reduces.
// The all-reduce moves no more bytes exactly when k ≥ t.
struct MoeCommCost {
  int tp = 1;
  int64_t batch_tokens = 0;
  int64_t all_reduce_bytes = 0;  // per rank per layer: attention + MoE all-reduces
  int64_t all_to_all_bytes = 0;  // per rank per layer: reduce-scatter + dispatch + combine + all-gather
  bool all_reduce_cheaper() const { return all_reduce_bytes <= all_to_all_bytes; }
};
MoeCommCost moe_comm_cost(const ModelSpec& spec, int tp, int64_t batch_tokens, int64_t act_bytes);

nlohmann::json moe_json(const ModelSpec& spec, KvCacheDType kv, int tp, int64_t batch_tokens = 0);

}  // namespace shardlm
