#include "plan/explain.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "core/error.h"
#include "core/units.h"
#include "plan/moe_accounting.h"
#include "plan/tensor_split.h"

namespace shardlm {

namespace {

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string gib(double bytes) { return format_gib(bytes); }

std::string join(const std::vector<int64_t>& v, const char* sep = ", ") {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + std::to_string(v[i]);
  return out;
}

std::string dtype_short(DType d) {
  switch (d) {
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    case DType::kF32: return "f32";
    case DType::kF8E4M3: return "fp8";
    case DType::kI32: return "i32";
    case DType::kI8: return "i8";
    case DType::kU8: return "u8";
  }
  return "?";
}

double inter_latency(const Plan& plan) {
  return plan.options.inter_node_latency >= 0 ? plan.options.inter_node_latency
                                              : default_inter_node_latency(plan.devices.inter_node_bandwidth);
}

std::string join_d(const std::vector<double>& v, int decimals, const char* sep = "/") {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + fixed(v[i], decimals);
  return out;
}

// "TP=2 split 0.771,0.229: fits, 20.1 tokens/s one stream, 9,000 KV tokens; the even split does not fit (...)".
void explain_split(const Plan& plan, const LayoutEvaluation& e, std::vector<std::string>& out) {
  if (!e.even.evaluated) return;
  const bool latency = plan.options.objective == Objective::kLatency;
  std::ostringstream p;
  const bool split = !e.layout.tensor_split.empty();
  p << "On " << e.layout.to_string();
  if (split) p << ", plan weighs each TP rank by its device's memory and bandwidth (memory^a × bandwidth^(1−a), the best a for "
               << objective_name(plan.options.objective) << ")";
  if (e.partition_by_time) p << (split ? " and" : ",") << " balances the layers by modelled time (" << join(e.layout.pp_layer_partition, "/") << ")";
  p << ": " << (e.fits ? "fits" : "does not fit") << ", " << fixed(e.single_stream_tok_s, 1) << " tokens/s one stream, "
    << fixed(e.aggregate_tok_s, 0) << " aggregate, " << with_commas(e.kv_tokens) << " KV tokens per replica. The even split"
    << (e.layout.pp > 1 ? str_cat(" with the layers by bytes (", join(e.even.pp_layer_partition, "/"), ")") : std::string())
    << ": ";
  if (e.even.fits)
    p << "fits, " << fixed(e.even.single_stream_tok_s, 1) << " tokens/s one stream, " << fixed(e.even.aggregate_tok_s, 0)
      << " aggregate, " << with_commas(e.even.kv_tokens) << " KV tokens";
  else
    p << "does not fit (the tightest rank is " << gib(static_cast<double>(-e.even.headroom_bytes)) << " short)";
  const double a = objective_score(e, plan.options.objective);
  const double b = latency ? e.even.single_stream_tok_s : e.even.aggregate_tok_s;
  if (e.even.fits && b > 0) p << " — " << fixed(a / b, 2) << "× the " << (latency ? "one-stream" : "aggregate") << " speed";
  p << ".";
  if (split) {
    const int n_stages = e.layout.tensor_split.size() > static_cast<size_t>(e.layout.tp) ? e.layout.pp : 1;
    for (int st = 0; st < n_stages; ++st) {
      const RealisedSplit r = realised_split(plan.spec, e.layout, st);
      p << (n_stages > 1 ? str_cat(" Stage ", st, ": requested ") : std::string(" Requested ")) << join_d(r.requested, 3)
        << ", realised Q heads " << join_d(r.q_heads, 3) << ", MLP columns " << join_d(r.mlp, 3);
      if (!r.experts.empty()) p << ", experts " << join_d(r.experts, 3);
      p << ", vocabulary " << join_d(r.vocab, 3) << " (whole units: GQA groups or heads, aligned column blocks).";
    }
  }
  out.push_back(p.str());
}

// Both balances of the layers: bytes (the engine's default) against modelled time.
void explain_balances(const Plan& plan, const LayoutEvaluation& e, std::vector<std::string>& out) {
  if (e.layout.pp < 2) return;
  std::ostringstream p;
  p << "Layers per stage: by bytes (the engine's default) [" << join(e.bytes_partition) << "], by modelled decode time on "
    << "each stage's devices within their memory [" << join(e.layout.pp_layer_partition) << "]"
    << (e.partition_by_time ? " — plan uses the time balance" : " — the byte balance is as fast, so plan keeps it")
    << "; stage times per token (one stream, embedding row and lm_head included): " << join_d([&] {
         std::vector<double> ms;
         for (double x : e.stage_seconds) ms.push_back(x * 1e3);
         return ms;
       }(), 2, " / ")
    << " ms.";
  out.push_back(p.str());
}

const LayoutEvaluation* find_layout(const Plan& plan, int tp, int pp, int dp) {
  for (const auto& e : plan.layouts)
    if (e.layout.tp == tp && e.layout.pp == pp && e.layout.dp == dp) return &e;
  return nullptr;
}

void explain_vllm(const Plan& plan, const LayoutEvaluation& e, std::vector<std::string>& out) {
  const ModelSpec& s = plan.spec;
  const int tp = e.layout.tp;
  std::ostringstream p;
  if (!e.vllm.accepted) {
    p << "vLLM refuses TP=" << tp << ": \"" << e.vllm.reason << "\" (" << e.vllm.where << "; " << e.vllm.rule << "). ";
  }
  std::vector<int64_t> q, kv;
  for (int r = 0; r < tp; ++r) {
    const RankShard sh = shard_for(s, Layout{tp, 1, 1, {}}, r, 0);
    q.push_back(sh.q_heads.size());
    kv.push_back(sh.kv_heads.size());
  }
  const KvReplicationCost cost = kv_replication_cost(s, tp, plan.options.budget.kv_cache_dtype);
  if (e.vllm.accepted && cost.extra_kv_heads == 0) return;
  p << "shardlm at TP=" << tp << " splits the " << s.n_heads << " Q heads " << join(q, ",")
    << " (contiguous ranges differing by at most one) and gives each rank the KV heads its Q heads use (groups of "
    << s.group_size() << " Q heads per KV head): KV heads per rank " << join(kv, ",") << ".";
  if (cost.extra_kv_heads > 0) {
    const int64_t base_kv = model_kv_bytes_per_token(s, plan.options.budget.kv_cache_dtype);
    if (e.vllm.accepted && tp > s.n_kv_heads)
      p << " vLLM replicates the same way here (TP " << tp << " = " << tp / s.n_kv_heads << " × " << s.n_kv_heads
        << " KV heads).";
    p << " That stores " << s.n_kv_heads + cost.extra_kv_heads << " KV-head copies instead of " << s.n_kv_heads
      << ": the " << cost.extra_kv_heads << " extra cost " << with_commas(cost.weight_bytes) << " bytes ("
      << gib(static_cast<double>(cost.weight_bytes)) << ") of k/v projection weights per replica and "
      << with_commas(cost.kv_bytes_per_token) << " bytes of KV cache per token ("
      << fixed(100.0 * static_cast<double>(cost.kv_bytes_per_token) / static_cast<double>(base_kv), 0)
      << "% on top of the model's " << with_commas(base_kv) << ").";
  }
  out.push_back(p.str());
}

void explain_pp(const Plan& plan, const LayoutEvaluation& e, std::vector<std::string>& out) {
  const ModelSpec& s = plan.spec;
  const int pp = e.layout.pp;
  std::ostringstream p;
  p << "PP=" << pp << " over " << s.n_layers << " layers: ";
  if (s.n_layers % pp == 0) {
    p << s.n_layers << " = " << pp << " × " << s.n_layers / pp << ", so vLLM's split is even ("
      << join(e.vllm_partition) << ")";
  } else {
    p << s.n_layers << " % " << pp << " = " << s.n_layers % pp << ", so the stages cannot be equal: vLLM gives ["
      << join(e.vllm_partition) << "] (" << s.n_layers / pp << " each, the remainder to the stages before the last;"
      << " override with VLLM_PP_LAYER_PARTITION)";
  }
  const int64_t d = static_cast<int64_t>(dtype_size(s.dtype));
  const int64_t embed = s.vocab_size * s.hidden_size * d;
  p << "; shardlm balances bytes and gives [" << join(e.layout.pp_layer_partition) << "]: stage 0 also holds the "
    << gib(static_cast<double>(embed)) << " embedding and the last stage the "
    << (s.tie_word_embeddings ? "tied embedding as lm_head" : gib(static_cast<double>(embed)) + " lm_head")
    << ", each about "
    << fixed(static_cast<double>(embed) /
                 static_cast<double>(plan.checkpoint_bytes - embed * (s.tie_word_embeddings ? 1 : 2)) *
                 static_cast<double>(s.n_layers),
             1)
    << " layers' worth.";
  out.push_back(p.str());
}

void explain_no_fit(const Plan& plan, std::vector<std::string>& out) {
  const ModelSpec& s = plan.spec;
  const MemoryBudgetOptions& o = plan.options.budget;
  const int n = plan.devices.n_devices();
  double total_budget = 0;
  for (const auto& dev : plan.devices.devices) total_budget += std::floor(static_cast<double>(dev.memory_bytes) * o.gpu_memory_utilization);
  const double reserves = static_cast<double>(o.reserve_bytes) * n;
  std::ostringstream p;
  p << "Nothing fits. " << plan.model_name << " " << dtype_short(s.dtype) << " weights are "
    << with_commas(plan.checkpoint_bytes) << " bytes (" << format_gb(static_cast<double>(plan.checkpoint_bytes), 1)
    << " = " << gib(static_cast<double>(plan.checkpoint_bytes)) << ") against " << plan.devices.describe() << " × "
    << o.gpu_memory_utilization << " utilization = " << gib(total_budget) << ", minus " << n << " × "
    << gib(static_cast<double>(o.reserve_bytes)) << " runtime reserve = " << gib(total_budget - reserves) << ".";
  if (static_cast<double>(plan.checkpoint_bytes) > total_budget - reserves) {
    p << " The weights alone exceed that by " << gib(static_cast<double>(plan.checkpoint_bytes) - (total_budget - reserves))
      << ", before any workspace or KV cache.";
  }
  // The closest layout.
  const LayoutEvaluation* best = nullptr;
  for (const auto& e : plan.layouts)
    if (!best || e.headroom_bytes > best->headroom_bytes) best = &e;
  if (best) {
    const MemoryBudget& b = best->budgets[best->tightest_replica][best->tightest_rank];
    const int device = best->tightest_replica * best->layout.ranks_per_replica() + best->tightest_rank;
    p << " Closest layout " << best->layout.to_string() << ": rank " << device << " (" << plan.devices.devices[device].name
      << ") needs " << gib(static_cast<double>(b.weight_bytes)) << " weights + "
      << gib(static_cast<double>(b.workspace_bytes)) << " workspace + " << gib(static_cast<double>(b.reserve_bytes))
      << " reserve + " << gib(static_cast<double>(best->required_tokens * b.kv_bytes_per_token + b.local_kv_cache_bytes))
      << " KV for "
      << with_commas(best->required_tokens) << " tokens"
      << (b.has_draft() ? " + " + gib(static_cast<double>(b.draft_weight_bytes + b.draft_workspace_bytes +
                                                           (best->required_tokens + b.block_size) * b.draft_kv_bytes_per_token)) +
                              " for the draft model (weights, workspace, KV)"
                        : std::string())
      << ", of its " << gib(static_cast<double>(b.budget_bytes))
      << " budget: short by " << gib(static_cast<double>(-best->headroom_bytes)) << ".";
  }
  if (plan.devices_needed > 0)
    p << " " << plan.devices_needed << " × " << plan.devices.devices[0].name << " would fit.";
  if (o.kv_cache_dtype != KvCacheDType::kFp8)
    p << " --kv-cache-dtype fp8 halves the KV cache; a smaller --max-model-len needs less of it.";
  out.push_back(p.str());
}

// The MoE lines: all weights vs what a token reads, each rank's experts under
// EP and TP at the degree of the recommended layout, how tokens reach experts.
void render_moe(const Plan& plan, std::ostringstream& out) {
  const ModelSpec& s = plan.spec;
  const MoeAccounting m = moe_accounting(s, plan.options.budget.kv_cache_dtype);
  out << "Experts: " << s.n_experts << " per MoE layer × " << m.n_moe_layers << " MoE layers (of " << s.n_layers << "), "
      << s.n_experts_per_token << " routed per token"
      << (s.norm_topk_prob ? ", weights renormalised over the chosen" : ", weights not renormalised") << "; one expert "
      << with_commas(m.bytes_per_expert) << " bytes\n";
  out << "  all weights " << with_commas(m.total_weight_bytes) << " bytes (" << fixed(m.total_params / 1e9, 2)
      << " B params; experts " << with_commas(m.expert_bytes) << " bytes) must be held; one token reads "
      << with_commas(m.active_bytes_per_token) << " bytes (" << fixed(m.active_params / 1e9, 2)
      << " B active params): decode speed follows the active ones\n";
  int tp = plan.recommended >= 0 ? plan.layouts[plan.recommended].layout.tp
                                 : static_cast<int>(std::min<int64_t>(plan.devices.n_devices(), s.n_heads));
  if (tp < 2) tp = static_cast<int>(std::min<int64_t>(plan.devices.n_devices(), s.n_heads));
  if (tp >= 2) {
    const ExpertShare ep = expert_share(s, tp, true);
    const ExpertShare tps = expert_share(s, tp, false);
    const auto [ep_min, ep_max] = std::minmax_element(ep.bytes_per_rank.begin(), ep.bytes_per_rank.end());
    const auto [tp_min, tp_max] = std::minmax_element(tps.bytes_per_rank.begin(), tps.bytes_per_rank.end());
    out << "  expert bytes per rank over " << tp << " ranks: EP (--enable-expert-parallel) " << ep.counts()
        << " experts = " << with_commas(*ep_max) << (*ep_max != *ep_min ? " / " + with_commas(*ep_min) : std::string())
        << " bytes";
    if (ep.imbalance_percent() > 0) out << " (" << fixed(ep.imbalance_percent(), 1) << "% more expert work on rank 0)";
    out << "; TP (each expert's " << s.moe_intermediate_size << " columns split) " << with_commas(*tp_max)
        << (*tp_max != *tp_min ? " / " + with_commas(*tp_min) : std::string()) << " bytes\n";
  }
  if (tp >= 2) {
    // At a decode step of max-num-seqs tokens and a full prefill step.
    const int64_t a = static_cast<int64_t>(dtype_size(s.dtype));
    const MemoryBudgetOptions& bo = plan.options.budget;
    const MoeCommCost decode = moe_comm_cost(s, tp, bo.max_num_seqs, a);
    const MoeCommCost prefill = moe_comm_cost(s, tp, bo.max_num_batched_tokens, a);
    out << "  tokens to experts over " << tp << " ranks: attention is tensor-parallel, so every rank holds every token; "
        << "shardlm has each rank run its experts (EP) or expert slices (TP) for all tokens and the all-reduce after the "
        << "MLP combines them: per rank per layer, attention + MoE all-reduces move "
        << with_commas(decode.all_reduce_bytes) << " bytes at a decode step of " << bo.max_num_seqs << " tokens ("
        << with_commas(prefill.all_reduce_bytes) << " at " << bo.max_num_batched_tokens
        << "); all_to_all dispatch + combine (with the reduce-scatter and all-gather attention then needs) would move "
        << with_commas(decode.all_to_all_bytes) << " (" << with_commas(prefill.all_to_all_bytes) << "): "
        << (decode.all_reduce_cheaper()
                ? str_cat("the all-reduce moves no more, since k = ", s.n_experts_per_token, " ≥ t = ", tp,
                          " (all_to_all sends each token k(t−1)/t times each way)")
                : str_cat("all_to_all would be cheaper by ",
                          with_commas(decode.all_to_all_bytes > 0 ? decode.all_reduce_bytes - decode.all_to_all_bytes : 0),
                          " bytes (k = ", s.n_experts_per_token, " < t = ", tp,
                          "), but shardlm implements only the all-reduce path"))
        << "\n";
  }
}

// --speculative-config: what it adds to the recommended layout's budgets.
// A draft model: its own lines on each replica's rank 0 (the bytes serve's
// startup log shows measured beside them). Both methods: the verification
// rows in the last stage's logits buffers.
void render_speculation(const Plan& plan, const LayoutEvaluation& rec, std::ostringstream& out) {
  const PlanOptions& o = plan.options;
  if (o.num_speculative_tokens <= 0) return;
  const int64_t rows = o.budget.logit_rows_per_seq;
  if (!o.draft_model.empty()) {
    const int per = rec.layout.ranks_per_replica();
    for (size_t d = 0; d < rec.budgets.size(); ++d) {
      const MemoryBudget& b = rec.budgets[d].front();  // rank 0 of the replica: its driver
      const int dev = static_cast<int>(d) * per;
      out << "  draft model " << o.draft_model << " (TP 1, PP 1) beside replica " << d << "'s driver, device " << dev
          << " (" << plan.devices.devices[static_cast<size_t>(dev)].name << "): weights "
          << with_commas(b.draft_weight_bytes) << " B, workspace " << with_commas(b.draft_workspace_bytes)
          << " B, KV cache " << with_commas(b.draft_kv_cache_bytes) << " B (" << with_commas(b.n_draft_kv_blocks)
          << " blocks of " << b.block_size << " tokens: the replica's " << with_commas(b.n_kv_blocks) << " and a spare; "
          << with_commas(b.draft_kv_bytes_per_token) << " B/token); in that rank's budget above and its fit\n";
    }
  } else {
    out << "  speculative decoding (ngram, " << o.num_speculative_tokens
        << " tokens): no weights or KV cache of its own\n";
  }
  out << "  verification steps ask " << rows << " logits rows per sequence (" << rows << " × "
      << o.budget.max_num_seqs << " sequences): counted in the last stage's workspace\n";
}

// "Verdict: ..." with the exact bytes of the tightest rank.
void render_verdict(const Plan& plan, std::ostringstream& out) {
  const LayoutEvaluation* e = plan.recommended >= 0 ? &plan.layouts[plan.recommended] : nullptr;
  if (!e)
    for (const auto& l : plan.layouts)
      if (!e || l.headroom_bytes > e->headroom_bytes) e = &l;
  if (!e) return;
  const MemoryBudget& b = e->budgets[e->tightest_replica][e->tightest_rank];
  out << "Verdict: " << (e->fits ? "fits" : "does not fit") << " on " << plan.devices.describe() << " as "
      << e->layout.to_string() << (e->fits ? "" : " (the closest layout)") << ": tightest rank " << e->tightest_rank
      << " has " << with_commas(b.budget_bytes) << " bytes (" << with_commas(b.memory_bytes) << " × "
      << b.gpu_memory_utilization << ") for " << with_commas(b.weight_bytes) << " weight + " << with_commas(b.workspace_bytes)
      << " workspace + " << with_commas(b.reserve_bytes) << " reserve bytes, leaving " << with_commas(b.usable_bytes)
      << " bytes for KV";
  if (b.n_local_kv_blocks > 0)
    out << ": " << with_commas(b.local_kv_cache_bytes) << " for the local layers' pool, the rest";
  out << " at " << with_commas(b.kv_bytes_per_token) << " bytes per token";
  if (e->fits)
    out << " = " << with_commas(e->kv_tokens) << " tokens per replica\n";
  else
    out << "; " << with_commas(-e->headroom_bytes) << " bytes short of the KV of " << with_commas(e->required_tokens)
        << " tokens\n";
}

}  // namespace

KvReplicationCost kv_replication_cost(const ModelSpec& spec, int tp, KvCacheDType kv) {
  KvReplicationCost c;
  int64_t copies = 0;
  for (int r = 0; r < tp; ++r) copies += shard_for(spec, Layout{tp, 1, 1, {}}, r, 0).kv_heads.size();
  c.extra_kv_heads = copies - spec.n_kv_heads;
  const int64_t d = static_cast<int64_t>(dtype_size(spec.dtype));
  // k_proj and v_proj: head_dim rows of hidden_size each (+ head_dim bias entries on Qwen2).
  const int64_t per_head_layer = 2 * spec.head_dim * (spec.hidden_size + (spec.qkv_bias ? 1 : 0)) * d;
  c.weight_bytes = c.extra_kv_heads * per_head_layer * spec.n_layers;
  c.kv_bytes_per_token = c.extra_kv_heads * 2 * spec.head_dim * static_cast<int64_t>(kv_dtype_size(kv, spec.dtype)) *
                         spec.n_layers;
  return c;
}

std::vector<std::string> explain_plan(const Plan& plan) {
  std::vector<std::string> out;
  const ModelSpec& s = plan.spec;
  const MemoryBudgetOptions& o = plan.options.budget;
  const int n = plan.devices.n_devices();

  bool mixed = false;
  for (const auto& d : plan.devices.devices) mixed |= d.memory_bytes != plan.devices.devices[0].memory_bytes;
  if (mixed)
    out.push_back(
        "Mixed devices: rank r runs on device r in --gpus order (TP fastest, then PP, then DP), and every rank of a "
        "replica must hold the KV of the same tokens, so a replica holds what its tightest rank — usually the one on "
        "the smallest device — holds.");
  for (const auto& d : plan.devices.devices)
    if (d.assumed) {
      out.push_back("Device \"" + d.name + "\" is known only by its memory: speeds assume 1,000 GB/s memory bandwidth "
                    "and a PCIe Gen4 link (32 GB/s); give a catalog name (" + device_catalog_names() +
                    ") for spec-sheet numbers.");
      break;
    }

  if (plan.recommended < 0) {
    explain_no_fit(plan, out);
    return out;
  }
  const LayoutEvaluation& rec = plan.layouts[plan.recommended];

  if (plan.options.max_model_len == 0) {
    std::ostringstream p;
    p << "--max-model-len not given: chose " << with_commas(rec.max_model_len) << " tokens, ";
    if (rec.max_model_len >= s.max_position_embeddings)
      p << "the model's max_position_embeddings; the KV cache holds " << with_commas(rec.kv_tokens)
        << " tokens, room for " << rec.max_concurrency << " sequences of full length at once.";
    else
      p << "the most the tightest rank's KV cache holds (the model allows " << with_commas(s.max_position_embeddings)
        << "); that leaves room for one such sequence at a time — pass a smaller --max-model-len for more concurrency.";
    out.push_back(p.str());
  }

  // vLLM's verdict on the recommended TP degree, and on using every device for TP.
  if (!rec.vllm.accepted || kv_replication_cost(s, rec.layout.tp, o.kv_cache_dtype).extra_kv_heads > 0)
    explain_vllm(plan, rec, out);
  if (n != rec.layout.tp && n <= s.n_heads) {
    const LayoutEvaluation* all_tp = find_layout(plan, n, 1, 1);
    if (all_tp && !all_tp->vllm.accepted) explain_vllm(plan, *all_tp, out);
  }
  if (!rec.vllm.accepted) {
    std::ostringstream p;
    if (plan.best_vllm >= 0) {
      const LayoutEvaluation& v = plan.layouts[plan.best_vllm];
      const double a = objective_score(rec, plan.options.objective), b = objective_score(v, plan.options.objective);
      p << "The best layout vLLM accepts is " << v.layout.to_string() << ": "
        << fixed(b, 0) << " vs " << fixed(a, 0) << " tokens/s ("
        << (plan.options.objective == Objective::kLatency ? "one stream" : "aggregate") << ", "
        << fixed(100.0 * (a - b) / std::max(b, 1e-9), 0) << "% slower)";
      if (v.idle_devices > 0) p << ", leaving " << v.idle_devices << " device(s) idle";
      p << ".";
    } else {
      p << "No layout vLLM accepts fits these devices.";
    }
    out.push_back(p.str());
  }

  explain_split(plan, rec, out);
  explain_balances(plan, rec, out);
  if (rec.layout.pp > 1) explain_pp(plan, rec, out);
  else if (n <= s.n_layers && n > 1) {
    const LayoutEvaluation* all_pp = find_layout(plan, 1, n, 1);
    if (all_pp) explain_pp(plan, *all_pp, out);
  }

  if (!rec.imbalance.empty()) {
    std::ostringstream p;
    p << "Uneven shards on " << rec.layout.to_string() << ": ";
    bool first = true;
    for (const auto& im : rec.imbalance) {
      if (im.what == "weight bytes") continue;
      const bool per_stage = im.what == "layers";
      p << (first ? "" : "; ") << (per_stage ? "stage " : "rank ") << im.max_rank << " holds " << with_commas(im.max)
        << " " << im.what << ", " << (per_stage ? "stage " : "rank ") << im.min_rank << " holds " << with_commas(im.min)
        << ": " << fixed(im.percent(), 1) << "% more "
        << (im.what == "Q heads" ? "attention work" : im.what == "KV heads" ? "KV reads" : im.what == "MLP columns" ? "MLP work" : "layer work")
        << " on " << (per_stage ? "stage " : "rank ") << im.max_rank;
      first = false;
    }
    p << ". The slowest rank sets the pace; balance costs speed, not correctness.";
    if (!first) out.push_back(p.str());
  }

  if (rec.layout.tp > 1 || rec.layout.pp > 1) {
    std::ostringstream p;
    const double a = static_cast<double>(dtype_size(s.dtype));
    if (rec.layout.tp > 1) {
      const int64_t n_ar = 2 * s.n_layers;
      p << "Communication per token (one stream): " << n_ar << " all-reduces (2 per layer) of "
        << with_commas(static_cast<int64_t>(s.hidden_size * a)) << " bytes and a logits gather take "
        << fixed(rec.tp_comm_seconds * 1e3, 3) << " ms of the " << fixed(rec.step_seconds_single * 1e3, 3)
        << " ms step (ring 2(t−1)/t × bytes ÷ link + latency"
        << (rec.tp_spans_nodes ? "" : str_cat(" ", fixed(kIntraNodeLatency * 1e6, 0), " µs"))
        << " each: small messages are latency-bound).";
    }
    if (rec.layout.pp > 1)
      p << (rec.layout.tp > 1 ? " " : "Communication per token: ") << rec.layout.pp - 1
        << " stage-boundary send(s) take " << fixed(rec.pp_comm_seconds * 1e3, 3) << " ms.";
    if (rec.tp_spans_nodes) {
      p << " The TP group spans hosts: its all-reduces cross the " << fixed(plan.devices.inter_node_bandwidth / kGB, 1)
        << " GB/s inter-node link, " << fixed(kIntraNodeLatency * 1e6, 0) << " µs + 2⌈log2 hosts⌉ × "
        << fixed(inter_latency(plan) * 1e6, 0) << " µs each";
      const LayoutEvaluation* local = nullptr;
      for (const auto& e : plan.layouts)
        if (e.fits && !e.tp_spans_nodes &&
            (!local || objective_score(e, plan.options.objective) > objective_score(*local, plan.options.objective)))
          local = &e;
      if (local)
        p << "; the best layout keeping TP inside a host, " << local->layout.to_string() << ", estimates "
          << fixed(objective_score(*local, plan.options.objective), 1) << " vs "
          << fixed(objective_score(rec, plan.options.objective), 1)
          << " tokens/s — prefer it if the real inter-host latency is worse than assumed";
      p << ".";
    }
    out.push_back(p.str());
  }
  if (plan.devices.n_nodes > 1 && !rec.tp_spans_nodes && rec.layout.tp > 1) {
    // Why not TP across the hosts: the best layout whose TP group spans them.
    const LayoutEvaluation* wide = nullptr;
    for (const auto& e : plan.layouts)
      if (e.fits && e.tp_spans_nodes &&
          (!wide || objective_score(e, plan.options.objective) > objective_score(*wide, plan.options.objective)))
        wide = &e;
    if (wide) {
      std::ostringstream p;
      const int n_ar = 2 * static_cast<int>(plan.spec.n_layers);
      p << "TP inside a host, PP across hosts: " << wide->layout.to_string() << " would run its " << n_ar
        << " all-reduces per token across the " << fixed(plan.devices.inter_node_bandwidth / kGB, 2) << " GB/s link at "
        << fixed(all_reduce_latency(2, inter_latency(plan)) * 1e6, 0) << " µs each ("
        << fixed(inter_latency(plan) * 1e6, 0) << " µs per inter-host hop"
        << (plan.options.inter_node_latency >= 0 ? ", --inter-node-latency-us"
                                                  : plan.devices.inter_node_bandwidth < 100e9 / 8
                                                        ? ", the default for TCP Ethernet; set --inter-node-latency-us"
                                                        : ", the default for InfiniBand/RoCE; set --inter-node-latency-us")
        << "), " << fixed(wide->tp_comm_seconds * 1e3, 2) << " ms of communication per token: "
        << fixed(objective_score(*wide, plan.options.objective), 1) << " vs "
        << fixed(objective_score(rec, plan.options.objective), 1) << " tokens/s for " << rec.layout.to_string()
        << ", whose only inter-host traffic is " << rec.layout.pp - 1 << " activation send(s) per token.";
      out.push_back(p.str());
    }
  }
  if (rec.idle_devices > 0) {
    std::ostringstream p;
    p << rec.idle_devices << " of " << n << " devices stay idle on " << rec.layout.to_string() << ".";
    const LayoutEvaluation* full = nullptr;
    for (const auto& e : plan.layouts)
      if (e.fits && e.idle_devices == 0 && (!full || objective_score(e, plan.options.objective) >
                                                         objective_score(*full, plan.options.objective)))
        full = &e;
    const bool latency = plan.options.objective == Objective::kLatency;
    if (full) {
      p << " The best layout using all " << n << " is " << full->layout.to_string() << " at "
        << fixed(objective_score(*full, plan.options.objective), 1) << " vs "
        << fixed(objective_score(rec, plan.options.objective), 1) << " tokens/s ("
        << (latency ? "one stream" : "aggregate") << ")";
      if (full->tp_spans_nodes) p << "; its TP group crosses hosts";
      p << (latency ? "; for one stream extra replicas add nothing — use --objective throughput to fill them." : ".");
    } else {
      p << " No layout using all " << n << " devices fits.";
    }
    out.push_back(p.str());
  }
  return out;
}

// KV per layer type (issue #22): global layers per token of context, local
// (sliding-window) layers at most the window and one step's chunk per
// sequence, and what shardlm's paged cache holds of each.
static void render_sliding_window(const Plan& plan, std::ostringstream& out) {
  const ModelSpec& s = plan.spec;
  const MemoryBudgetOptions& o = plan.options.budget;
  const KvLayerTypes t = kv_layer_types(s, o.kv_cache_dtype);
  const int64_t ctx = plan.recommended >= 0 ? plan.layouts[size_t(plan.recommended)].max_model_len
                      : plan.options.max_model_len > 0 ? plan.options.max_model_len
                                                       : s.max_position_embeddings;
  // Tokens a local layer is read over at most in one step: the window before its first query and the chunk.
  const int64_t local_tokens = std::min(ctx, t.window - 1 + o.max_num_batched_tokens);
  out << "Sliding window: " << t.n_local_layers << " of " << s.n_layers << " layers attend to the last "
      << with_commas(t.window) << " positions. KV per layer type: ";
  if (t.n_global_layers > 0)
    out << t.n_global_layers << " global layers " << with_commas(t.global_bytes_per_token) << " bytes per token of context; ";
  out << t.n_local_layers
      << " local layers " << with_commas(t.local_bytes_per_token) << " bytes per token, over at most "
      << with_commas(local_tokens) << " tokens per sequence (window - 1 + " << with_commas(o.max_num_batched_tokens)
      << " batched tokens). A sequence of " << with_commas(ctx) << " tokens needs "
      << with_commas(t.global_bytes_per_token * ctx + t.local_bytes_per_token * local_tokens) << " bytes";
  if (cache_sliding_window(s) > 0) {
    out << "; the cache releases the blocks that leave the window, so it holds at most "
        << with_commas(kv_tokens_per_sequence(s, ctx, o.block_size, o.max_num_batched_tokens))
        << " tokens of it in blocks of " << o.block_size << " (counted in the KV figures below)\n";
  } else {  // some layers slide, some do not (local_pool_window > 0)
    const int64_t n = local_pool_blocks(s, o);
    out << "; the local layers keep their KV in a pool of their own whose blocks leave the window: at most "
        << with_commas(n) << " blocks of " << o.block_size << " per rank (" << o.max_num_seqs << " sequences × (ceil(("
        << t.window << " - 1) / " << o.block_size << ") + 2) + ceil(" << with_commas(o.max_num_batched_tokens) << " / "
        << o.block_size << ")), " << with_commas(n * o.block_size * t.local_bytes_per_token)
        << " bytes on one device, and never more blocks than the global layers' pool, which gets the rest (the KV "
           "figures below count both)\n";
  }
}

std::string render_plan_text(const Plan& plan) {
  const ModelSpec& s = plan.spec;
  const MemoryBudgetOptions& o = plan.options.budget;
  std::ostringstream out;
  const int64_t kvpt = model_kv_bytes_per_token(s, o.kv_cache_dtype);
  out << "Model: " << plan.model_name;
  if (!plan.hf_repo.empty() && plan.hf_repo != plan.model_name) out << " (" << plan.hf_repo << ")";
  out << " — " << s.architecture << ", " << s.n_layers << " layers, " << s.n_heads << " Q / " << s.n_kv_heads
      << " KV heads × " << s.head_dim << ", hidden " << s.hidden_size << ", MLP "
      << (s.is_moe() ? str_cat(s.n_experts, " experts × ", s.moe_intermediate_size, " (", s.n_experts_per_token, " active)")
                     : std::to_string(s.intermediate_size))
      << ", vocab " << s.vocab_size << ", max_position_embeddings " << with_commas(s.max_position_embeddings) << "\n";
  out << "Weights: " << with_commas(plan.checkpoint_bytes) << " bytes = "
      << format_gb(static_cast<double>(plan.checkpoint_bytes)) << " = " << gib(static_cast<double>(plan.checkpoint_bytes))
      << " (" << (s.quant.enabled() ? s.quant.describe() + ", the rest " + dtype_short(s.dtype) : dtype_short(s.dtype))
      << ", exact tensor shapes)\n";
  out << "KV cache: " << with_commas(kvpt) << " bytes per token = 2 × " << s.n_kv_heads << " KV heads × " << s.head_dim
      << " × " << kv_dtype_size(o.kv_cache_dtype, s.dtype) << " bytes × " << s.n_layers << " layers (kv-cache-dtype "
      << kv_dtype_name(o.kv_cache_dtype) << ")\n";
  if (!s.sliding_layers.empty()) render_sliding_window(plan, out);
  if (s.is_moe()) render_moe(plan, out);
  out << "Devices: " << plan.devices.describe();
  {
    std::vector<std::string> seen;
    for (const DeviceSpec& d : plan.devices.devices) {
      if (std::find(seen.begin(), seen.end(), d.name) != seen.end()) continue;
      out << (seen.empty() ? " (" : "; ") << d.name << ": " << with_commas(d.memory_bytes / (1024 * 1024))
          << " MiB = " << gib(static_cast<double>(d.memory_bytes)) << ", " << fixed(d.memory_bandwidth / kGB, 0)
          << " GB/s, " << d.link_name;
      seen.push_back(d.name);
    }
    out << ")";
  }
  if (plan.devices.n_nodes > 1)
    out << "; " << plan.devices.devices_per_node() << " per host, hosts linked at "
        << fixed(plan.devices.inter_node_bandwidth / kGB, 1) << " GB/s";
  out << "\n";
  out << "Budget per device: memory × " << o.gpu_memory_utilization << " − weights − workspace (max-num-batched-tokens "
      << o.max_num_batched_tokens << ", max-num-seqs " << o.max_num_seqs << ") − " << gib(static_cast<double>(o.reserve_bytes))
      << " runtime reserve; KV cache in " << o.block_size << "-token blocks. GiB = 2^30 bytes, GB = 10^9 bytes.\n\n";

  const int64_t required = plan.layouts.empty() ? 0 : plan.layouts.front().required_tokens;
  out << "Layouts (TP×PP×DP ≤ " << plan.devices.n_devices() << " devices; headroom = tightest rank after the KV of "
      << with_commas(required) << " tokens" << (plan.options.max_model_len ? "" : ", the minimum without --max-model-len")
      << "; objective " << objective_name(plan.options.objective) << "):\n";
  char line[256];
  std::snprintf(line, sizeof line, "  %3s %3s %3s %5s %11s %14s %9s %5s %12s %12s %5s  %s\n", "TP", "PP", "DP", "fits",
                "headroom", "KV tok/replica", "max len", "conc", "1-stream t/s", "total t/s", "idle", "vLLM");
  out << line;
  for (int i = 0; i < static_cast<int>(plan.layouts.size()); ++i) {
    const LayoutEvaluation& e = plan.layouts[i];
    std::snprintf(line, sizeof line, "%s %3d %3d %3d %5s %7.2f GiB %14s %9s %5s %12s %12s %5d  %s\n",
                  i == plan.recommended ? "*" : " ", e.layout.tp, e.layout.pp, e.layout.dp, e.fits ? "yes" : "no",
                  static_cast<double>(e.headroom_bytes) / kGiB, with_commas(e.kv_tokens).c_str(),
                  e.fits ? with_commas(e.max_model_len).c_str() : "-",
                  e.fits ? std::to_string(e.max_concurrency).c_str() : "-",
                  fixed(e.single_stream_tok_s, 1).c_str(), e.fits ? fixed(e.aggregate_tok_s, 0).c_str() : "-",
                  e.idle_devices, e.vllm.accepted ? "ok" : e.vllm.rule.c_str());
    std::string row = line;
    if (!e.layout.tensor_split.empty() || e.partition_by_time) {
      // The row's layout is plan's own choice (mixed devices, layers by time): say which.
      std::string what;
      if (!e.layout.tensor_split.empty()) what = "tensor split " + format_tensor_split(e.layout.tensor_split);
      if (e.partition_by_time) what += (what.empty() ? "" : ", ") + std::string("layers ") + join(e.layout.pp_layer_partition, "/");
      row.pop_back();
      row += "  (" + what + ")\n";
    }
    out << row;
  }
  out << "\n";

  if (plan.recommended >= 0) {
    const LayoutEvaluation& rec = plan.layouts[plan.recommended];
    out << "Recommended for " << objective_name(plan.options.objective) << ": " << rec.layout.to_string();
    if (rec.layout.pp > 1) out << " (layers per stage " << join(rec.layout.pp_layer_partition, "/") << ")";
    if (!rec.layout.tensor_split.empty()) out << " (tensor split " << format_tensor_split(rec.layout.tensor_split) << ")";
    out << " — " << fixed(rec.single_stream_tok_s, 1) << " tokens/s for one stream, " << fixed(rec.aggregate_tok_s, 0)
        << " tokens/s at " << rec.batch << " sequences × " << rec.layout.dp << " replica(s) (context "
        << with_commas(rec.context_tokens) << "); max-model-len " << with_commas(rec.max_model_len) << ", "
        << rec.max_concurrency << " full-length sequences per replica\n";
    std::snprintf(line, sizeof line, "  %4s %-12s %11s %11s %11s %11s %12s %10s\n", "rank", "device", "weights",
                  "workspace", "reserve", "KV cache", "KV tokens", "KV B/tok");
    out << line;
    const int per = rec.layout.ranks_per_replica();
    for (size_t d = 0; d < rec.budgets.size(); ++d)
      for (size_t r = 0; r < rec.budgets[d].size(); ++r) {
        const MemoryBudget& b = rec.budgets[d][r];
        const int dev = static_cast<int>(d) * per + static_cast<int>(r);
        std::snprintf(line, sizeof line, "  %4d %-12s %11s %11s %11s %11s %12s %10s\n", dev,
                      plan.devices.devices[dev].name.c_str(), gib(static_cast<double>(b.weight_bytes)).c_str(),
                      gib(static_cast<double>(b.workspace_bytes)).c_str(), gib(static_cast<double>(b.reserve_bytes)).c_str(),
                      gib(static_cast<double>(b.kv_cache_bytes)).c_str(), with_commas(b.n_kv_tokens).c_str(),
                      with_commas(b.kv_bytes_per_token).c_str());
        out << line;
      }
    {
      // Every rank sized its KV from its own memory; the replica holds what its smallest capacity holds.
      const auto& replica = rec.budgets[static_cast<size_t>(rec.tightest_replica)];
      size_t bind = 0;
      for (size_t r = 1; r < replica.size(); ++r)
        if (replica[r].n_kv_blocks_capacity < replica[bind].n_kv_blocks_capacity) bind = r;
      const int dev = rec.tightest_replica * per + static_cast<int>(bind);
      out << "  KV capacity per rank (blocks of " << o.block_size << " tokens):";
      for (size_t r = 0; r < replica.size(); ++r)
        out << (r ? ", " : " ")
            << (replica[r].n_kv_blocks_capacity >= kUnboundedBlocks ? std::string("no global layer")
                                                                   : with_commas(replica[r].n_kv_blocks_capacity));
      out << "; the replica holds the minimum, " << with_commas(replica[bind].n_kv_blocks_capacity * o.block_size)
          << " tokens: rank " << dev << " (" << plan.devices.devices[static_cast<size_t>(dev)].name << ") binds\n";
    }
    render_speculation(plan, rec, out);
    out << "\n  " << shardlm_serve_command(plan, rec) << "\n";
    const std::string v = vllm_serve_command(plan, rec);
    if (!v.empty()) out << "  " << v << "\n";
    else if (!rec.layout.tensor_split.empty())
      out << "  (vLLM has no --tensor-split: it gives every TP rank an even share)\n";
    else out << "  (vLLM refuses this layout: " << rec.vllm.reason << ")\n";
    if (v.empty() && plan.best_vllm >= 0)
      out << "  closest vLLM layout: " << vllm_serve_command(plan, plan.layouts[plan.best_vllm]) << "\n";
    out << "\n";
  }

  if (s.is_moe()) render_verdict(plan, out);
  const std::vector<std::string> why = explain_plan(plan);
  if (!why.empty()) {
    out << "Why:\n";
    for (const auto& w : why) out << "  - " << w << "\n";
  }
  return out.str();
}

}  // namespace shardlm
