// Mixture-of-experts planning: expert layouts of any count over any degree,
// each rank's tensors under EP and TP, all weights vs active ones, vLLM's
// verdicts, and the verdicts for the issue's three cases.
#include <gtest/gtest.h>

#include <numeric>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "loader/model_catalog.h"
#include "plan/explain.h"
#include "plan/moe_accounting.h"
#include "plan/planner.h"
#include "plan/vllm_rules.h"

namespace shardlm {
namespace {

// The expert id in a Hugging Face name ("...experts.17.up_proj.weight": 17; -1
// for none): the test reads the names itself, apart from the families' tables.
int64_t expert_index(const std::string& name) {
  const std::string key = ".experts.";
  const size_t at = name.find(key);
  if (at == std::string::npos) return -1;
  size_t pos = at + key.size();
  int64_t e = 0;
  bool digits = false;
  while (pos < name.size() && name[pos] >= '0' && name[pos] <= '9') {
    e = e * 10 + (name[pos++] - '0');
    digits = true;
  }
  return digits ? e : -1;
}

bool contains(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

TEST(MoePlan, AnyExpertCountOverAnyRankCount) {
  std::vector<int64_t> sizes;
  for (int r = 0; r < 6; ++r) sizes.push_back(expert_range(128, 6, r).size());
  EXPECT_EQ(sizes, (std::vector<int64_t>{22, 22, 21, 21, 21, 21}));
  for (int64_t n : {8, 60, 128})
    for (int ep = 1; ep <= 16; ++ep) {
      int64_t next = 0;
      for (int r = 0; r < ep; ++r) {
        Range e = expert_range(n, ep, r);
        EXPECT_EQ(e.begin, next);  // contiguous, in order, covering every expert once
        EXPECT_LE(e.size(), n / ep + 1);
        EXPECT_GE(e.size(), n / ep);
        next = e.end;
      }
      EXPECT_EQ(next, n);
    }
  EXPECT_EQ(expert_index("model.layers.3.mlp.experts.17.up_proj.weight"), 17);
  EXPECT_EQ(expert_index("model.layers.3.block_sparse_moe.experts.7.w2.weight"), 7);
  EXPECT_EQ(expert_index("model.layers.3.mlp.gate.weight"), -1);
}

// Under EP each rank loads whole experts of its range; under TP a slice of
// every expert. Either way the ranks' expert bytes add up to the checkpoint's.
TEST(MoePlan, RankTensorsUnderEpAndTp) {
  const ModelSpec spec = catalog_model_spec("qwen3-30b-a3b");
  const MoeAccounting m = moe_accounting(spec, KvCacheDType::kAuto);
  for (bool ep : {true, false}) {
    Layout layout;
    layout.tp = 6;
    layout.expert_parallel = ep;
    int64_t expert_sum = 0;
    for (int r = 0; r < 6; ++r) {
      const RankShard s = shard_for(spec, layout, r, 0);
      for (const TensorShard& t : rank_tensors(spec, layout, r, 0)) {
        const int64_t e = expert_index(t.name);
        if (e < 0) continue;
        EXPECT_TRUE(s.experts.contains(e)) << t.name;
        if (ep) EXPECT_EQ(t.local_shape, t.full_shape) << t.name;  // whole experts
        else EXPECT_EQ(t.local_shape[t.split_dim], 128) << t.name;  // 768 columns / 6
        expert_sum += t.bytes;
      }
    }
    EXPECT_EQ(expert_sum, m.expert_bytes) << (ep ? "EP" : "TP");
  }
  const ExpertShare ep = expert_share(spec, 6, true);
  EXPECT_EQ(ep.counts(), "22,22,21,21,21,21");
  EXPECT_EQ(ep.bytes_per_rank[0], 22LL * 3 * 768 * 2048 * 2 * 48);  // 9,965,666,304
  EXPECT_EQ(ep.bytes_per_rank[5], 21LL * 3 * 768 * 2048 * 2 * 48);
  EXPECT_NEAR(ep.imbalance_percent(), 100.0 / 21, 1e-9);
  const ExpertShare tp = expert_share(spec, 6, false);
  EXPECT_EQ(tp.counts(), "128,128,128,128,128,128");
  EXPECT_EQ(tp.bytes_per_rank[3], 128LL * 3 * 128 * 2048 * 2 * 48);
  EXPECT_EQ(tp.imbalance_percent(), 0.0);
  // A dense model has no experts to distribute.
  Layout dense;
  dense.tp = 2;
  dense.expert_parallel = true;
  EXPECT_THROW(validate_layout(catalog_model_spec("qwen3-8b"), dense), Error);
}

TEST(MoePlan, AllWeightsAgainstActiveWeights) {
  const MoeAccounting q = moe_accounting(catalog_model_spec("qwen3-30b-a3b"), KvCacheDType::kAuto);
  EXPECT_EQ(q.total_weight_bytes, 61064245248);
  EXPECT_EQ(q.expert_bytes, 48LL * 128 * 3 * 768 * 2048 * 2);  // 57,982,058,496
  EXPECT_EQ(q.active_bytes_per_token, q.shared_bytes + 48LL * 8 * 3 * 768 * 2048 * 2);
  EXPECT_EQ(q.active_params, 3353032704);  // Qwen: "3.3B activated"
  EXPECT_EQ(q.kv_bytes_per_token, 2LL * 4 * 128 * 2 * 48);  // 98,304
  const MoeAccounting mix = moe_accounting(catalog_model_spec("mixtral-8x7b"), KvCacheDType::kAuto);
  EXPECT_EQ(mix.total_params, 46702792704);
  EXPECT_NEAR(static_cast<double>(mix.active_params) / 1e9, 12.9, 0.05);  // Mistral: "12.9B active"
  const MoeAccounting big = moe_accounting(catalog_model_spec("qwen3-235b-a22b"), KvCacheDType::kAuto);
  EXPECT_NEAR(static_cast<double>(big.active_params) / 1e9, 22.0, 0.3);  // "22B activated"
  EXPECT_NEAR(static_cast<double>(big.total_params) / 1e9, 235.1, 0.3);
  // A decode step of B tokens touches 1 − (1 − k/E)^B of the experts.
  const ModelSpec spec = catalog_model_spec("qwen3-30b-a3b");
  EXPECT_DOUBLE_EQ(moe_expert_fraction(spec, 1), 8.0 / 128);
  EXPECT_NEAR(moe_expert_fraction(spec, 64), 1 - std::pow(120.0 / 128, 64), 1e-12);
}

TEST(MoePlan, VllmAcceptsUnevenExpertsButNotUnevenExpertSlices) {
  ModelSpec spec = catalog_model_spec("qwen3-30b-a3b");
  Layout layout;
  layout.tp = 6;
  layout.expert_parallel = true;
  VllmVerdict v = vllm_check_layout(spec, layout);  // experts 22/21 are fine; 32 heads over 6 are not
  EXPECT_FALSE(v.accepted);
  EXPECT_TRUE(contains(v.reason, "Total number of attention heads (32)")) << v.reason;
  layout.tp = 4;
  EXPECT_TRUE(vllm_check_layout(spec, layout).accepted);
  spec.moe_intermediate_size = 100;  // 100 columns over 8 ranks
  layout.tp = 8;
  layout.expert_parallel = false;
  v = vllm_check_layout(spec, layout);
  EXPECT_FALSE(v.accepted);
  EXPECT_EQ(v.reason, "AssertionError: assert intermediate_size % self.tp_size == 0");
  EXPECT_TRUE(contains(v.rule, "moe_intermediate_size 100 % TP 8 = 4")) << v.rule;
  layout.expert_parallel = true;
  EXPECT_TRUE(vllm_check_layout(spec, layout).accepted);
}

PlanOptions ep_options() {
  PlanOptions o;
  o.expert_parallel = true;
  return o;
}

// The three verdicts of the issue, each with exact bytes.
// The speed model's choice between the all-reduce shardlm runs and an
// all_to_all dispatch + combine, in exact bytes per rank per layer.
TEST(MoePlan, TokenExchangeBytesAllReduceAgainstAllToAll) {
  const ModelSpec q30 = catalog_model_spec("qwen3-30b-a3b");  // hidden 2048, top-8, bf16
  // 8 tokens × 2048 × 2 B = 32,768 B; all-reduces 4 × 5/6 of it; all_to_all 5/6 × (2 + 16/6) of it.
  MoeCommCost c = moe_comm_cost(q30, 6, 8, 2);
  EXPECT_EQ(c.all_reduce_bytes, 109227);
  EXPECT_EQ(c.all_to_all_bytes, 127431);
  EXPECT_TRUE(c.all_reduce_cheaper());
  c = moe_comm_cost(q30, 8, 8, 2);  // k == t: equal
  EXPECT_EQ(c.all_reduce_bytes, c.all_to_all_bytes);
  const ModelSpec mix = catalog_model_spec("mixtral-8x7b");  // hidden 4096, top-2
  c = moe_comm_cost(mix, 8, 8, 2);
  EXPECT_EQ(c.all_reduce_bytes, 229376);   // 4 × 7/8 × 65,536
  EXPECT_EQ(c.all_to_all_bytes, 143360);   // 7/8 × 65,536 × 2.5
  EXPECT_FALSE(c.all_reduce_cheaper());
  // plan says which it uses, and where all_to_all would move fewer bytes, that it is not implemented.
  const std::string text =
      render_plan_text(make_plan(mix, parse_device_inventory("8xH200"), ep_options(), "mixtral-8x7b"));
  EXPECT_TRUE(contains(text, "all_to_all would be cheaper by 86,016 bytes")) << text;
  EXPECT_TRUE(contains(text, "shardlm implements only the all-reduce path")) << text;
  const nlohmann::json j =
      plan_json(make_plan(q30, parse_device_inventory("6x24GiB"), ep_options(), "qwen3-30b-a3b"));
  EXPECT_EQ(j["moe"]["token_exchange"]["all_reduce_bytes_per_rank_per_layer"], 109227);
  EXPECT_EQ(j["moe"]["token_exchange"]["cheaper"], "all_reduce");
  EXPECT_EQ(j["moe"]["token_exchange"]["used"], "all_reduce");
}

TEST(MoePlan, VerdictsForTheIssuesThreeCases) {
  {  // Qwen3-30B-A3B on 6 × 24 GiB: 61 GB of weights over 6 ranks.
    Plan plan = make_plan(catalog_model_spec("qwen3-30b-a3b"), parse_device_inventory("6x24GiB"), ep_options(),
                          "qwen3-30b-a3b");
    ASSERT_GE(plan.recommended, 0);
    const LayoutEvaluation& rec = plan.layouts[plan.recommended];
    EXPECT_TRUE(rec.fits);
    for (const auto& e : plan.layouts) EXPECT_EQ(e.layout.expert_parallel, e.layout.tp > 1);
    const std::string text = render_plan_text(plan);
    EXPECT_TRUE(contains(text, "Verdict: fits on")) << text;
    EXPECT_TRUE(contains(text, "61,064,245,248")) << text;
    EXPECT_TRUE(contains(text, "3.35 B active params")) << text;
    EXPECT_TRUE(contains(text, "all_to_all")) << text;
    const nlohmann::json j = plan_json(plan);
    EXPECT_EQ(j["moe"]["active_params"], 3353032704);
    EXPECT_TRUE(j["options"]["enable_expert_parallel"].get<bool>());
    // The EP layout over 6 ranks states its 22-vs-21 expert imbalance.
    bool found = false;
    for (const auto& e : plan.layouts)
      if (e.layout.tp == 6)
        for (const auto& im : e.imbalance)
          if (im.what == "experts") {
            EXPECT_EQ(im.max, 22);
            EXPECT_EQ(im.min, 21);
            found = true;
          }
    EXPECT_TRUE(found);
  }
  {  // Qwen3-30B-A3B on 2 × A100-80GB: fits on two, vLLM accepts TP 2 with EP.
    Plan plan = make_plan(catalog_model_spec("qwen3-30b-a3b"), parse_device_inventory("2xA100-80GB"), ep_options(),
                          "qwen3-30b-a3b");
    ASSERT_GE(plan.recommended, 0);
    EXPECT_GE(plan.best_vllm, 0);
    EXPECT_TRUE(contains(render_plan_text(plan), "Verdict: fits")) << render_plan_text(plan);
  }
  {  // Qwen3-235B-A22B (470 GB of weights) on 8 × H200 (141 GB each).
    Plan plan = make_plan(catalog_model_spec("qwen3-235b-a22b"), parse_device_inventory("8xH200"), ep_options(),
                          "qwen3-235b-a22b");
    ASSERT_GE(plan.recommended, 0);
    const LayoutEvaluation& rec = plan.layouts[plan.recommended];
    EXPECT_GE(rec.layout.world_size(), 4);  // 470 GB cannot sit on fewer than four 141 GB devices
    const std::string text = render_plan_text(plan);
    EXPECT_TRUE(contains(text, "Verdict: fits")) << text;
    EXPECT_TRUE(contains(text, "--enable-expert-parallel")) << text;
  }
}

}  // namespace
}  // namespace shardlm
