#include "plan/planner.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <sstream>
#include <tuple>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/units.h"
#include "plan/explain.h"
#include "plan/moe_accounting.h"
#include "plan/tensor_split.h"

namespace shardlm {

double default_inter_node_latency(double inter_node_bandwidth) {
  return inter_node_bandwidth >= 100e9 / 8 ? kInterNodeLatency : kEthernetInterNodeLatency;
}

double all_reduce_latency(int n_hosts, double inter_node_latency) {
  double hops = 0;
  for (int span = 1; span < n_hosts; span *= 2) hops += 2;
  return kIntraNodeLatency + hops * inter_node_latency;
}

double moe_expert_fraction(const ModelSpec& spec, int64_t batch) {
  if (!spec.is_moe()) return 1.0;
  const double p = static_cast<double>(spec.n_experts_per_token) / static_cast<double>(spec.n_experts);
  return 1.0 - std::pow(1.0 - p, static_cast<double>(std::max<int64_t>(1, batch)));
}

const char* objective_name(Objective objective) {
  return objective == Objective::kLatency ? "latency" : "throughput";
}

namespace {

// Whether TP=tp can slice a quantized checkpoint on whole groups.
bool quantized_tp_ok(const ModelSpec& spec, int tp) {
  try {
    check_quantized_layout(spec, Layout{tp, 1, 1, {}});
    return true;
  } catch (const Error&) {
    return false;
  }
}

// Bytes one rank reads per decode step, apart from KV.
struct RankRead {
  int64_t dense = 0;    // everything but the embedding table and MoE experts
  int64_t experts = 0;  // MoE expert weights (a batch touches a fraction)
};

class Evaluator {
 public:
  Evaluator(const ModelSpec& spec, const DeviceInventory& devices, const PlanOptions& options)
      : spec_(spec), tensors_(spec), devices_(devices), options_(options),
        inter_latency_(options.inter_node_latency >= 0 ? options.inter_node_latency
                                                       : default_inter_node_latency(devices.inter_node_bandwidth)) {}

  std::vector<int64_t> bytes_partition(const Layout& layout) const { return pipeline_partition(spec_, tensors_, layout); }

  // KV tokens every rank must hold: one sequence of --max-model-len or the
  // auto minimum, in whole blocks (only its window's when every layer slides).
  int64_t required_tokens() const {
    const int64_t wanted = options_.max_model_len > 0 ? options_.max_model_len
                                                       : std::min(kMinAutoModelLen, spec_.max_position_embeddings);
    return kv_tokens_per_sequence(spec_, wanted, options_.budget.block_size, options_.budget.max_num_batched_tokens);
  }

  // Layer-positions the decode kernels read per sequence over layers
  // [begin, end) at context `context`: every position on a global layer, the
  // last sliding_window on a local one (KV per layer type, issue #22).
  double kv_read_layer_tokens(int64_t begin, int64_t end, int64_t context) const {
    double n = 0;
    for (int64_t l = begin; l < end; ++l)
      n += static_cast<double>(spec_.is_sliding_layer(l) ? std::min(context, spec_.sliding_window) : context);
    return n;
  }

  // See time_balanced_partition in the header.
  std::vector<int64_t> time_partition(const Layout& layout) {
    const int pp = layout.pp, tp = layout.tp;
    const int64_t n = spec_.n_layers;
    if (pp == 1) return {n};
    const int per_replica = layout.ranks_per_replica();
    const int64_t required = required_tokens();
    const int64_t ctx = std::max<int64_t>(1, std::min<int64_t>(required, 8192) / 2);
    struct StageModel {
      double per_layer_s = 0;  // slowest rank: one layer's reads + KV at the typical context ÷ bandwidth
      double fixed_s = 0;      // last stage: lm_head read
      int64_t cap = std::numeric_limits<int64_t>::max();  // layers its devices' memory holds
    };
    std::vector<StageModel> st(static_cast<size_t>(pp));
    const double nl = static_cast<double>(n);
    for (int s = 0; s < pp; ++s) {
      Layout one{tp, 1, 1, {}};
      one.expert_parallel = layout.expert_parallel;
      one.tensor_split = stage_split(layout, s);
      const bool first = s == 0, last = s == pp - 1;
      for (int r = 0; r < tp; ++r) {
        const StageParts& p = parts(one, r);
        for (int d = 0; d < layout.dp; ++d) {
          const DeviceSpec& dev = devices_.devices[static_cast<size_t>(d * per_replica + s * tp + r)];
          const double fixed_mem = (first ? p.embed : 0.0) + (last ? p.head : 0.0);
          const double avail = std::floor(static_cast<double>(dev.memory_bytes) * options_.budget.gpu_memory_utilization) -
                               static_cast<double>(options_.budget.reserve_bytes) - p.workspace - fixed_mem;
          const double per_layer_mem = (p.layer_bytes + static_cast<double>(required) * p.kv) / nl;
          const int64_t cap = avail <= 0 ? 0 : static_cast<int64_t>(std::floor(avail / per_layer_mem));
          StageModel& m = st[static_cast<size_t>(s)];
          m.cap = std::min(m.cap, cap);
          m.per_layer_s = std::max(m.per_layer_s, (p.layer_read + kv_read_layer_tokens(0, n, ctx) / nl * p.kv) / nl /
                                                      dev.memory_bandwidth);
          if (last) m.fixed_s = std::max(m.fixed_s, p.head_read / dev.memory_bandwidth);
        }
      }
    }
    // Dynamic programme over (stage, layers so far): minimise the slowest
    // stage, then the sum (one stream passes every stage), each stage within its cap.
    struct Cell { double max_s; double sum_s; int64_t prev; bool ok; };
    std::vector<std::vector<Cell>> dp(static_cast<size_t>(pp + 1), std::vector<Cell>(static_cast<size_t>(n + 1), {0, 0, -1, false}));
    dp[0][0] = {0, 0, -1, true};
    for (int stage = 1; stage <= pp; ++stage) {
      const StageModel& m = st[static_cast<size_t>(stage - 1)];
      for (int64_t k = stage; k <= n; ++k)
        for (int64_t j = std::max<int64_t>(stage - 1, k - m.cap); j < k; ++j) {
          const Cell& before = dp[static_cast<size_t>(stage - 1)][static_cast<size_t>(j)];
          if (!before.ok) continue;
          const double cost = m.fixed_s + static_cast<double>(k - j) * m.per_layer_s;
          const Cell cand{std::max(before.max_s, cost), before.sum_s + cost, j, true};
          Cell& cur = dp[static_cast<size_t>(stage)][static_cast<size_t>(k)];
          const double eps = 1e-12;
          if (!cur.ok || cand.max_s < cur.max_s - eps || (cand.max_s <= cur.max_s + eps && cand.sum_s < cur.sum_s - eps))
            cur = cand;
        }
    }
    if (!dp[static_cast<size_t>(pp)][static_cast<size_t>(n)].ok) return {};
    std::vector<int64_t> counts(static_cast<size_t>(pp));
    int64_t k = n;
    for (int stage = pp; stage >= 1; --stage) {
      const int64_t j = dp[static_cast<size_t>(stage)][static_cast<size_t>(k)].prev;
      counts[static_cast<size_t>(stage - 1)] = k - j;
      k = j;
    }
    return counts;
  }

