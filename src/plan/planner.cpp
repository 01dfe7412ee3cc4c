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

namespace shardlm {

double all_reduce_latency(int n_hosts) {
  double hops = 0;
  for (int span = 1; span < n_hosts; span *= 2) hops += 2;
  return kIntraNodeLatency + hops * kInterNodeLatency;
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
      : spec_(spec), tensors_(spec), devices_(devices), options_(options) {}

  LayoutEvaluation evaluate(Layout layout) {
    LayoutEvaluation e;
    layout.pp_layer_partition = pipeline_partition(spec_, tensors_, layout);
    e.layout = layout;
    e.vllm_partition = vllm_pp_partition(spec_.n_layers, layout.pp);
    e.vllm = vllm_check_layout(spec_, layout);
    e.idle_devices = devices_.n_devices() - layout.world_size();
    const int per_replica = layout.ranks_per_replica();
    const int64_t block = options_.budget.block_size;
    const int64_t wanted = options_.max_model_len > 0 ? options_.max_model_len
                                                       : std::min(kMinAutoModelLen, spec_.max_position_embeddings);
    e.required_tokens = (wanted + block - 1) / block * block;

    e.headroom_bytes = std::numeric_limits<int64_t>::max();
    e.kv_tokens = std::numeric_limits<int64_t>::max();
    for (int d = 0; d < layout.dp; ++d) {
      std::vector<MemoryBudget> replica;
      for (int r = 0; r < per_replica; ++r) {
        const WorldConfig w{r, layout};
        const int device = d * per_replica + r;
        const MemoryBudget b = budget(layout, w.tp_rank(), w.pp_rank(), devices_.devices[device].memory_bytes);
        const int64_t headroom = b.usable_bytes - e.required_tokens * b.kv_bytes_per_token;
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
    e.max_model_len = options_.max_model_len > 0 ? options_.max_model_len
                                                 : std::min(e.kv_tokens, spec_.max_position_embeddings);
    e.max_concurrency = e.max_model_len > 0 ? e.kv_tokens / e.max_model_len : 0;

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
      }
    }
    e.step_seconds_single = worst_single;
    e.single_stream_tok_s = worst_single > 0 ? 1.0 / worst_single : 0;
    if (e.fits) {
      e.batch = std::clamp<int64_t>(e.kv_tokens / e.context_tokens, 1, options_.budget.max_num_seqs);
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
  };

  // Every decoder layer of a family has the same tensors, so what a rank holds
  // depends on its stage's layer count and on being the first/last stage, not
  // on which layers: budgets and reads are shared across layouts on this key.
  // MoE models whose layers differ (mlp_only_layers) key on the first layer too.
  using StageKey = std::tuple<int, bool, int, int64_t, bool, bool, bool, int64_t>;  // tp, pp > 1, tp_rank, layers, first, last, EP, begin
  static StageKey stage_key_of(const ModelSpec& spec, const Layout& layout, int tp_rank, int pp_rank) {
    int64_t begin = 0;
    const bool mixed = spec.is_moe() && spec.n_moe_layers() != spec.n_layers;
    if (mixed)
      for (int s = 0; s < pp_rank; ++s) begin += layout.pp_layer_partition[s];
    return {layout.tp, layout.pp > 1, tp_rank, layout.pp_layer_partition[pp_rank], pp_rank == 0,
            pp_rank == layout.pp - 1, layout.expert_parallel, begin};
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
      if (t.name == "model.embed_tokens.weight" && !(spec_.tie_word_embeddings && s.last_stage)) continue;
      if (t.name.find(".experts.") != std::string::npos) r.experts += t.bytes;
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
    for (int s = 0; s < layout.pp; ++s) {
      const int first = d * per_replica + s * layout.tp;
      double compute = 0;
      double link = std::numeric_limits<double>::max();
      for (int r = 0; r < layout.tp; ++r) {
        const DeviceSpec& dev = devices_.devices[first + r];
        const RankRead& rr = read(layout, r, s);
        const double bytes = static_cast<double>(rr.dense) + expert_fraction * static_cast<double>(rr.experts) +
                             static_cast<double>(batch * context * kv_per_token(layout, r, s));
        compute = std::max(compute, bytes / dev.memory_bandwidth);
        link = std::min(link, dev.link_bandwidth);
      }
      double comm = 0;
      if (layout.tp > 1) {
        const int n_hosts = devices_.node_of(first + layout.tp - 1) - devices_.node_of(first) + 1;
        if (n_hosts > 1) link = devices_.inter_node_bandwidth;
        const double latency = all_reduce_latency(n_hosts);
        const double tp = layout.tp;
        const double all_reduce = 2.0 * (tp - 1) / tp * msg / link + latency;
        const int64_t layers = layout.pp_layer_partition[s];
        comm = 2.0 * static_cast<double>(layers) * all_reduce;
        if (s == layout.pp - 1)  // logits: gather B × vocab f32
          comm += (tp - 1) / tp * static_cast<double>(batch) * spec_.vocab_size * 4.0 / link + latency;
      }
      t.tp_comm += comm;
      const double stage = compute + comm;
      t.step += stage;
      t.max_stage = std::max(t.max_stage, stage);
      if (s + 1 < layout.pp) {
        const int a_dev = first + layout.tp - 1;
        const int b_dev = first + layout.tp;
        const bool spans = devices_.node_of(a_dev) != devices_.node_of(b_dev);
        const double bw = spans ? devices_.inter_node_bandwidth
                                : std::min(devices_.devices[a_dev].link_bandwidth, devices_.devices[b_dev].link_bandwidth);
        const double send = msg / bw + (spans ? kInterNodeLatency : kIntraNodeLatency);
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

}  // namespace

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
         " is greater than the model's max_position_embeddings (", spec.max_position_embeddings,
         " in config.json); use at most ", spec.max_position_embeddings);
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
  for (int tp = 1; tp <= std::min<int64_t>(spec.n_heads, n); ++tp) {
    if (!quantized_tp_ok(spec, tp)) continue;  // slices would cut quantization groups
    for (int pp = 1; pp <= std::min<int64_t>(spec.n_layers, n / tp); ++pp)
      for (int dp = 1; dp <= n / (tp * pp); ++dp) {
        Layout layout{tp, pp, dp, {}};
        layout.expert_parallel = options.expert_parallel && tp > 1;
        plan.layouts.push_back(evaluator.evaluate(layout));
      }
  }

  for (int i = 0; i < static_cast<int>(plan.layouts.size()); ++i) {
    const LayoutEvaluation& e = plan.layouts[i];
    if (!e.fits) continue;
    if (plan.recommended < 0 || better(e, plan.layouts[plan.recommended], options.objective)) plan.recommended = i;
    if (e.vllm.accepted && (plan.best_vllm < 0 || better(e, plan.layouts[plan.best_vllm], options.objective)))
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
  return out.str();
}

std::string vllm_serve_command(const Plan& plan, const LayoutEvaluation& e) {
  if (!e.vllm.accepted) return "";
  std::ostringstream out;
  out << "vllm serve " << (plan.hf_repo.empty() ? plan.model_name : plan.hf_repo) << " --tensor-parallel-size "
      << e.layout.tp << " --pipeline-parallel-size " << e.layout.pp << " --data-parallel-size " << e.layout.dp
      << " --max-model-len " << e.max_model_len << " --max-num-seqs " << plan.options.budget.max_num_seqs
      << " --gpu-memory-utilization " << plan.options.budget.gpu_memory_utilization;
  if (plan.options.budget.kv_cache_dtype == KvCacheDType::kFp8) out << " --kv-cache-dtype fp8";
  if (plan.options.budget.max_num_batched_tokens != 8192)
    out << " --max-num-batched-tokens " << plan.options.budget.max_num_batched_tokens;
  if (e.layout.expert_parallel) out << " --enable-expert-parallel";
  return out.str();
}

nlohmann::json layout_json(const Plan& plan, const LayoutEvaluation& e, bool with_budgets) {
  nlohmann::json j = {
      {"tp", e.layout.tp},
      {"pp", e.layout.pp},
      {"dp", e.layout.dp},
      {"pp_layer_partition", e.layout.pp_layer_partition},
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
        {"kv_bytes_per_token", model_kv_bytes_per_token(s, b.kv_cache_dtype)}}},
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
  if (s.is_moe()) {
    const int tp = plan.recommended >= 0 ? plan.layouts[plan.recommended].layout.tp
                                         : static_cast<int>(std::min<int64_t>(plan.devices.n_devices(), s.n_heads));
    j["moe"] = moe_json(s, b.kv_cache_dtype, tp, b.max_num_seqs);
  }
  return j;
}

}  // namespace shardlm
