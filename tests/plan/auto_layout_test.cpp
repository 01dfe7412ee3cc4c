// -tp auto: the layout plan recommends among those that use every rank.
#include <gtest/gtest.h>

#include "core/error.h"
#include "loader/model_catalog.h"
#include "plan/auto_layout.h"
#include "plan/planner.h"

namespace shardlm {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

PlanOptions options(Objective objective) {
  PlanOptions o;
  o.objective = objective;
  o.budget.reserve_bytes = 0;
  return o;
}

// The choice, recomputed from make_plan: the best score among fitting
// layouts with tp × pp × dp == n_ranks and dp <= max_dp.
Layout best_by_plan(const ModelSpec& spec, int n_ranks, const DeviceSpec& d, const PlanOptions& o, int max_dp) {
  DeviceInventory inv;
  inv.devices.assign(static_cast<size_t>(n_ranks), d);
  const Plan plan = make_plan(spec, inv, o);
  const LayoutEvaluation* best = nullptr;
  for (const auto& e : plan.layouts)
    if (e.fits && e.layout.world_size() == n_ranks && e.layout.dp <= max_dp &&
        (!best || objective_score(e, o.objective) > objective_score(*best, o.objective)))
      best = &e;
  EXPECT_NE(best, nullptr);
  return best ? best->layout : Layout{};
}

TEST(AutoLayout, SixRanksOfQwen7bUseEveryRankAndPlansBest) {
  const ModelSpec spec = catalog_model_spec("qwen2.5-7b");
  const DeviceSpec d = cpu_rank_device(16 * kGiB);
  for (Objective obj : {Objective::kLatency, Objective::kThroughput}) {
    for (int max_dp : {1, 8}) {
      const AutoLayoutChoice c = choose_auto_layout(spec, 6, d, 1, options(obj), max_dp);
      EXPECT_EQ(c.layout.world_size(), 6) << c.reason;
      EXPECT_LE(c.layout.dp, max_dp);
      const Layout want = best_by_plan(spec, 6, d, options(obj), max_dp);
      EXPECT_EQ(c.layout.to_string(), want.to_string()) << c.reason;
      EXPECT_NE(c.reason.find("plan chose " + want.to_string()), std::string::npos) << c.reason;
      EXPECT_EQ(c.layout.pp_layer_partition.size(), static_cast<size_t>(c.layout.pp));
    }
  }
  // One stream reads every weight per token: six-way TP wins on latency,
  // which vLLM refuses for this model (4 KV heads).
  EXPECT_EQ(choose_auto_layout(spec, 6, d, 1, options(Objective::kLatency), 1).layout.tp, 6);
}

TEST(AutoLayout, OneRankIsTp1) {
  const AutoLayoutChoice c =
      choose_auto_layout(catalog_model_spec("qwen2.5-0.5b"), 1, cpu_rank_device(8 * kGiB), 1, options(Objective::kThroughput), 8);
  EXPECT_EQ(c.layout.tp, 1);
  EXPECT_EQ(c.layout.pp, 1);
  EXPECT_EQ(c.layout.dp, 1);
}

TEST(AutoLayout, NothingFitsSaysWhyWithTheNumbers) {
  try {
    choose_auto_layout(catalog_model_spec("qwen2.5-72b"), 2, cpu_rank_device(8 * kGiB), 1, options(Objective::kLatency), 1);
    FAIL() << "72B fit on 2 × 8 GiB";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory);
    const std::string m = e.what();
    EXPECT_NE(m.find("no layout of exactly 2 rank(s)"), std::string::npos) << m;
    EXPECT_NE(m.find("Nothing fits"), std::string::npos) << m;
    EXPECT_NE(m.find("mpirun -np"), std::string::npos) << m;
  }
}

TEST(AutoLayout, RanksMustSplitEvenlyOverHosts) {
  EXPECT_THROW(choose_auto_layout(catalog_model_spec("qwen2.5-0.5b"), 3, cpu_rank_device(8 * kGiB), 2,
                                  options(Objective::kLatency), 1),
               Error);
}

}  // namespace
}  // namespace shardlm