  LayoutEvaluation evaluate(Layout layout) {
    LayoutEvaluation e;
    layout.pp_layer_partition = pipeline_partition(spec_, tensors_, layout);
    e.layout = layout;
    e.vllm_partition = vllm_pp_partition(spec_.n_layers, layout.pp);
    e.vllm = vllm_check_layout(spec_, layout);
    e.idle_devices = devices_.n_devices() - layout.world_size();
    const int per_replica = layout.ranks_per_replica();
    e.required_tokens = required_tokens();

    e.headroom_bytes = std::numeric_limits<int64_t>::max();
    e.kv_tokens = std::numeric_limits<int64_t>::max();
    for (int d = 0; d < layout.dp; ++d) {
      std::vector<MemoryBudget> replica;
      for (int r = 0; r < per_replica; ++r) {
        const WorldConfig w{r, layout};
        const int device = d * per_replica + r;
        const MemoryBudget b = budget(layout, w.tp_rank(), w.pp_rank(), devices_.devices[device].memory_bytes);
        // With a draft on this rank, its KV grows with the target's (MemoryBudget).
        const int64_t headroom = b.usable_bytes - b.local_kv_cache_bytes -
                                 e.required_tokens * (b.kv_bytes_per_token + b.draft_kv_bytes_per_token);
        if (headroom < e.headroom_bytes) {
          e.headroom_bytes = headroom;
          e.tightest_replica = d;
          e.tightest_rank = r;
        }
        replica.push_back(b);
      }
      match_replica_kv(replica);
      e.kv_tokens = std::min(e.kv_tokens, replica_kv_tokens(replica));
      e.budgets.push_back(std::move(replica));
    }
    e.fits = e.headroom_bytes >= 0 && e.kv_tokens > 0;
    const int64_t bs = options_.budget.block_size, chunk = options_.budget.max_num_batched_tokens;
    e.max_model_len = options_.max_model_len > 0 ? options_.max_model_len
                                                 : max_context_for_pool(spec_, e.kv_tokens, bs, chunk);
    // Sequences of max_model_len at once: a sliding window over every layer bounds each one's blocks.
    e.max_concurrency = e.max_model_len > 0 ? e.kv_tokens / kv_tokens_per_sequence(spec_, e.max_model_len, bs, chunk) : 0;

    // Which hosts the groups span.
    for (int d = 0; d < layout.dp; ++d) {
      for (int s = 0; s < layout.pp; ++s) {
        const int first = d * per_replica + s * layout.tp;
        if (devices_.node_of(first) != devices_.node_of(first + layout.tp - 1)) e.tp_spans_nodes = true;
        if (s + 1 < layout.pp && devices_.node_of(first + layout.tp - 1) != devices_.node_of(first + layout.tp))
          e.pp_spans_nodes = true;
      }
    }

    imbalance(e);

    // Speed.
    const int64_t ctx_base = options_.max_model_len > 0 ? options_.max_model_len
                                                        : std::min<int64_t>(e.max_model_len, 8192);
    e.context_tokens = std::max<int64_t>(1, ctx_base / 2);
    double worst_single = 0;
    for (int d = 0; d < layout.dp; ++d) {
      Timing t = time_replica(layout, d, 1, e.context_tokens);
      if (t.step > worst_single) {
        worst_single = t.step;
        e.tp_comm_seconds = t.tp_comm;
        e.pp_comm_seconds = t.pp_comm;
        e.stage_seconds = t.stage_seconds;
      }
    }
    e.step_seconds_single = worst_single;
    e.single_stream_tok_s = worst_single > 0 ? 1.0 / worst_single : 0;
    if (e.fits) {
      e.batch = std::clamp<int64_t>(e.kv_tokens / kv_tokens_per_sequence(spec_, e.context_tokens, bs, chunk), 1,
                                    options_.budget.max_num_seqs);
      double worst = std::numeric_limits<double>::max();
      double sum = 0;
      for (int d = 0; d < layout.dp; ++d) {
        const double tok_s = replica_throughput(layout, d, e.batch, e.context_tokens);
        worst = std::min(worst, tok_s);
        sum += tok_s;
      }
      e.replica_tok_s = worst;
      e.aggregate_tok_s = sum;
    }
    return e;
  }

