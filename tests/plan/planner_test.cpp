// The planner's enumeration, fit verdicts, recommendations and explanations.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "loader/model_catalog.h"
#include "plan/explain.h"
#include "plan/planner.h"

namespace shardlm {
namespace {

const LayoutEvaluation& find(const Plan& plan, int tp, int pp, int dp) {
  for (const auto& e : plan.layouts)
    if (e.layout.tp == tp && e.layout.pp == pp && e.layout.dp == dp) return e;
  throw Error(ErrorCode::kNotFound, "layout not enumerated");
}

bool contains(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += s + "\n";
  return out;
}

TEST(Planner, EnumeratesEveryLayoutThatFitsTheDeviceCount) {
  // 6 devices: sum over k = tp·pp ≤ 6 of divisors(k) · floor(6 / k)
  //  = 1·6 + 2·3 + 2·2 + 3·1 + 2·1 + 4·1 = 25 layouts.
  Plan plan = make_plan(catalog_model_spec("qwen2.5-7b"), parse_device_inventory("6xA100-40GB"), PlanOptions{});
  EXPECT_EQ(plan.layouts.size(), 25u);
  for (const auto& e : plan.layouts) {
    EXPECT_LE(e.layout.world_size(), 6);
    EXPECT_EQ(e.idle_devices, 6 - e.layout.world_size());
  }
}

TEST(Planner, Qwen7bOnSixA100sForLatencyUsesTp6ThatVllmRefuses) {
  // One stream reads every weight once per token. TP=6 splits the 15.2 GB of weights six ways
  // (≈2.6 GB per rank at 1,555 GB/s ≈ 1.7 ms) and pays 56 all-reduces (≈0.56 ms at 10 µs);
  // TP=4 reads ≈3.8 GB per rank (≈2.5 ms) plus the same all-reduces. TP=6 is fastest; vLLM
  // refuses it (28 heads % 6 = 4), and its best accepted layout is TP=4.
  Plan plan = make_plan(catalog_model_spec("qwen2.5-7b"), parse_device_inventory("6xA100-40GB"), PlanOptions{},
                        "qwen2.5-7b", "Qwen/Qwen2.5-7B-Instruct");
  ASSERT_GE(plan.recommended, 0);
  const LayoutEvaluation& rec = plan.layouts[plan.recommended];
  EXPECT_EQ(rec.layout.tp, 6);
  EXPECT_EQ(rec.layout.pp, 1);
  EXPECT_EQ(rec.layout.dp, 1);
  EXPECT_FALSE(rec.vllm.accepted);
  ASSERT_GE(plan.best_vllm, 0);
  EXPECT_EQ(plan.layouts[plan.best_vllm].layout.tp, 4);
  EXPECT_EQ(plan.layouts[plan.best_vllm].layout.pp, 1);
  // No --max-model-len: the model's 32,768 (the KV cache holds far more).
  EXPECT_EQ(rec.max_model_len, 32768);
  // The replica holds what its tightest rank holds: ranks 1, 2, 4 keep 2 KV heads (28,672 B/token).
  int64_t min_tokens = rec.budgets[0][0].n_kv_tokens;
  for (const auto& b : rec.budgets[0]) min_tokens = std::min(min_tokens, b.n_kv_tokens);
  EXPECT_EQ(rec.kv_tokens, min_tokens);
  EXPECT_EQ(rec.budgets[0][1].kv_bytes_per_token, 28672);
  EXPECT_EQ(rec.max_concurrency, rec.kv_tokens / 32768);
  // Imbalance: 5 vs 4 Q heads = 25% more attention work on rank 0.
  auto q = std::find_if(rec.imbalance.begin(), rec.imbalance.end(), [](const Imbalance& i) { return i.what == "Q heads"; });
  ASSERT_NE(q, rec.imbalance.end());
  EXPECT_EQ(q->max, 5);
  EXPECT_EQ(q->min, 4);
  EXPECT_EQ(q->max_rank, 0);
  EXPECT_EQ(q->min_rank, 4);
  EXPECT_DOUBLE_EQ(q->percent(), 25.0);

  EXPECT_EQ(shardlm_serve_command(plan, rec),
            "shardlm serve qwen2.5-7b -tp 6 -pp 1 -dp 1 --max-model-len 32768 --max-num-seqs 8 --gpu-memory-utilization 0.9");
  EXPECT_EQ(vllm_serve_command(plan, rec), "");
  EXPECT_EQ(vllm_serve_command(plan, plan.layouts[plan.best_vllm]),
            "vllm serve Qwen/Qwen2.5-7B-Instruct --tensor-parallel-size 4 --pipeline-parallel-size 1 "
            "--data-parallel-size 1 --max-model-len 32768 --max-num-seqs 8 --gpu-memory-utilization 0.9");

  const std::string why = joined(explain_plan(plan));
  EXPECT_TRUE(contains(why, "Total number of attention heads (28) must be divisible by tensor parallel size (6).")) << why;
  EXPECT_TRUE(contains(why, "splits the 28 Q heads 5,5,5,5,4,4")) << why;
  EXPECT_TRUE(contains(why, "KV heads per rank 1,2,2,1,2,1")) << why;
  // 9 KV-head copies instead of 4: 5 extra × 2 (k, v) × 128 × (3584 + 1 bias) × 2 bytes × 28 layers
  //  = 5 × 917,760 × 2 × 28 ... = 256,972,800 bytes; KV: 5 × 2 × 128 × 2 × 28 = 71,680 B/token.
  EXPECT_TRUE(contains(why, "256,972,800 bytes")) << why;
  EXPECT_TRUE(contains(why, "71,680 bytes of KV cache per token")) << why;
  EXPECT_TRUE(contains(why, "25.0% more attention work on rank 0")) << why;
}

TEST(Planner, RecommendedBudgetsAreWhatServeComputes) {
  // serve sizes its pools with compute_replica_budgets on the layout plan recommends: same numbers.
  PlanOptions o;
  o.max_model_len = 8192;
  o.budget.kv_cache_dtype = KvCacheDType::kFp8;
  const ModelSpec spec = catalog_model_spec("qwen2.5-32b");
  Plan plan = make_plan(spec, parse_device_inventory("1xA100-80GB,2xA100-40GB"), o);
  ASSERT_GE(plan.recommended, 0);
  const LayoutEvaluation& rec = plan.layouts[plan.recommended];
  std::vector<int64_t> memory;
  for (int r = 0; r < rec.layout.ranks_per_replica(); ++r) memory.push_back(plan.devices.devices[r].memory_bytes);
  const std::vector<MemoryBudget> serve = compute_replica_budgets(spec, rec.layout, memory, o.budget);
  ASSERT_EQ(serve.size(), rec.budgets[0].size());
  for (size_t r = 0; r < serve.size(); ++r) {
    EXPECT_EQ(serve[r].pp_rank, rec.budgets[0][r].pp_rank) << r;
    EXPECT_EQ(serve[r].weight_bytes, rec.budgets[0][r].weight_bytes) << r;
    EXPECT_EQ(serve[r].workspace_bytes, rec.budgets[0][r].workspace_bytes) << r;
    EXPECT_EQ(serve[r].n_kv_blocks, rec.budgets[0][r].n_kv_blocks) << r;
    EXPECT_EQ(serve[r].kv_cache_bytes, rec.budgets[0][r].kv_cache_bytes) << r;
  }
}

TEST(Planner, KvReplicationCostByHand) {
  // Qwen2.5-7B, 7 Q heads per KV head. TP 2: Q 0-13 → KV 0-1, Q 14-27 → KV 2-3: no extra copies.
  const ModelSpec spec = catalog_model_spec("qwen2.5-7b");
  EXPECT_EQ(kv_replication_cost(spec, 2, KvCacheDType::kAuto).extra_kv_heads, 0);
  // TP 28: every rank holds the KV head of its one Q head: 28 copies, 24 extra.
  const KvReplicationCost c = kv_replication_cost(spec, 28, KvCacheDType::kAuto);
  EXPECT_EQ(c.extra_kv_heads, 24);
  EXPECT_EQ(c.kv_bytes_per_token, 24LL * 2 * 128 * 2 * 28);  // 344,064
  EXPECT_EQ(c.weight_bytes, 24LL * 2 * 128 * (3584 + 1) * 2 * 28);
}

TEST(Planner, ThroughputOnSixA100sPrefersReplicas) {
  // With --max-num-seqs 8 each replica decodes at most 8 sequences per step, and a 7B model fits
  // on one A100-40GB, so six TP=1 replicas decode 6 × 8 streams; every TP/PP split of the same
  // six devices serves only 8 streams per replica with fewer replicas.
  PlanOptions o;
  o.objective = Objective::kThroughput;
  Plan plan = make_plan(catalog_model_spec("qwen2.5-7b"), parse_device_inventory("6xA100-40GB"), o);
  ASSERT_GE(plan.recommended, 0);
  const LayoutEvaluation& rec = plan.layouts[plan.recommended];
  EXPECT_EQ(rec.layout.tp, 1);
  EXPECT_EQ(rec.layout.pp, 1);
  EXPECT_EQ(rec.layout.dp, 6);
  EXPECT_TRUE(rec.vllm.accepted);
  EXPECT_EQ(rec.batch, 8);
  // Replicas on identical devices multiply.
  EXPECT_NEAR(rec.aggregate_tok_s, 6 * find(plan, 1, 1, 1).aggregate_tok_s, 1e-6 * rec.aggregate_tok_s);
}

TEST(Planner, Qwen72bOnSix24GiBCardsDoesNotFit) {
  // 145,412,407,296 B of weights = 135.43 GiB; six 24 GiB cards × 0.9 = 129.6 GiB, minus 6 × 1 GiB reserve
  // = 123.6 GiB: the weights alone are 11.83 GiB too many.
  Plan plan = make_plan(catalog_model_spec("qwen2.5-72b"), parse_device_inventory("6x24GiB"), PlanOptions{},
                        "qwen2.5-72b");
  EXPECT_EQ(plan.recommended, -1);
  for (const auto& e : plan.layouts) EXPECT_FALSE(e.fits) << e.layout.to_string();
  EXPECT_EQ(plan.checkpoint_bytes, 145412407296LL);
  const std::string why = joined(explain_plan(plan));
  EXPECT_TRUE(contains(why, "Nothing fits")) << why;
  EXPECT_TRUE(contains(why, "145,412,407,296 bytes (145.4 GB = 135.43 GiB)")) << why;
  EXPECT_TRUE(contains(why, "= 123.60 GiB")) << why;
  EXPECT_TRUE(contains(why, "exceed that by 11.83 GiB")) << why;
  // 8 cards: 135.43 GiB / 8 ≈ 16.9 GiB of weights per card fits 21.6 GiB − 1 GiB − workspace.
  EXPECT_EQ(plan.devices_needed, 8);
}

TEST(Planner, Qwen72bOnFourA100_80GbFitsWithTp4) {
  // 135.43 GiB / 4 ≈ 33.9 GiB per rank of a 71.4 GiB budget (81,251 MiB × 0.9): fits with room
  // for KV; TP=4 reads a quarter of the weights per rank per token, the fastest single stream.
  PlanOptions o;
  o.max_model_len = 32768;
  Plan plan = make_plan(catalog_model_spec("qwen2.5-72b"), parse_device_inventory("4xA100-80GB"), o);
  ASSERT_GE(plan.recommended, 0);
  const LayoutEvaluation& rec = plan.layouts[plan.recommended];
  EXPECT_EQ(rec.layout.tp, 4);
  EXPECT_EQ(rec.layout.pp, 1);
  EXPECT_TRUE(rec.vllm.accepted);
  EXPECT_EQ(rec.max_model_len, 32768);
  // TP=4 over 8 KV heads: 2 per rank, 2 × 2 × 128 × 2 × 80 = 81,920 B/token per rank.
  EXPECT_EQ(rec.budgets[0][0].kv_bytes_per_token, 81920);
  // TP=1 does not fit: 135.43 GiB of weights on one 79.3 GiB card.
  EXPECT_FALSE(find(plan, 1, 1, 1).fits);
  EXPECT_LT(find(plan, 1, 1, 1).headroom_bytes, 0);
}

TEST(Planner, MixedDevicesBudgetEachRankWithItsOwnDevice) {
  Plan plan = make_plan(catalog_model_spec("qwen2.5-14b"), parse_device_inventory("1xA100-80GB,1xA100-40GB"),
                        PlanOptions{});
  const LayoutEvaluation& tp2 = find(plan, 2, 1, 1);
  EXPECT_EQ(tp2.budgets[0][0].memory_bytes, 81251LL * 1024 * 1024);
  EXPECT_EQ(tp2.budgets[0][1].memory_bytes, 40536LL * 1024 * 1024);
  EXPECT_EQ(tp2.kv_tokens, tp2.budgets[0][1].n_kv_tokens);  // the 40 GB card is the tightest
  EXPECT_EQ(tp2.tightest_rank, 1);
  EXPECT_TRUE(contains(joined(explain_plan(plan)), "Mixed devices"));
}

TEST(Planner, TensorParallelAcrossHostsPaysTheInterNodeLink) {
  // 4 devices on 2 hosts: TP=4 spans hosts, TP=2 does not.
  Plan plan = make_plan(catalog_model_spec("qwen2.5-7b"), parse_device_inventory("4xH100-80GB", 2), PlanOptions{});
  EXPECT_TRUE(find(plan, 4, 1, 1).tp_spans_nodes);
  EXPECT_FALSE(find(plan, 2, 1, 1).tp_spans_nodes);
  EXPECT_TRUE(find(plan, 2, 2, 1).pp_spans_nodes);
  // 56 all-reduces at 10 + 2·30 = 70 µs (2 hosts) vs 10 µs: TP=4 across hosts communicates more.
  EXPECT_GT(find(plan, 4, 1, 1).tp_comm_seconds, find(plan, 2, 1, 1).tp_comm_seconds);
  const LayoutEvaluation& rec = plan.layouts[plan.recommended];
  EXPECT_FALSE(rec.tp_spans_nodes) << rec.layout.to_string();
}

TEST(Planner, AllReduceLatencyGrowsWithTheHostsSpanned) {
  // 10 µs within a host; a tree across h hosts adds 2⌈log2 h⌉ hops of 30 µs.
  EXPECT_DOUBLE_EQ(all_reduce_latency(1), 10e-6);
  EXPECT_DOUBLE_EQ(all_reduce_latency(2), 10e-6 + 2 * 30e-6);
  EXPECT_DOUBLE_EQ(all_reduce_latency(3), 10e-6 + 4 * 30e-6);
  EXPECT_DOUBLE_EQ(all_reduce_latency(8), 10e-6 + 6 * 30e-6);
}

TEST(Planner, LatencyOnFourHostsKeepsTensorParallelInsideAHost) {
  // Qwen2.5-72B on 4 hosts × 4 H100 (3,350 GB/s). 160 all-reduces per token (2 × 80 layers):
  //  TP=16 (4 hosts): 145.4 GB / 16 ≈ 9.1 GB per rank = 2.7 ms, + 160 × (10 + 4·30) µs = 20.8 ms
  //  TP=8  (2 hosts): 18.2 GB = 5.4 ms, + 160 × (10 + 2·30) µs = 11.2 ms → ≈ 16.6 ms
  //  TP=4  (1 host):  36.4 GB = 10.9 ms, + 160 × 10 µs = 1.6 ms → ≈ 12.5 ms: the fastest stream.
  Plan plan = make_plan(catalog_model_spec("qwen2.5-72b"), parse_device_inventory("16xH100-80GB", 4), PlanOptions{});
  ASSERT_GE(plan.recommended, 0);
  const LayoutEvaluation& rec = plan.layouts[plan.recommended];
  EXPECT_FALSE(rec.tp_spans_nodes) << rec.layout.to_string();
  EXPECT_EQ(rec.layout.tp, 4);
  EXPECT_EQ(rec.layout.pp, 1);
  EXPECT_GT(rec.single_stream_tok_s, find(plan, 8, 1, 1).single_stream_tok_s);
  EXPECT_GT(find(plan, 8, 1, 1).single_stream_tok_s, find(plan, 16, 1, 1).single_stream_tok_s);
}

TEST(Planner, PipelineExplanationDependsOnLayerCount) {
  // 48 layers (Qwen2.5-14B) over 3 stages is even for vLLM; 28 (Qwen2.5-7B) is not.
  Plan p48 = make_plan(catalog_model_spec("qwen2.5-14b"), parse_device_inventory("3xA10"), PlanOptions{});
  Plan p28 = make_plan(catalog_model_spec("qwen2.5-7b"), parse_device_inventory("3xT4"), PlanOptions{});
  auto pp3 = [](const Plan& p) { return find(p, 1, 3, 1); };
  EXPECT_EQ(pp3(p48).vllm_partition, (std::vector<int64_t>{16, 16, 16}));
  EXPECT_EQ(pp3(p28).vllm_partition, (std::vector<int64_t>{9, 10, 9}));
  // Either the recommended layout has PP=3 or the plan explains PP over all 3 devices.
  const std::string w28 = joined(explain_plan(p28));
  const std::string w48 = joined(explain_plan(p48));
  EXPECT_TRUE(contains(w28, "28 % 3 = 1, so the stages cannot be equal: vLLM gives [9, 10, 9]")) << w28;
  EXPECT_TRUE(contains(w48, "48 = 3 × 16, so vLLM's split is even (16, 16, 16)")) << w48;
}

TEST(Planner, RejectsAContextBeyondTheModel) {
  PlanOptions o;
  o.max_model_len = 100000;
  try {
    make_plan(catalog_model_spec("qwen2.5-7b"), parse_device_inventory("1xH100-80GB"), o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_TRUE(contains(e.what(), "context of 32768 tokens (max_position_embeddings in config.json)")) << e.what();
  }
  // LongRoPE models run past their original context on the long factors:
  // their whole max_position_embeddings is plannable.
  o.max_model_len = 131072;
  Plan long_rope = make_plan(catalog_model_spec("phi-4-mini"), parse_device_inventory("1xH100-80GB"), o);
  ASSERT_GE(long_rope.recommended, 0);
  EXPECT_EQ(long_rope.layouts[long_rope.recommended].max_model_len, 131072);
  o.max_model_len = 131073;
  EXPECT_THROW(make_plan(catalog_model_spec("phi-4-mini"), parse_device_inventory("1xH100-80GB"), o), Error);
}

TEST(Planner, AutoMaxModelLenIsWhatFitsNotTheModelMaximum) {
  // Llama-3.1-8B allows 131,072 positions; on one 24 GiB card the KV cache (131,072 B/token:
  // 2 × 8 × 128 × 2 × 32) holds far fewer, so the plan picks what fits.
  Plan plan = make_plan(catalog_model_spec("llama-3.1-8b"), parse_device_inventory("1xRTX-4090"), PlanOptions{});
  ASSERT_GE(plan.recommended, 0);
  const LayoutEvaluation& rec = plan.layouts[plan.recommended];
  EXPECT_LT(rec.max_model_len, 131072);
  EXPECT_EQ(rec.max_model_len, rec.kv_tokens);
  EXPECT_EQ(rec.max_model_len % 16, 0);
  EXPECT_TRUE(contains(joined(explain_plan(plan)), "the most the tightest rank's KV cache holds"));
}

TEST(Planner, JsonHoldsTheRecommendedBudgetsAndEveryLayout) {
  Plan plan = make_plan(catalog_model_spec("qwen2.5-7b"), parse_device_inventory("6xA100-40GB"), PlanOptions{},
                        "qwen2.5-7b", "Qwen/Qwen2.5-7B-Instruct");
  const nlohmann::json j = plan_json(plan);
  EXPECT_EQ(j["layouts"].size(), 25u);
  EXPECT_EQ(j["recommended"]["tp"], 6);
  ASSERT_EQ(j["recommended"]["budgets"].size(), 1u);
  ASSERT_EQ(j["recommended"]["budgets"][0].size(), 6u);
  EXPECT_EQ(j["recommended"]["budgets"][0][0]["weight_bytes"].get<int64_t>(), 2579562496LL);
  EXPECT_EQ(j["model"]["kv_bytes_per_token"].get<int64_t>(), 57344);
  EXPECT_EQ(j["model"]["weight_bytes"].get<int64_t>(), 15231233024LL);
  EXPECT_EQ(j["recommended"]["vllm"]["accepted"], false);
  EXPECT_EQ(j["best_vllm_layout"]["tp"], 4);
}

}  // namespace

// KV per layer type in the speed model: a decode step reads every position
// of a global layer but only the last sliding_window of a local one. Gemma 3
// 1B at context 16,384 (max-model-len 32,768): 1,024 B per layer-position,
// 4 × 16,384 + 22 × 512 read against 26 × 16,384 with the window ignored,
// 357,564,416 bytes less per token at the A100's bandwidth.
TEST(Planner, DecodeReadsOnlyTheWindowOfLocalLayers) {
  PlanOptions o;
  o.max_model_len = 32768;
  const DeviceInventory inv = parse_device_inventory("1xA100-40GB");
  const ModelSpec windowed = catalog_model_spec("gemma-3-1b");
  ModelSpec full = windowed;
  full.sliding_layers.assign(size_t(full.n_layers), false);
  const Plan pw = make_plan(windowed, inv, o);
  const Plan pf = make_plan(full, inv, o);
  ASSERT_GE(pw.recommended, 0);
  ASSERT_GE(pf.recommended, 0);
  const LayoutEvaluation& w = pw.layouts[size_t(pw.recommended)];
  const LayoutEvaluation& f = pf.layouts[size_t(pf.recommended)];
  ASSERT_EQ(w.context_tokens, 16384);
  const double saved = 1024.0 * (26.0 * 16384 - (4.0 * 16384 + 22.0 * 512)) / inv.devices[0].memory_bandwidth;
  EXPECT_DOUBLE_EQ(saved, 357564416.0 / inv.devices[0].memory_bandwidth);
  EXPECT_NEAR(f.step_seconds_single - w.step_seconds_single, saved, saved * 1e-9);
}

}  // namespace shardlm
