// Weighted tensor parallelism (plan/tensor_split.h) and plan's choices for
// mixed devices (issue #24): rounding and units, what every rank holds, the
// split chosen from memory and bandwidth against the even one, layers
// balanced by time within memory, inter-host latency, per-rank KV, the picture.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "loader/model_catalog.h"
#include "loader/quant_config.h"
#include "plan/explain.h"
#include "plan/plan_plot.h"
#include "plan/planner.h"
#include "plan/tensor_split.h"

namespace shardlm {
namespace {

bool contains(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

const LayoutEvaluation& find(const Plan& plan, int tp, int pp, int dp) {
  for (const auto& e : plan.layouts)
    if (e.layout.tp == tp && e.layout.pp == pp && e.layout.dp == dp) return e;
  throw Error(ErrorCode::kNotFound, "layout not enumerated");
}

TEST(TensorSplit, ParsesPositiveWeightsAndNamesTheBadEntry) {
  EXPECT_EQ(parse_tensor_split("3,1"), (std::vector<double>{3, 1}));
  EXPECT_EQ(parse_tensor_split("0.771,0.229"), (std::vector<double>{0.771, 0.229}));
  for (const char* bad : {"", "3,,1", "3,0", "-1,2", "a,1", "3,1,", "1e999,1", "nan,1"}) {
    const std::string e = error_of([&] { parse_tensor_split(bad); });
    EXPECT_TRUE(contains(e, "--tensor-split")) << bad << ": " << e;
  }
  EXPECT_EQ(format_tensor_split({0.771, 0.229}), "0.771,0.229");
  EXPECT_EQ(parse_tensor_split(format_tensor_split({0.771, 0.229})), (std::vector<double>{0.771, 0.229}));
}

TEST(TensorSplit, CountsAreProportionalWholeAndAtLeastOne) {
  for (const auto& w : std::vector<std::vector<double>>{{3, 1}, {1, 3}, {5, 2, 1}, {0.77, 0.23}, {100, 1, 1}, {1, 1, 1}}) {
    for (int64_t n : {3, 7, 28, 40, 1728, 9504}) {
      const std::vector<int64_t> c = weighted_counts(n, w, "units");
      const double sum = std::accumulate(w.begin(), w.end(), 0.0);
      EXPECT_EQ(std::accumulate(c.begin(), c.end(), int64_t{0}), n);
      // Largest remainder stays within one unit of each ideal share unless some
      // share is below one unit (then the minimum of one is taken from the others).
      bool all_whole = true;
      for (double x : w) all_whole &= static_cast<double>(n) * x / sum >= 1;
      for (size_t i = 0; i < c.size(); ++i) {
        EXPECT_GE(c[i], 1);
        const double ideal = static_cast<double>(n) * w[i] / sum;
        if (all_whole) {
          EXPECT_LT(std::fabs(static_cast<double>(c[i]) - ideal), 1.0) << n << " part " << i;
        }
      }
    }
  }
  EXPECT_EQ(weighted_counts(4, {3, 1}, "u"), (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(weighted_counts(3, {100, 1, 1}, "u"), (std::vector<int64_t>{1, 1, 1}));  // the minimum wins over the share
  EXPECT_TRUE(contains(error_of([] { weighted_counts(2, {1, 1, 1}, "GQA groups"); }), "2 GQA groups cannot give each of 3"));
}

// The ranks' ranges tile [0, n) in order, for every unit.
void expect_tiles(const std::vector<Range>& ranges, int64_t n, int64_t unit, const std::string& what) {
  int64_t at = 0;
  for (const Range& r : ranges) {
    EXPECT_EQ(r.begin, at) << what;
    EXPECT_GT(r.size(), 0) << what;
    EXPECT_EQ(r.begin % unit, 0) << what;
    at = r.end;
  }
  EXPECT_EQ(at, n) << what;
}

TEST(TensorSplit, ShardsFollowTheSharesInTheirUnits) {
  const ModelSpec spec = catalog_model_spec("qwen2.5-32b");  // 40 Q / 8 KV heads, MLP 27648, vocab 152064
  Layout layout{2, 1, 1, {}};
  layout.tensor_split = {0.77, 0.23};
  std::vector<Range> q, kv, mlp, vocab;
  for (int r = 0; r < 2; ++r) {
    const RankShard s = shard_for(spec, layout, r, 0);
    q.push_back(s.q_heads);
    kv.push_back(s.kv_heads);
    mlp.push_back(s.intermediate);
    vocab.push_back(s.vocab);
  }
  expect_tiles(q, 40, 1, "Q heads");
  expect_tiles(mlp, 27648, 16, "MLP columns");
  expect_tiles(vocab, 152064, 16, "vocabulary");
  // 30.8 : 9.2 heads: whole groups of 5 would give 30 : 10 (8.7% over on rank 1), so heads it is: 31 : 9,
  // and KV head 6 lives on both ranks.
  EXPECT_EQ(q[0].size(), 31);
  EXPECT_EQ(kv[0], (Range{0, 7}));
  EXPECT_EQ(kv[1], (Range{6, 8}));
  EXPECT_NEAR(static_cast<double>(mlp[0].size()) / 27648, 0.77, 16.0 / 27648);
  // The realised shares, as plan prints them beside the requested.
  const RealisedSplit rs = realised_split(spec, layout, 0);
  EXPECT_NEAR(rs.requested[0], 0.77, 1e-12);
  EXPECT_NEAR(rs.q_heads[0], 31.0 / 40, 1e-12);
  EXPECT_NEAR(rs.vocab[1], static_cast<double>(vocab[1].size()) / 152064, 1e-12);
  // Without a split: the even split of sharding.h, unchanged.
  EXPECT_EQ(shard_for(spec, Layout{2, 1, 1, {}}, 0, 0).q_heads, (Range{0, 20}));
}

TEST(TensorSplit, WholeGqaGroupsWhenTheyBalanceAsWell) {
  const ModelSpec spec = catalog_model_spec("qwen2.5-7b");  // 28 Q / 4 KV heads: groups of 7
  Layout layout{2, 1, 1, {}};
  layout.tensor_split = {3, 1};  // 21 : 7 heads = 3 : 1 groups exactly
  const RankShard a = shard_for(spec, layout, 0, 0), b = shard_for(spec, layout, 1, 0);
  EXPECT_EQ(a.q_heads, (Range{0, 21}));
  EXPECT_EQ(a.kv_heads, (Range{0, 3}));
  EXPECT_EQ(b.kv_heads, (Range{3, 4}));  // no KV head on two ranks
}

TEST(TensorSplit, StageMajorSplitsDifferPerStage) {
  const ModelSpec spec = catalog_model_spec("qwen2.5-7b");
  Layout layout{2, 2, 1, {}};
  layout.tensor_split = {3, 1, 1, 1};
  EXPECT_EQ(shard_for(spec, layout, 0, 0).q_heads.size(), 21);
  EXPECT_EQ(shard_for(spec, layout, 0, 1).q_heads.size(), 14);
  EXPECT_EQ(stage_split(layout, 1), (std::vector<double>{0.5, 0.5}));
  layout.tensor_split = {3, 1, 1};
  EXPECT_TRUE(contains(error_of([&] { validate_layout(spec, layout); }),
                       "--tensor-split has 3 weights but TP=2 PP=2 DP=1 split 3,1,1 has 2 tensor-parallel ranks per stage: "
                       "give 2 weights (every stage alike) or 4 (tp × pp, stage-major)"));
}

TEST(TensorSplit, ExpertsAreWeightedUnderExpertParallelism) {
  const ModelSpec spec = catalog_model_spec("qwen3-30b-a3b");  // 128 experts, moe_intermediate 768
  Layout layout{2, 1, 1, {}};
  layout.expert_parallel = true;
  layout.tensor_split = {3, 1};
  EXPECT_EQ(shard_for(spec, layout, 0, 0).experts, (Range{0, 96}));
  EXPECT_EQ(shard_for(spec, layout, 1, 0).experts, (Range{96, 128}));
  layout.expert_parallel = false;  // each expert's columns instead: 48 units of 16
  EXPECT_EQ(shard_for(spec, layout, 0, 0).expert_intermediate, (Range{0, 576}));
  EXPECT_EQ(shard_for(spec, layout, 0, 0).experts, (Range{0, 128}));
}

TEST(TensorSplit, QuantizedSplitsKeepWholeGroupsOrAreRefused) {
  ModelSpec spec = catalog_model_spec("qwen2.5-7b");
  spec.quant = published_quant_config("awq", 128, false, true, "--quantization");
  Layout layout{2, 1, 1, {}};
  layout.tensor_split = {3, 1};
  for (int r = 0; r < 2; ++r) {
    const RankShard s = shard_for(spec, layout, r, 0);
    EXPECT_EQ(s.intermediate.begin % 128, 0);
    EXPECT_EQ((s.q_heads.begin * spec.head_dim) % 128, 0);
  }
  EXPECT_GT(rank_weight_bytes(spec, layout, 0, 0), 2 * rank_weight_bytes(spec, layout, 1, 0));
}

// Plan on one A100-80GB and one RTX 4090, Qwen2.5-32B BF16 (65.5 GB): the
// even TP split overflows the 4090; a split by memory and bandwidth fits,
// and so does PP sized by memory. Plan uses both devices and says so.
TEST(MixedPlan, Qwen32bOnA100AndRtx4090UsesBothDevices) {
  const ModelSpec spec = catalog_model_spec("qwen2.5-32b");
  const DeviceInventory devices = parse_device_inventory("1xA100-80GB,1xRTX-4090");
  for (Objective objective : {Objective::kLatency, Objective::kThroughput}) {
    PlanOptions o;
    o.objective = objective;
    const Plan plan = make_plan(spec, devices, o, "qwen2.5-32b");
    ASSERT_GE(plan.recommended, 0);
    const LayoutEvaluation& rec = plan.layouts[static_cast<size_t>(plan.recommended)];
    EXPECT_EQ(rec.idle_devices, 0) << rec.layout.to_string();
    const LayoutEvaluation& tp2 = find(plan, 2, 1, 1);
    EXPECT_TRUE(tp2.fits);
    ASSERT_EQ(tp2.layout.tensor_split.size(), 2u);
    EXPECT_GT(tp2.layout.tensor_split[0], tp2.layout.tensor_split[1]);  // the A100 takes more
    ASSERT_TRUE(tp2.even.evaluated);
    EXPECT_FALSE(tp2.even.fits);  // 32.8 GB per rank does not fit a 24 GiB card
    EXPECT_GT(tp2.single_stream_tok_s, find(plan, 1, 1, 1).single_stream_tok_s);  // two cards read faster than one
    const LayoutEvaluation& pp2 = find(plan, 1, 2, 1);
    EXPECT_TRUE(pp2.fits);
    EXPECT_TRUE(pp2.partition_by_time);
    EXPECT_GT(pp2.layout.pp_layer_partition[0], pp2.layout.pp_layer_partition[1]);
    EXPECT_FALSE(pp2.even.fits);  // the engine's byte balance puts half the layers on the 4090
    // Each rank sized its own KV; the replica holds the smallest.
    ASSERT_EQ(rec.budgets[0].size(), 2u);
    EXPECT_EQ(rec.kv_tokens, std::min(rec.budgets[0][0].n_kv_blocks_capacity, rec.budgets[0][1].n_kv_blocks_capacity) *
                                 o.budget.block_size);
    const std::string cmd = shardlm_serve_command(plan, rec);
    if (rec.layout.tp == 2) {
      EXPECT_TRUE(contains(cmd, "--tensor-split " + format_tensor_split(rec.layout.tensor_split))) << cmd;
    }
    if (rec.layout.pp == 2) {
      EXPECT_TRUE(contains(cmd, "--pp-layer-partition")) << cmd;
    }
    const std::string text = render_plan_text(plan);
    EXPECT_TRUE(contains(text, "The even split")) << text;
    EXPECT_TRUE(contains(text, "binds")) << text;
    EXPECT_TRUE(contains(text, cmd)) << text;
    // vLLM cannot run a split: the closest vLLM command is an even layout's.
    ASSERT_GE(plan.best_vllm, 0);
    EXPECT_TRUE(plan.layouts[plan.best_vllm].layout.tensor_split.empty());
    if (!rec.layout.tensor_split.empty()) {
      EXPECT_TRUE(contains(text, "vLLM has no --tensor-split")) << text;
      EXPECT_TRUE(contains(text, "closest vLLM layout: vllm serve")) << text;
    }
    const nlohmann::json j = plan_json(plan);
    EXPECT_EQ(j["recommended"]["tensor_split"].is_null(), rec.layout.tensor_split.empty());
    EXPECT_TRUE(j["recommended"].contains("even_split"));
  }
}

TEST(MixedPlan, IdenticalDevicesKeepTheEvenSplit) {
  const Plan plan = make_plan(catalog_model_spec("qwen2.5-32b"), parse_device_inventory("4xRTX-4090"), PlanOptions{});
  for (const auto& e : plan.layouts) EXPECT_TRUE(e.layout.tensor_split.empty()) << e.layout.to_string();
}

// A user's split is the only one evaluated; layouts it does not fit are left out.
TEST(MixedPlan, AGivenSplitAndPartitionAreTheOnesEvaluated) {
  PlanOptions o;
  o.tensor_split = {3, 1};
  o.pp_layer_partition = {40, 24};
  const Plan plan = make_plan(catalog_model_spec("qwen2.5-32b"), parse_device_inventory("4xA100-80GB"), o);
  ASSERT_FALSE(plan.layouts.empty());
  for (const auto& e : plan.layouts) {
    EXPECT_EQ(e.layout.pp, 2);
    EXPECT_TRUE(e.layout.tp == 2 || e.layout.tp == 1) << e.layout.to_string();  // 2 weights: tp 2, or tp 1 × pp 2
    EXPECT_EQ(e.layout.pp_layer_partition, (std::vector<int64_t>{40, 24}));
    EXPECT_EQ(e.layout.tensor_split, (std::vector<double>{3, 1}));
  }
  o.pp_layer_partition = {40, 20};
  EXPECT_TRUE(contains(error_of([&] { make_plan(catalog_model_spec("qwen2.5-32b"), parse_device_inventory("4xA100-80GB"), o); }),
                       "--pp-layer-partition sums to 60 layers but the model has 64"));
}

// Layers balanced by time: on identical devices a stage's time is its layers'
// reads; the last stage also reads the lm_head, so it gets fewer layers than
// the byte balance (which counts the embedding, never read whole, on stage 0).
TEST(MixedPlan, TimeBalanceCountsTheLmHeadNotTheEmbedding) {
  const ModelSpec spec = catalog_model_spec("qwen2.5-7b");
  const DeviceInventory devices = parse_device_inventory("2xA100-80GB");
  Layout layout{1, 2, 1, {}};
  const std::vector<int64_t> timed = time_balanced_partition(spec, devices, PlanOptions{}, layout);
  const std::vector<int64_t> bytes = pipeline_partition(spec, layout);
  ASSERT_EQ(timed.size(), 2u);
  EXPECT_EQ(timed[0] + timed[1], 28);
  EXPECT_GT(timed[0], bytes[0]);
  EXPECT_GT(timed[0], timed[1]);
  // Memory caps a stage: on A100-80GB + RTX 4090, 32B at PP 2 puts on the 4090 only what fits it.
  const std::vector<int64_t> mixed = time_balanced_partition(catalog_model_spec("qwen2.5-32b"),
                                                             parse_device_inventory("1xA100-80GB,1xRTX-4090"), PlanOptions{}, layout);
  ASSERT_EQ(mixed.size(), 2u);
  EXPECT_GT(mixed[0], 40);
}

// Two hosts of two RTX 4090s on 10 GbE: 128 all-reduces per token across TCP
// Ethernet cost more than PP's one send, so plan keeps TP inside a host.
TEST(MixedPlan, TpStaysInsideAHostOnSlowEthernet) {
  const ModelSpec spec = catalog_model_spec("qwen2.5-32b");
  const DeviceInventory devices = parse_device_inventory("4xRTX-4090", 2, 10e9 / 8);
  const Plan plan = make_plan(spec, devices, PlanOptions{}, "qwen2.5-32b");
  ASSERT_GE(plan.recommended, 0);
  const LayoutEvaluation& rec = plan.layouts[static_cast<size_t>(plan.recommended)];
  EXPECT_EQ(rec.layout.tp, 2);
  EXPECT_EQ(rec.layout.pp, 2);
  EXPECT_FALSE(rec.tp_spans_nodes);
  EXPECT_TRUE(rec.pp_spans_nodes);
  EXPECT_GT(rec.single_stream_tok_s, find(plan, 4, 1, 1).single_stream_tok_s);
  const std::string why = render_plan_text(plan);
  EXPECT_TRUE(contains(why, "TP inside a host, PP across hosts")) << why;
  EXPECT_TRUE(contains(why, "the default for TCP Ethernet")) << why;
  // With an RDMA-class latency given, TP 4 across the hosts is faster again.
  PlanOptions fast;
  fast.inter_node_latency = 2e-6;
  const Plan rdma = make_plan(spec, devices, fast, "qwen2.5-32b");
  EXPECT_GT(find(rdma, 4, 1, 1).single_stream_tok_s, find(plan, 4, 1, 1).single_stream_tok_s);
  EXPECT_DOUBLE_EQ(default_inter_node_latency(100e9 / 8), kInterNodeLatency);
  EXPECT_DOUBLE_EQ(default_inter_node_latency(10e9 / 8), kEthernetInterNodeLatency);
}

TEST(MixedPlan, PictureShowsEveryDeviceAndBothSplits) {
  const Plan plan = make_plan(catalog_model_spec("qwen2.5-32b"), parse_device_inventory("1xA100-80GB,1xRTX-4090"),
                              PlanOptions{}, "qwen2.5-32b");
  const std::string svg = plan_svg(plan);
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_TRUE(contains(svg, "</svg>"));
  EXPECT_TRUE(contains(svg, "Recommended: "));
  EXPECT_TRUE(contains(svg, "Even split: "));
  EXPECT_TRUE(contains(svg, "does not fit"));  // the even split overflows the 4090
  EXPECT_TRUE(contains(svg, "RTX-4090"));
  EXPECT_TRUE(contains(svg, "A100-80GB"));
  EXPECT_TRUE(contains(svg, "<title>weights: "));
  EXPECT_TRUE(contains(svg, "<title>KV cache: "));
  EXPECT_TRUE(contains(error_of([&] { write_plan_svg(plan, "/nonexistent/dir/plan.svg"); }), "--plot /nonexistent/dir/plan.svg"));
}

}  // namespace
}  // namespace shardlm