 private:
  struct Timing {
    double step = 0;     // seconds for one token of every sequence in the batch, passing every stage
    double max_stage = 0;
    double tp_comm = 0;
    double pp_comm = 0;
    std::vector<double> stage_seconds;
  };

  // One TP rank of a one-stage layout, by part, for the time balance.
  struct StageParts {
    double layer_bytes = 0;  // every decoder layer
    double layer_read = 0;   // what decode reads of them (experts: the fraction one token touches)
    double embed = 0;        // embed_tokens rows
    double head = 0;         // lm_head (or tied embedding rows) + final norm
    double head_read = 0;
    double kv = 0;           // KV bytes per token, every layer
    double workspace = 0;
  };
  const StageParts& parts(const Layout& one, int tp_rank) {
    auto key = std::make_tuple(one.tp, one.expert_parallel, one.tensor_split, tp_rank);
    auto it = parts_.find(key);
    if (it != parts_.end()) return it->second;
    StageParts p;
    const double fraction = moe_expert_fraction(spec_, 1);
    for (const TensorShard& t : rank_tensors(spec_, tensors_, one, tp_rank, 0)) {
      const double b = static_cast<double>(t.bytes);
      if (t.slot == TensorSlot::kEmbedding) {
        p.embed += b;
        if (spec_.tie_word_embeddings) {
          p.head += b;
          p.head_read += b;
        }
      } else if (t.slot == TensorSlot::kLmHead || t.slot == TensorSlot::kFinalNorm) {
        p.head += b;
        p.head_read += b;
      } else {
        p.layer_bytes += b;
        const bool expert = t.role == ShardRole::kExpertColumn || t.role == ShardRole::kExpertRow;
        p.layer_read += expert ? fraction * b : b;
      }
    }
    p.kv = static_cast<double>(rank_kv_bytes_per_token(spec_, one, tp_rank, 0, options_.budget.kv_cache_dtype));
    p.workspace = static_cast<double>(workspace_breakdown(spec_, one, tp_rank, 0, options_.budget).total());
    return parts_.emplace(key, p).first->second;
  }

  // Every decoder layer of a family has the same tensors, so what a rank holds
  // depends on its stage's layer count and on being the first/last stage, not
  // on which layers: budgets and reads are shared across layouts on this key.
  // MoE models whose layers differ (mlp_only_layers) key on the first layer too.
  // tp, pp > 1, tp_rank, layers, first, last, EP, begin, the stage's tensor split
  using StageKey = std::tuple<int, bool, int, int64_t, bool, bool, bool, int64_t, std::vector<double>>;
  static StageKey stage_key_of(const ModelSpec& spec, const Layout& layout, int tp_rank, int pp_rank) {
    int64_t begin = 0;
    const bool mixed = spec.is_moe() && spec.n_moe_layers() != spec.n_layers;
    if (mixed)
      for (int s = 0; s < pp_rank; ++s) begin += layout.pp_layer_partition[s];
    return {layout.tp, layout.pp > 1, tp_rank, layout.pp_layer_partition[pp_rank], pp_rank == 0,
            pp_rank == layout.pp - 1, layout.expert_parallel, begin, stage_split(layout, pp_rank)};
  }
  StageKey stage_key(const Layout& layout, int tp_rank, int pp_rank) const {
    return stage_key_of(spec_, layout, tp_rank, pp_rank);
  }

  MemoryBudget budget(const Layout& layout, int tp_rank, int pp_rank, int64_t memory) {
    auto key = std::make_tuple(stage_key(layout, tp_rank, pp_rank), memory);
    auto it = budgets_.find(key);
    if (it == budgets_.end())
      it = budgets_.emplace(key, compute_memory_budget(spec_, tensors_, layout, tp_rank, pp_rank, memory, options_.budget)).first;
    MemoryBudget b = it->second;
    b.pp_rank = pp_rank;
    return b;
  }

  const RankRead& read(const Layout& layout, int tp_rank, int pp_rank) {
    const StageKey key = stage_key(layout, tp_rank, pp_rank);
    auto it = reads_.find(key);
    if (it != reads_.end()) return it->second;
    const RankShard s = shard_for(spec_, layout, tp_rank, pp_rank);
    RankRead r;
    for (const TensorShard& t : rank_tensors(spec_, tensors_, layout, tp_rank, pp_rank)) {
      // Decode reads one embedding row per sequence, unless the table is also the lm_head here.
      if (t.slot == TensorSlot::kEmbedding && !(spec_.tie_word_embeddings && s.last_stage)) continue;
      if (t.role == ShardRole::kExpertColumn || t.role == ShardRole::kExpertRow) r.experts += t.bytes;
      else r.dense += t.bytes;
    }
    return reads_.emplace(key, r).first->second;
  }

  int64_t kv_per_token(const Layout& layout, int tp_rank, int pp_rank) {
    const StageKey key = stage_key(layout, tp_rank, pp_rank);
    auto it = kvpt_.find(key);
    if (it == kvpt_.end())
      it = kvpt_.emplace(key, rank_kv_bytes_per_token(spec_, layout, tp_rank, pp_rank, options_.budget.kv_cache_dtype))
               .first;
    return it->second;
  }

