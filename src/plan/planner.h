// The planner: every (TP, PP, DP) a set of devices allows, each budgeted per
// rank with compute_memory_budget, checked against vLLM's rules, timed with a
// bandwidth model, and one recommended for an objective.
//
// Decode speed model (memory-bandwidth bound; compute and kernel launch are ignored):
//  - A stage's step time is its slowest TP rank's bytes read ÷ that device's
//    memory bandwidth: the rank's weights (the embedding table excepted: decode
//    reads one row per sequence; MoE experts scaled by the fraction a batch
//    touches, 1 − (1 − k/E)^B under uniform routing) plus the KV of B sequences
//    at context C. Under EP a rank reads its whole experts (22 of 128 over 6
//    ranks), under TP its slice of every expert.
//  - MoE combine: attention is tensor-parallel, so after its all-reduce every
//    rank of the group holds every token; each rank runs the tokens routed to
//    its experts (EP) or its slice of every expert (TP) and the partial outputs
//    are summed with the same all-reduce of B × hidden as a dense MLP. An
//    all_to_all dispatch + combine would move k × B × hidden per direction
//    (k = 8 for Qwen3-MoE), k times the all-reduce's payload, to save nothing,
//    so the model (and the engine) use the all-reduce.
//  - TP: 2 all-reduces per layer (after attention and after the MLP) of
//    B × hidden_size × dtype bytes, ring cost 2(t−1)/t × bytes ÷ link +
//    all_reduce_latency(hosts the group spans);
//    the last stage also gathers B × vocab f32 logits. The link is the
//    device's peer link, or the inter-node link when the TP group spans hosts.
//  - PP: one activation send of B × hidden_size × dtype bytes per stage boundary.
//  - Latency (one stream, B = 1): one token passes every stage in turn, so the
//    step is the sum of the stage times plus every transfer.
//  - Throughput (B = concurrency): m = min(pp, B) micro-batches in flight; a
//    round of B tokens takes max(sum of stage times + transfers for one
//    micro-batch, m × slowest stage time for one micro-batch). DP replicas add up.
//  - Mixed devices (--gpus with different cards): besides the even split, the
//    TP ranks of each stage are tried with weights memory^a × bandwidth^(1−a),
//    a = 0, 0.1, ..., 1 (memory = the usable part: × utilization − reserve),
//    and the layers with the time-balanced partition below; the best for the
//    objective is kept, the even split reported beside it.
//  - PP partition (plan's default): stages balanced by modelled decode time on
//    each stage's slowest rank (layer reads and KV ÷ bandwidth; the lm_head's
//    read on the last stage, the embedding's memory on the first), each stage
//    capped by what its devices' memory holds; kept when it beats the engine's
//    byte-balanced default, and then printed as --pp-layer-partition.
//  - C, the typical context: half of --max-model-len, or half of min(chosen
//    length, 8,192) when the length is chosen automatically.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "loader/model_spec.h"
#include "plan/device_catalog.h"
#include "plan/memory_budget.h"
#include "plan/sharding.h"
#include "plan/vllm_rules.h"

