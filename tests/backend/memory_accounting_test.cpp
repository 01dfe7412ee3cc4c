// Allocator accounting and the --gpu-memory-utilization rule, with a fake
// device whose free memory the test controls.
#include <gtest/gtest.h>

#include "backend/device/memory_accounting.h"
#include "core/error.h"

namespace shardlm::backend {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;

struct FakeDevice : MemInfoSource {
  DeviceMemInfo info{.free_bytes = 140 * kGiB, .total_bytes = 141 * kGiB};
  int n_queries = 0;
  DeviceMemInfo query() override {
    ++n_queries;
    return info;
  }
  // What a real driver does: hands out whole 2 MiB pages.
  void alloc(uint64_t bytes) { info.free_bytes -= (bytes + (2u << 20) - 1) / (2u << 20) * (2u << 20); }
  void release(uint64_t bytes) { info.free_bytes += (bytes + (2u << 20) - 1) / (2u << 20) * (2u << 20); }
};

TEST(DeviceMemoryAccounting, ChargesWhatTheDeviceLostNotWhatWasAsked) {
  FakeDevice dev;
  DeviceMemoryAccounting acc(dev);
  const uint64_t asked = 1000;  // rounds up to one 2 MiB page
  EXPECT_EQ(acc.measure(MemCategory::kWeights, asked, [&] { dev.alloc(asked); }), 2u << 20);
  acc.measure(MemCategory::kKvCache, 3 * kGiB, [&] { dev.alloc(3 * kGiB); });
  EXPECT_EQ(acc.measured(MemCategory::kWeights), 2u << 20);
  EXPECT_EQ(acc.requested(MemCategory::kWeights), asked);
  EXPECT_EQ(acc.measured(MemCategory::kKvCache), 3 * kGiB);
  EXPECT_EQ(acc.measured_total(), 3 * kGiB + (2u << 20));
  dev.info.free_bytes -= 500u << 20;  // the context grew on its own
  EXPECT_EQ(acc.used_since_baseline(), static_cast<int64_t>(3 * kGiB + (2u << 20) + (500u << 20)));
  EXPECT_EQ(acc.measure_release(MemCategory::kKvCache, 3 * kGiB, [&] { dev.release(3 * kGiB); }), 3 * kGiB);
  EXPECT_EQ(acc.measured(MemCategory::kKvCache), 0u);
  EXPECT_NE(acc.summary().find("weights 0.00 GiB (asked 0.00 GiB), kv_cache 0.00 GiB"), std::string::npos);
}

TEST(DeviceMemoryAccounting, AnotherProcessFreeingMemoryIsNotANegativeAllocation) {
  FakeDevice dev;
  DeviceMemoryAccounting acc(dev);
  EXPECT_EQ(acc.measure(MemCategory::kWorkspace, 10, [&] { dev.info.free_bytes += kGiB; }), 0u);
  EXPECT_EQ(acc.n_negative_deltas(), 1);
  EXPECT_EQ(acc.measured(MemCategory::kWorkspace), 0u);
}

TEST(UtilizationBudget, KvGetsTotalTimesUtilizationMinusWhatIsHeld) {
  UtilizationBudgetInput in{.gpu_memory_utilization = 0.9,
                            .at_startup = {.free_bytes = 139 * kGiB, .total_bytes = 140 * kGiB},
                            .held_bytes = 20 * kGiB};
  EXPECT_EQ(kv_cache_budget_bytes(in), 126 * kGiB - 20 * kGiB);
}

TEST(UtilizationBudget, RefusesWithNumbersWhenOthersHoldTheMemory) {
  UtilizationBudgetInput in{.gpu_memory_utilization = 0.9,
                            .at_startup = {.free_bytes = 100 * kGiB, .total_bytes = 140 * kGiB},
                            .held_bytes = 0,
                            .device = 2};
  try {
    kv_cache_budget_bytes(in);
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory);
    EXPECT_NE(std::string(e.what()).find("device 2: free memory at startup (100.00 GiB of 140.00 GiB) is less than "
                                         "--gpu-memory-utilization 0.9 × total = 126.00 GiB"),
              std::string::npos)
        << e.what();
  }
  in.at_startup.free_bytes = 140 * kGiB;
  in.held_bytes = 127 * kGiB;
  EXPECT_THROW(kv_cache_budget_bytes(in), Error);
  in.gpu_memory_utilization = 1.5;
  EXPECT_THROW(kv_cache_budget_bytes(in), Error);
  in.gpu_memory_utilization = 0.0;
  EXPECT_THROW(kv_cache_budget_bytes(in), Error);
}

TEST(UtilizationBudget, PlanDisagreement) {
  EXPECT_DOUBLE_EQ(plan_disagreement(1000, 1005), 0.005);
  EXPECT_DOUBLE_EQ(plan_disagreement(1000, 990), 0.01);
  EXPECT_DOUBLE_EQ(plan_disagreement(0, 0), 0.0);
  EXPECT_GT(plan_disagreement(0, 1), 1.0);
}

TEST(UtilizationBudget, RankMemoryIsTotalTimesUtilizationSplitAmongTheRanksOnTheDevice) {
  const DeviceMemInfo h200{.free_bytes = 140 * kGiB, .total_bytes = 140 * kGiB};
  // One process per GPU: the whole 0.9 × 140 GiB.
  EXPECT_EQ(gpu_rank_memory_bytes(0.9, h200, 1, 0), 126 * kGiB);
  // Six TP ranks as threads sharing the GPU: a sixth each.
  EXPECT_EQ(gpu_rank_memory_bytes(0.9, h200, 6, 0), 21 * kGiB);
  // Of TOTAL memory, not of what is free: 0.5 of 140 GiB with 100 GiB free is 70 GiB.
  EXPECT_EQ(gpu_rank_memory_bytes(0.5, {.free_bytes = 100 * kGiB, .total_bytes = 140 * kGiB}, 1, 0), 70 * kGiB);
  try {
    gpu_rank_memory_bytes(0.9, {.free_bytes = 100 * kGiB, .total_bytes = 140 * kGiB}, 1, 3);
    FAIL() << "0.9 of a device with 100 of 140 GiB free was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory);
    EXPECT_NE(std::string(e.what()).find("device 3: free memory at startup (100.00 GiB"), std::string::npos) << e.what();
  }
  EXPECT_THROW(gpu_rank_memory_bytes(0.9, h200, 0, 0), Error);
  EXPECT_THROW(gpu_rank_memory_bytes(1.01, h200, 1, 0), Error);
}

TEST(UtilizationBudget, PlanAgreementTextHasATolerance) {
  EXPECT_EQ(plan_agreement_text(1000, 1000, 0.01), "as planned");
  EXPECT_EQ(plan_agreement_text(100000, 100070, 0.01), "within 1.0% of plan (+0.07%)");
  EXPECT_EQ(plan_agreement_text(100000, 99000, 0.01), "within 1.0% of plan (-1.00%)");
  EXPECT_EQ(plan_agreement_text(100000, 103200, 0.01), "DIFFERS from plan by +3.20%");
  EXPECT_EQ(plan_agreement_text(100000, 98900, 0.01), "DIFFERS from plan by -1.10%");
  EXPECT_EQ(plan_agreement_text(0, 5, 0.01), "DIFFERS from plan (planned 0)");
  // The CPU's exact check: any difference at all is reported.
  EXPECT_EQ(plan_agreement_text(1000, 1001, 0.0), "DIFFERS from plan by +0.10%");
}

}  // namespace
}  // namespace shardlm::backend