  // One replica, B sequences at context C, a single pass through the stages.
  Timing time_replica(const Layout& layout, int d, int64_t batch, int64_t context) {
    Timing t;
    const int per_replica = layout.ranks_per_replica();
    const double a = static_cast<double>(dtype_size(spec_.dtype));
    const double expert_fraction = moe_expert_fraction(spec_, batch);
    const double msg = static_cast<double>(batch) * spec_.hidden_size * a;  // one activation message
    int64_t layer_begin = 0;
    for (int s = 0; s < layout.pp; ++s) {
      const int first = d * per_replica + s * layout.tp;
      double compute = 0;
      double link = std::numeric_limits<double>::max();
      const int64_t n_stage_layers = layout.pp_layer_partition[s];
      // KV read per sequence, in layer-positions: a local layer reads its window only.
      const double kv_read = kv_read_layer_tokens(layer_begin, layer_begin + n_stage_layers, context);
      layer_begin += n_stage_layers;
      for (int r = 0; r < layout.tp; ++r) {
        const DeviceSpec& dev = devices_.devices[first + r];
        const RankRead& rr = read(layout, r, s);
        const double kv_per_layer = static_cast<double>(kv_per_token(layout, r, s)) / static_cast<double>(n_stage_layers);
        const double bytes = static_cast<double>(rr.dense) + expert_fraction * static_cast<double>(rr.experts) +
                             static_cast<double>(batch) * kv_read * kv_per_layer;
        compute = std::max(compute, bytes / dev.memory_bandwidth);
        link = std::min(link, dev.link_bandwidth);
      }
      double comm = 0;
      if (layout.tp > 1) {
        const int n_hosts = devices_.node_of(first + layout.tp - 1) - devices_.node_of(first) + 1;
        if (n_hosts > 1) link = devices_.inter_node_bandwidth;
        const double latency = all_reduce_latency(n_hosts, inter_latency_);
        const double tp = layout.tp;
        const double all_reduce = 2.0 * (tp - 1) / tp * msg / link + latency;
        const int64_t layers = layout.pp_layer_partition[s];
        comm = 2.0 * static_cast<double>(layers) * all_reduce;
        if (s == layout.pp - 1)  // logits: gather B × vocab f32
          comm += (tp - 1) / tp * static_cast<double>(batch) * spec_.vocab_size * 4.0 / link + latency;
      }
      t.tp_comm += comm;
      const double stage = compute + comm;
      t.stage_seconds.push_back(stage);
      t.step += stage;
      t.max_stage = std::max(t.max_stage, stage);
      if (s + 1 < layout.pp) {
        const int a_dev = first + layout.tp - 1;
        const int b_dev = first + layout.tp;
        const bool spans = devices_.node_of(a_dev) != devices_.node_of(b_dev);
        const double bw = spans ? devices_.inter_node_bandwidth
                                : std::min(devices_.devices[a_dev].link_bandwidth, devices_.devices[b_dev].link_bandwidth);
        const double send = msg / bw + (spans ? inter_latency_ : kIntraNodeLatency);
        t.pp_comm += send;
        t.step += send;
      }
    }
    return t;
  }

  double replica_throughput(const Layout& layout, int d, int64_t batch, int64_t context) {
    const int64_t m = std::min<int64_t>(layout.pp, batch);
    const int64_t micro = (batch + m - 1) / m;
    const Timing t = time_replica(layout, d, micro, context);
    const double round = std::max(t.step, static_cast<double>(m) * t.max_stage);
    return round > 0 ? static_cast<double>(batch) / round : 0;
  }

  void imbalance(LayoutEvaluation& e) {
    const Layout& layout = e.layout;
    auto add = [&](const std::string& what, const std::vector<int64_t>& values) {
      if (values.empty()) return;
      Imbalance im;
      im.what = what;
      auto mx = std::max_element(values.begin(), values.end());
      auto mn = std::min_element(values.begin(), values.end());
      im.max = *mx;
      im.min = *mn;
      im.max_rank = static_cast<int>(mx - values.begin());
      im.min_rank = static_cast<int>(mn - values.begin());
      if (im.max != im.min) e.imbalance.push_back(im);
    };
    std::vector<int64_t> q, kv, inter, experts, expert_cols, layers, weights;
    const bool has_dense = !spec_.is_moe() || spec_.n_moe_layers() < spec_.n_layers;
    for (int r = 0; r < layout.tp; ++r) {
      const RankShard s = shard_for(spec_, layout, r, 0);
      q.push_back(s.q_heads.size());
      kv.push_back(s.kv_heads.size());
      if (has_dense) inter.push_back(s.intermediate.size());
      if (spec_.is_moe()) {
        experts.push_back(s.experts.size());
        expert_cols.push_back(s.expert_intermediate.size());
      }
    }
    for (int s = 0; s < layout.pp; ++s) layers.push_back(layout.pp_layer_partition[s]);
    for (const auto& b : e.budgets.front()) weights.push_back(b.weight_bytes);
    add("Q heads", q);
    add("KV heads", kv);
    add("MLP columns", inter);
    add("experts", experts);
    add("expert MLP columns", expert_cols);
    add("layers", layers);
    add("weight bytes", weights);
  }