namespace shardlm {

enum class Objective { kLatency, kThroughput };
const char* objective_name(Objective objective);

// Without --max-model-len a layout must hold at least this many tokens (or the
// model's max_position_embeddings when smaller) to count as fitting.
constexpr int64_t kMinAutoModelLen = 2048;
// Collective latency per message: NCCL small-message latency within a host
// (NVLink/PCIe) and across hosts (InfiniBand/Ethernet).
constexpr double kIntraNodeLatency = 10e-6;
constexpr double kInterNodeLatency = 30e-6;
// Default per-hop latency of the link between hosts when
// --inter-node-latency-us is not given, by the link its bandwidth suggests:
// ≥ 100 Gb/s is InfiniBand/RoCE with RDMA (NCCL's IB transport, 30 µs per
// small-message hop), below it TCP sockets over Ethernet (NCCL's socket
// transport: kernel stack and proxy thread, 100 µs per hop).
constexpr double kEthernetInterNodeLatency = 100e-6;
double default_inter_node_latency(double inter_node_bandwidth);
// Latency of one all-reduce whose ranks span `n_hosts` hosts: one intra-host
// step, plus a tree across hosts (2⌈log2 n_hosts⌉ inter-host hops, as NCCL's
// tree algorithm for small messages), each `inter_node_latency` seconds.
double all_reduce_latency(int n_hosts, double inter_node_latency = kInterNodeLatency);

// Layouts are enumerated exhaustively; beyond this many devices the list (and
// the per-rank budgets kept for each) grows past what a CLI should print.
constexpr int kMaxPlanDevices = 64;

struct PlanOptions {
  MemoryBudgetOptions budget;
  bool expert_parallel = false;  // --enable-expert-parallel: every layout with TP > 1 uses EP = TP
  int64_t max_model_len = 0;  // 0 = the largest the chosen layout holds
  Objective objective = Objective::kLatency;
  // Per-hop latency of the link between hosts, seconds; < 0 = by link type
  // (default_inter_node_latency).
  double inter_node_latency = -1;
  // --tensor-split: only layouts it fits (tp or tp × pp weights) are
  // evaluated, with that split. Empty: even, or chosen per layout on mixed devices.
  std::vector<double> tensor_split;
  // --pp-layer-partition: only layouts with that many stages, with that split.
  std::vector<int64_t> pp_layer_partition;
  // --speculative-config (the JSON as given; the serve commands repeat it):
  // k drafted tokens, from prompt lookup (draft_model "") or a draft model's
  // directory. Its bytes are in budget (add_speculation): the verification
  // rows in the last stage's logits, the draft on each replica's rank 0.
  std::string speculative_config;
  int64_t num_speculative_tokens = 0;
  std::string draft_model;
};

// Spread of one kind of work over the ranks of a replica.
struct Imbalance {
  std::string what;       // "Q heads", "KV heads", "MLP columns", "layers", "weight bytes"
  int64_t max = 0;
  int64_t min = 0;
  int max_rank = 0;       // first rank holding max
  int min_rank = 0;       // first rank holding min
  double percent() const { return min > 0 ? 100.0 * static_cast<double>(max - min) / static_cast<double>(min) : 0.0; }
};

// The same (TP, PP, DP) with the engine's defaults (even TP split, layers
// balanced by bytes), for comparison with what plan chose on mixed devices.
struct EvenSplitResult {
  bool evaluated = false;  // false when the chosen layout is the even one
  bool fits = false;
  int64_t headroom_bytes = 0;
  int64_t kv_tokens = 0;
  double single_stream_tok_s = 0;
  double aggregate_tok_s = 0;
  std::vector<int64_t> pp_layer_partition;
  std::vector<std::vector<MemoryBudget>> budgets;  // as LayoutEvaluation::budgets
};

struct LayoutEvaluation {
  Layout layout;                              // pp_layer_partition holds shardlm's split; tensor_split plan's shares
  std::vector<int64_t> vllm_partition;        // vLLM's split of the layers for the same pp
  // budgets[d][r]: replica d, rank r within the replica (tp fastest); rank r of
  // replica d lands on device d × tp × pp + r.
  std::vector<std::vector<MemoryBudget>> budgets;
  int tightest_replica = 0;
  int tightest_rank = 0;       // within the replica
  int64_t required_tokens = 0; // KV tokens every rank must hold: --max-model-len or the auto minimum, in whole blocks
  int64_t headroom_bytes = 0;  // tightest rank: usable − KV of required_tokens; negative = shortfall
  bool fits = false;
  int64_t kv_tokens = 0;       // tokens every replica holds (min over all ranks)
  int64_t max_model_len = 0;   // --max-model-len, or min(kv_tokens, max_position_embeddings)
  int64_t max_concurrency = 0; // kv_tokens / max_model_len: full-length sequences at once, per replica
  int idle_devices = 0;
  bool tp_spans_nodes = false;
  bool pp_spans_nodes = false;
  VllmVerdict vllm;
  std::vector<Imbalance> imbalance;
  // Speed model (see the header comment).
  int64_t context_tokens = 0;      // C
  int64_t batch = 0;               // B for throughput: min(max_num_seqs, kv_tokens / C)
  double step_seconds_single = 0;  // one stream
  double single_stream_tok_s = 0;
  double replica_tok_s = 0;        // slowest replica at batch B
  double aggregate_tok_s = 0;      // all replicas
  double tp_comm_seconds = 0;      // per token, one stream: all-reduces + logits gather
  double pp_comm_seconds = 0;      // per token, one stream: stage-boundary sends
  std::vector<double> stage_seconds;  // per stage, one stream: compute + TP comm (the time balance)
  std::vector<int64_t> bytes_partition;  // the engine's byte-balanced split of the layers
  bool partition_by_time = false;   // layout.pp_layer_partition is plan's time balance, not the engine default
  EvenSplitResult even;             // the even split, when plan chose another
};

struct Plan {
  ModelSpec spec;
  std::string model_name;   // what the user gave (catalog name or path)
  std::string hf_repo;      // "Qwen/Qwen2.5-7B-Instruct", or the path for a directory
  int64_t checkpoint_bytes = 0;  // rank_weight_bytes at TP=PP=1 in the planned dtype
  DeviceInventory devices;
  PlanOptions options;
  std::vector<LayoutEvaluation> layouts;  // every (tp, pp, dp) with tp × pp × dp ≤ devices
  int recommended = -1;                   // index into layouts, -1 when nothing fits
  int best_vllm = -1;                     // best fitting layout vLLM accepts
  // Devices of the first catalog device that would make some layout fit (0 =
  // not searched or none up to 4× the devices given); set when nothing fits.
  int devices_needed = 0;
};

// Throws Error(kInvalidArgument) for bad options (max_model_len above
// max_position_embeddings, utilization outside (0, 1], ...).
Plan make_plan(const ModelSpec& spec, const DeviceInventory& devices, const PlanOptions& options,
               const std::string& model_name = "", const std::string& hf_repo = "");

// Expected fraction of a MoE layer's experts that a decode step of B tokens
// touches, 1 − (1 − k/E)^B (uniform routing); 1 for dense models.
double moe_expert_fraction(const ModelSpec& spec, int64_t batch);

// Scores used to rank fitting layouts.
double objective_score(const LayoutEvaluation& e, Objective objective);

// "shardlm serve MODEL -tp T -pp P -dp D --max-model-len L --max-num-seqs N ..."
std::string shardlm_serve_command(const Plan& plan, const LayoutEvaluation& e);
// "vllm serve HF --tensor-parallel-size T ..."; "" when vLLM refuses the layout.
std::string vllm_serve_command(const Plan& plan, const LayoutEvaluation& e);

// Device-aware split of the layers for `layout` (its tensor_split applied):
// stages balanced by modelled decode time within each stage's memory; empty
// when no partition fits every stage's memory.
std::vector<int64_t> time_balanced_partition(const ModelSpec& spec, const DeviceInventory& devices,
                                             const PlanOptions& options, const Layout& layout);

nlohmann::json layout_json(const Plan& plan, const LayoutEvaluation& e, bool with_budgets);
nlohmann::json plan_json(const Plan& plan);

}  // namespace shardlm