  const ModelSpec& spec_;
  const ModelTensors tensors_;
  const DeviceInventory& devices_;
  const PlanOptions& options_;
  std::map<std::tuple<StageKey, int64_t>, MemoryBudget> budgets_;
  std::map<StageKey, RankRead> reads_;
  std::map<StageKey, int64_t> kvpt_;
  std::map<std::tuple<int, bool, std::vector<double>, int>, StageParts> parts_;
  const double inter_latency_;
};

// a better than b for the objective; ties: the other objective, then fewer devices, then lower TP.
bool better(const LayoutEvaluation& a, const LayoutEvaluation& b, Objective objective) {
  const Objective other = objective == Objective::kLatency ? Objective::kThroughput : Objective::kLatency;
  auto close = [](double x, double y) { return std::fabs(x - y) <= 1e-9 * std::max(std::fabs(x), std::fabs(y)); };
  const double sa = objective_score(a, objective), sb = objective_score(b, objective);
  if (!close(sa, sb)) return sa > sb;
  const double oa = objective_score(a, other), ob = objective_score(b, other);
  if (!close(oa, ob)) return oa > ob;
  if (a.layout.world_size() != b.layout.world_size()) return a.layout.world_size() < b.layout.world_size();
  return a.layout.tp < b.layout.tp;
}

// a preferred to b among the candidate splits of one (TP, PP, DP): fitting
// first, then the objective (ties keep b, the engine's default), then headroom.
bool preferred(const LayoutEvaluation& a, const LayoutEvaluation& b, Objective objective) {
  if (a.fits != b.fits) return a.fits;
  if (!a.fits) return a.headroom_bytes > b.headroom_bytes;
  const double sa = objective_score(a, objective), sb = objective_score(b, objective);
  return sa > sb * (1 + 1e-9);
}

// Candidate --tensor-split weights for the devices `layout` lands on (replica
// 0): memory^a × bandwidth^(1−a) per stage, a = 0, 0.1, ..., 1, rounded to
// 3 decimals so that the printed split is the evaluated one. None when every
// TP group has identical devices.
std::vector<std::vector<double>> candidate_splits(const DeviceInventory& devices, const MemoryBudgetOptions& o,
                                                  const Layout& layout) {
  if (layout.tp == 1) return {};
  bool mixed = false;
  for (int d = 0; d < layout.dp; ++d)
    for (int st = 0; st < layout.pp; ++st)
      for (int r = 1; r < layout.tp; ++r) {
        const DeviceSpec& a = devices.devices[static_cast<size_t>((d * layout.pp + st) * layout.tp)];
        const DeviceSpec& b = devices.devices[static_cast<size_t>((d * layout.pp + st) * layout.tp + r)];
        mixed |= a.memory_bytes != b.memory_bytes || a.memory_bandwidth != b.memory_bandwidth;
      }
  if (!mixed) return {};
  std::vector<std::vector<double>> out;
  for (int step = 0; step <= 10; ++step) {
    const double a = step / 10.0;
    std::vector<double> all;
    bool stages_alike = true;
    for (int st = 0; st < layout.pp; ++st) {
      std::vector<double> w;
      double sum = 0;
      for (int r = 0; r < layout.tp; ++r) {
        const DeviceSpec& dev = devices.devices[static_cast<size_t>(st * layout.tp + r)];
        const double mem = std::max(1.0, static_cast<double>(dev.memory_bytes) * o.gpu_memory_utilization -
                                             static_cast<double>(o.reserve_bytes));
        w.push_back(std::pow(mem, a) * std::pow(dev.memory_bandwidth, 1 - a));
        sum += w.back();
      }
      for (double& x : w) x = std::max(0.001, std::round(1000.0 * x / sum) / 1000.0);
      if (st > 0 && !std::equal(w.begin(), w.end(), all.begin())) stages_alike = false;
      all.insert(all.end(), w.begin(), w.end());
    }
    if (stages_alike) all.resize(static_cast<size_t>(layout.tp));
    if (std::find(out.begin(), out.end(), all) == out.end()) out.push_back(all);
  }
  return out;
}

}  // namespace

std::vector<int64_t> time_balanced_partition(const ModelSpec& spec, const DeviceInventory& devices,
                                             const PlanOptions& options, const Layout& layout) {
  validate_layout(spec, layout);
  Evaluator ev(spec, devices, options);
  return ev.time_partition(layout);
}

double objective_score(const LayoutEvaluation& e, Objective objective) {
  return objective == Objective::kLatency ? e.single_stream_tok_s : e.aggregate_tok_s;
}

Plan make_plan(const ModelSpec& spec, const DeviceInventory& devices, const PlanOptions& options,
               const std::string& model_name, const std::string& hf_repo) {
  if (devices.n_devices() < 1) fail(ErrorCode::kInvalidArgument, "--gpus: no devices given");
  if (devices.n_devices() > kMaxPlanDevices)
    fail(ErrorCode::kInvalidArgument, "--gpus: ", devices.n_devices(), " devices; plan enumerates layouts for at most ",
         kMaxPlanDevices, " — plan one group of hosts and run it as data-parallel replicas");
  if (options.max_model_len < 0)
    fail(ErrorCode::kInvalidArgument, "--max-model-len ", options.max_model_len, ": must be positive");
  if (options.max_model_len > spec.max_position_embeddings)
    fail(ErrorCode::kInvalidArgument, "--max-model-len ", options.max_model_len,
         " is greater than the model's context of ", spec.max_position_embeddings, " tokens (",
         spec.max_position_source(), "); use at most ", spec.max_position_embeddings);
  // Validates utilization, token counts and block size once, with the user's flag names.
  compute_memory_budget(spec, Layout{}, 0, 0, devices.devices[0].memory_bytes, options.budget);

  Plan plan;
  plan.spec = spec;
  plan.model_name = model_name;
  plan.hf_repo = hf_repo;
  plan.checkpoint_bytes = rank_weight_bytes(spec, Layout{}, 0, 0);
  plan.devices = devices;
  plan.options = options;
  Evaluator evaluator(spec, devices, options);
  const int n = devices.n_devices();
  const auto& user_split = options.tensor_split;
  const auto& user_partition = options.pp_layer_partition;
  if (!user_partition.empty()) {
    Layout check{1, static_cast<int>(user_partition.size()), 1, user_partition};
    validate_layout(spec, check);  // sums and entries, with the flag's name
  }
  for (int tp = 1; tp <= std::min<int64_t>(spec.n_heads, n); ++tp) {
    if (!quantized_tp_ok(spec, tp)) continue;  // slices would cut quantization groups
    for (int pp = 1; pp <= std::min<int64_t>(spec.n_layers, n / tp); ++pp) {
      if (!user_partition.empty() && static_cast<int>(user_partition.size()) != pp) continue;
      const size_t n_split = user_split.size();
      if (n_split > 0 && n_split != static_cast<size_t>(tp) && n_split != static_cast<size_t>(tp * pp)) continue;
      for (int dp = 1; dp <= n / (tp * pp); ++dp) {
        Layout layout{tp, pp, dp, user_partition};
        layout.expert_parallel = options.expert_parallel && tp > 1;
        layout.tensor_split = user_split;
        LayoutEvaluation even = evaluator.evaluate(layout);
        even.bytes_partition = evaluator.bytes_partition(layout);
        LayoutEvaluation best = even;
        // Plan's own choices where the user fixed none: splits for mixed
        // devices, and the layers balanced by time.
        std::vector<std::vector<double>> splits{user_split};
        if (user_split.empty())
          for (auto& w : candidate_splits(devices, options.budget, layout)) splits.push_back(std::move(w));
        for (const auto& split : splits) {
          Layout l = layout;
          l.tensor_split = split;
          try {
            const std::vector<int64_t> bytes = evaluator.bytes_partition(l);
            if (!split.empty() && split != user_split) {
              LayoutEvaluation c = evaluator.evaluate(l);
              c.bytes_partition = bytes;
              if (preferred(c, best, options.objective)) best = std::move(c);
            }
            if (pp > 1 && user_partition.empty()) {
              std::vector<int64_t> timed = evaluator.time_partition(l);
              if (!timed.empty() && timed != bytes) {
                l.pp_layer_partition = timed;
                LayoutEvaluation c = evaluator.evaluate(l);
                c.bytes_partition = bytes;
                c.partition_by_time = true;
                if (preferred(c, best, options.objective)) best = std::move(c);
              }
            }
          } catch (const Error&) {
            // A split some unit cannot follow (quantization groups, fewer units than ranks): not a candidate.
          }
        }
        if (best.layout.tensor_split != layout.tensor_split || best.partition_by_time)
          best.even = {true, even.fits, even.headroom_bytes, even.kv_tokens, even.single_stream_tok_s,
                       even.aggregate_tok_s, even.layout.pp_layer_partition, even.budgets};
        plan.layouts.push_back(std::move(best));
      }
    }
  }

  for (int i = 0; i < static_cast<int>(plan.layouts.size()); ++i) {
    const LayoutEvaluation& e = plan.layouts[i];
    if (!e.fits) continue;
    if (plan.recommended < 0 || better(e, plan.layouts[plan.recommended], options.objective)) plan.recommended = i;
    // vLLM has no tensor split: its closest layout is an even one.
    if (e.vllm.accepted && e.layout.tensor_split.empty() && (plan.best_vllm < 0 || better(e, plan.layouts[plan.best_vllm], options.objective)))
      plan.best_vllm = i;
  }

  // Nothing fits on a uniform box: how many such devices would (up to 4×).
  bool uniform = std::all_of(devices.devices.begin(), devices.devices.end(),
                             [&](const DeviceSpec& d) { return d.memory_bytes == devices.devices[0].memory_bytes; });
  if (plan.recommended < 0 && uniform) {
    for (int m = n + 1; m <= 4 * n && plan.devices_needed == 0; ++m) {
      DeviceInventory more;
      more.devices.assign(m, devices.devices[0]);
      Evaluator ev(spec, more, options);
      for (int tp = 1; tp <= std::min<int64_t>(spec.n_heads, m) && plan.devices_needed == 0; ++tp) {
        if (m % tp != 0 || m / tp > spec.n_layers || !quantized_tp_ok(spec, tp)) continue;
        Layout layout{tp, m / tp, 1, {}};
        layout.expert_parallel = options.expert_parallel && tp > 1;
        if (ev.evaluate(layout).fits) plan.devices_needed = m;
      }
    }
  }
  return plan;
}

std::string shardlm_serve_command(const Plan& plan, const LayoutEvaluation& e) {
  std::ostringstream out;
  out << "shardlm serve " << (plan.model_name.empty() ? "MODEL" : plan.model_name) << " -tp " << e.layout.tp << " -pp "
      << e.layout.pp << " -dp " << e.layout.dp << " --max-model-len " << e.max_model_len << " --max-num-seqs "
      << plan.options.budget.max_num_seqs << " --gpu-memory-utilization " << plan.options.budget.gpu_memory_utilization;
  if (plan.options.budget.kv_cache_dtype != KvCacheDType::kAuto)
    out << " --kv-cache-dtype " << kv_dtype_name(plan.options.budget.kv_cache_dtype);
  if (e.layout.expert_parallel) out << " --enable-expert-parallel";
  if (!e.layout.tensor_split.empty()) out << " --tensor-split " << format_tensor_split(e.layout.tensor_split);
  if (e.layout.pp > 1 && (e.partition_by_time || !plan.options.pp_layer_partition.empty())) {
    out << " --pp-layer-partition ";
    for (size_t i = 0; i < e.layout.pp_layer_partition.size(); ++i) out << (i ? "," : "") << e.layout.pp_layer_partition[i];
  }
  if (!plan.options.speculative_config.empty()) out << " --speculative-config '" << plan.options.speculative_config << "'";
  return out.str();
}

std::string vllm_serve_command(const Plan& plan, const LayoutEvaluation& e) {
  if (!e.vllm.accepted || !e.layout.tensor_split.empty()) return "";
  std::ostringstream out;
  out << "vllm serve " << (plan.hf_repo.empty() ? plan.model_name : plan.hf_repo) << " --tensor-parallel-size "
      << e.layout.tp << " --pipeline-parallel-size " << e.layout.pp << " --data-parallel-size " << e.layout.dp
      << " --max-model-len " << e.max_model_len << " --max-num-seqs " << plan.options.budget.max_num_seqs
      << " --gpu-memory-utilization " << plan.options.budget.gpu_memory_utilization;
  if (plan.options.budget.kv_cache_dtype == KvCacheDType::kFp8) out << " --kv-cache-dtype fp8";
  if (plan.options.budget.max_num_batched_tokens != 8192)
    out << " --max-num-batched-tokens " << plan.options.budget.max_num_batched_tokens;
  if (e.layout.expert_parallel) out << " --enable-expert-parallel";
  if (!plan.options.speculative_config.empty()) out << " --speculative-config '" << plan.options.speculative_config << "'";
  return out.str();
}

nlohmann::json layout_json(const Plan& plan, const LayoutEvaluation& e, bool with_budgets) {
  nlohmann::json j = {
      {"tp", e.layout.tp},
      {"pp", e.layout.pp},
      {"dp", e.layout.dp},
      {"pp_layer_partition", e.layout.pp_layer_partition},
      {"pp_partition_by", e.partition_by_time ? "time" : "bytes"},
      {"bytes_pp_layer_partition", e.bytes_partition},
      {"stage_seconds_single_stream", e.stage_seconds},
      {"tensor_split", e.layout.tensor_split.empty() ? nlohmann::json() : nlohmann::json(e.layout.tensor_split)},
      {"expert_parallel", e.layout.expert_parallel},
      {"vllm_pp_layer_partition", e.vllm_partition},
      {"fits", e.fits},
      {"required_kv_tokens", e.required_tokens},
      {"headroom_bytes", e.headroom_bytes},
      {"headroom_gib", static_cast<double>(e.headroom_bytes) / kGiB},
      {"tightest", {{"replica", e.tightest_replica}, {"rank", e.tightest_rank}}},
      {"kv_tokens_per_replica", e.kv_tokens},
      {"max_model_len", e.max_model_len},
      {"max_concurrency", e.max_concurrency},
      {"idle_devices", e.idle_devices},
      {"tp_spans_nodes", e.tp_spans_nodes},
      {"pp_spans_nodes", e.pp_spans_nodes},
      {"vllm", {{"accepted", e.vllm.accepted}, {"reason", e.vllm.reason}, {"where", e.vllm.where}, {"rule", e.vllm.rule}}},
      {"speed",
       {{"context_tokens", e.context_tokens},
        {"batch", e.batch},
        {"single_stream_step_seconds", e.step_seconds_single},
        {"single_stream_tokens_per_s", e.single_stream_tok_s},
        {"replica_tokens_per_s", e.replica_tok_s},
        {"aggregate_tokens_per_s", e.aggregate_tok_s},
        {"tp_comm_seconds_per_token", e.tp_comm_seconds},
        {"pp_comm_seconds_per_token", e.pp_comm_seconds}}},
      {"shardlm_command", shardlm_serve_command(plan, e)},
      {"vllm_command", vllm_serve_command(plan, e)},
  };
  nlohmann::json im = nlohmann::json::array();
  for (const auto& i : e.imbalance)
    im.push_back({{"what", i.what}, {"max", i.max}, {"min", i.min}, {"max_rank", i.max_rank}, {"min_rank", i.min_rank},
                  {"percent", i.percent()}});
  j["imbalance"] = im;
  if (e.even.evaluated)
    j["even_split"] = {{"fits", e.even.fits},
                       {"headroom_bytes", e.even.headroom_bytes},
                       {"kv_tokens_per_replica", e.even.kv_tokens},
                       {"single_stream_tokens_per_s", e.even.single_stream_tok_s},
                       {"aggregate_tokens_per_s", e.even.aggregate_tok_s},
                       {"pp_layer_partition", e.even.pp_layer_partition}};
  if (!e.layout.tensor_split.empty()) {
    nlohmann::json stages = nlohmann::json::array();
    const int n_stages = e.layout.tensor_split.size() > static_cast<size_t>(e.layout.tp) ? e.layout.pp : 1;
    for (int st = 0; st < n_stages; ++st) {
      const RealisedSplit r = realised_split(plan.spec, e.layout, st);
      stages.push_back({{"stage", st}, {"requested", r.requested}, {"q_heads", r.q_heads}, {"mlp_columns", r.mlp},
                        {"experts", r.experts}, {"vocab", r.vocab}});
    }
    j["realised_split"] = stages;
  }
  if (with_budgets) {
    nlohmann::json replicas = nlohmann::json::array();
    const int per_replica = e.layout.ranks_per_replica();
    for (size_t d = 0; d < e.budgets.size(); ++d) {
      nlohmann::json ranks = nlohmann::json::array();
      for (size_t r = 0; r < e.budgets[d].size(); ++r) {
        nlohmann::json b = memory_budget_json(e.budgets[d][r]);
        const int device = static_cast<int>(d) * per_replica + static_cast<int>(r);
        b["rank"] = device;
        b["device"] = device;
        b["device_name"] = plan.devices.devices[device].name;
        b["node"] = plan.devices.node_of(device);
        ranks.push_back(b);
      }
      replicas.push_back(ranks);
    }
    j["budgets"] = replicas;
  }
  return j;
}

nlohmann::json plan_json(const Plan& plan) {
  const ModelSpec& s = plan.spec;
  nlohmann::json devices = nlohmann::json::array();
  for (int i = 0; i < plan.devices.n_devices(); ++i) {
    nlohmann::json d = device_json(plan.devices.devices[i]);
    d["index"] = i;
    d["node"] = plan.devices.node_of(i);
    devices.push_back(d);
  }
  nlohmann::json layouts = nlohmann::json::array();
  for (const auto& e : plan.layouts) layouts.push_back(layout_json(plan, e, false));
  const MemoryBudgetOptions& b = plan.options.budget;
  const KvLayerTypes kvt = kv_layer_types(s, b.kv_cache_dtype);
  nlohmann::json j = {
      {"model",
       {{"name", plan.model_name},
        {"hf_repo", plan.hf_repo},
        {"architecture", s.architecture},
        {"dtype", dtype_torch_name(s.dtype)},
        {"n_layers", s.n_layers},
        {"n_heads", s.n_heads},
        {"n_kv_heads", s.n_kv_heads},
        {"head_dim", s.head_dim},
        {"hidden_size", s.hidden_size},
        {"intermediate_size", s.intermediate_size},
        {"vocab_size", s.vocab_size},
        {"max_position_embeddings", s.max_position_embeddings},
        {"weight_bytes", plan.checkpoint_bytes},
        {"quantization", s.quant.enabled() ? nlohmann::json(s.quant.describe()) : nlohmann::json()},
        {"kv_bytes_per_token", model_kv_bytes_per_token(s, b.kv_cache_dtype)},
        // KV per layer type (issue #22): local layers are read over their window only;
        // cache_sliding_window > 0 when the cache releases the blocks that leave it;
        // local_pool_window > 0 when the local layers have a pool of their own
        // (local_pool_blocks per rank; the ranks' budgets carry its bytes).
        {"kv_layer_types",
         {{"n_global_layers", kvt.n_global_layers},
          {"n_local_layers", kvt.n_local_layers},
          {"sliding_window", kvt.window},
          {"global_bytes_per_token", kvt.global_bytes_per_token},
          {"local_bytes_per_token", kvt.local_bytes_per_token},
          {"cache_sliding_window", cache_sliding_window(s)},
          {"local_pool_window", local_pool_window(s)},
          {"local_pool_blocks", local_pool_blocks(s, b)}}}}},
      {"devices", devices},
      {"n_nodes", plan.devices.n_nodes},
      {"inter_node_bandwidth_gb_per_s", plan.devices.inter_node_bandwidth / kGB},
      {"options",
       {{"max_model_len", plan.options.max_model_len > 0 ? nlohmann::json(plan.options.max_model_len) : nlohmann::json()},
        {"max_num_seqs", b.max_num_seqs},
        {"max_num_batched_tokens", b.max_num_batched_tokens},
        {"gpu_memory_utilization", b.gpu_memory_utilization},
        {"kv_cache_dtype", kv_dtype_name(b.kv_cache_dtype)},
        {"block_size", b.block_size},
        {"reserve_bytes", b.reserve_bytes},
        {"objective", objective_name(plan.options.objective)}}},
      {"fits", plan.recommended >= 0},
      {"recommended", plan.recommended >= 0 ? layout_json(plan, plan.layouts[plan.recommended], true) : nlohmann::json()},
      {"best_vllm_layout",
       plan.best_vllm >= 0 ? layout_json(plan, plan.layouts[plan.best_vllm], false) : nlohmann::json()},
      {"devices_needed", plan.devices_needed > 0 ? nlohmann::json(plan.devices_needed) : nlohmann::json()},
      {"layouts", layouts},
      {"explanation", explain_plan(plan)},
  };
  j["options"]["enable_expert_parallel"] = plan.options.expert_parallel;
  // --speculative-config: what it adds (the per-rank budgets carry the draft's bytes on rank 0).
  if (plan.options.num_speculative_tokens > 0) {
    nlohmann::json sp = {{"method", plan.options.draft_model.empty() ? "ngram" : "draft_model"},
                         {"num_speculative_tokens", plan.options.num_speculative_tokens},
                         {"logit_rows_per_seq", b.logit_rows_per_seq},
                         {"draft_model", plan.options.draft_model.empty() ? nlohmann::json() : nlohmann::json(plan.options.draft_model)},
                         {"draft", nlohmann::json()}};
    if (b.draft.enabled())
      sp["draft"] = {{"weight_bytes", b.draft.weight_bytes},
                     {"workspace_bytes", b.draft.workspace_bytes},
                     {"kv_bytes_per_token", b.draft.kv_bytes_per_token}};
    j["options"]["speculative"] = sp;
  }
  if (s.is_moe()) {
    const int tp = plan.recommended >= 0 ? plan.layouts[plan.recommended].layout.tp
                                         : static_cast<int>(std::min<int64_t>(plan.devices.n_devices(), s.n_heads));
    j["moe"] = moe_json(s, b.kv_cache_dtype, tp, b.max_num_seqs);
  }
  return j;
}

}  // namespace shardlm
