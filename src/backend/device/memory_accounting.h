// What a device allocator actually obtained, measured rather than computed
// (../shared/DESIGN.md §4): each allocation is bracketed by two queries of
// the device's free memory (cudaMemGetInfo on CUDA; a fake in tests), and the
// drop in free bytes is charged to the allocation's category. What was asked
// for is kept beside it, so the difference (allocator rounding, driver page
// granularity, context growth) is visible. A check of plan against serve
// compares plan's prediction with these measured bytes, so it can fail.
//
// Also the budget rule of --gpu-memory-utilization, as in vLLM: the fraction
// u of the device's TOTAL memory this instance may use for everything (CUDA
// context, weights, activations, KV cache). The KV cache gets
// total × u − (bytes this process already holds); free memory at startup must
// be at least total × u, or the start is refused with the numbers.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace shardlm::backend {

struct DeviceMemInfo {
  uint64_t free_bytes = 0;
  uint64_t total_bytes = 0;
};

// One device's memory as the driver reports it.
class MemInfoSource {
 public:
  virtual ~MemInfoSource() = default;
  virtual DeviceMemInfo query() = 0;
};

enum class MemCategory { kWeights, kKvCache, kWorkspace, kRuntime };
constexpr int kNumMemCategories = 4;
const char* mem_category_name(MemCategory category);

class DeviceMemoryAccounting {
 public:
  // Takes the baseline: free memory now (before this rank allocated anything).
  explicit DeviceMemoryAccounting(MemInfoSource& source);

  // Runs allocate (which asks the device for requested_bytes) and charges the
  // drop in free memory it caused to category. Returns the measured bytes.
  // A measured drop below zero (another process freed memory meanwhile)
  // counts as zero and is noted in n_negative_deltas().
  uint64_t measure(MemCategory category, uint64_t requested_bytes, const std::function<void()>& allocate);
  // Records a release: free memory should rise by what was charged.
  uint64_t measure_release(MemCategory category, uint64_t requested_bytes, const std::function<void()>& release);

  uint64_t measured(MemCategory category) const;   // bytes obtained minus bytes released
  uint64_t requested(MemCategory category) const;  // bytes asked for minus bytes released
  uint64_t measured_total() const;
  // free at baseline − free now: everything this process took since, measured
  // or not (e.g. the context's lazy growth, NCCL buffers).
  int64_t used_since_baseline();
  const DeviceMemInfo& baseline() const { return baseline_; }
  int n_negative_deltas() const { return n_negative_; }

  // "weights 14.19 GiB (asked 14.18 GiB), kv_cache ..., workspace ..., runtime ..."
  std::string summary() const;

 private:
  MemInfoSource& source_;
  DeviceMemInfo baseline_;
  uint64_t measured_[kNumMemCategories] = {};
  uint64_t requested_[kNumMemCategories] = {};
  int n_negative_ = 0;
};

// Inputs of the --gpu-memory-utilization rule, for one device.
struct UtilizationBudgetInput {
  double gpu_memory_utilization = 0.9;  // (0, 1]
  DeviceMemInfo at_startup;             // before this process allocated anything
  uint64_t held_bytes = 0;              // what this process holds now: weights, peak workspace, context
  int device = 0;                       // for messages
};

// Bytes the KV cache may take: floor(total × u) − held_bytes. Throws
// Error(kInvalidArgument) for u outside (0, 1], Error(kOutOfMemory) when
// free memory at startup is below total × u (other processes hold memory),
// or when held_bytes already exceeds total × u; each message gives the GiB
// figures and the flag to change.
uint64_t kv_cache_budget_bytes(const UtilizationBudgetInput& input);

// The memory one rank may plan with on a GPU under --gpu-memory-utilization u
// (vLLM's meaning: the fraction of the device's TOTAL memory this instance
// may use, for everything): floor(total × u) split evenly among the ranks
// sharing the device (threads on one GPU; 1 for one process per GPU). The
// KV cache then gets what is left of it after weights, activations and the
// runtime reserve (plan/memory_budget.h). Throws Error(kInvalidArgument) for
// u outside (0, 1] or n_ranks_on_device < 1, Error(kOutOfMemory) when free
// memory at startup is below total × u, with the GiB figures.
uint64_t gpu_rank_memory_bytes(double gpu_memory_utilization, const DeviceMemInfo& at_startup, int n_ranks_on_device,
                               int device);

// How far measured bytes are from plan's prediction, as a fraction of the
// prediction (|measured − predicted| / predicted; 0 when both are 0).
double plan_disagreement(uint64_t predicted, uint64_t measured);

// The verdict serve prints beside a measured figure: "as planned" when equal,
// "within 1.0% of plan (+0.07%)" when plan_disagreement <= tolerance, else
// "DIFFERS from plan by +3.20%" (the sign is measured − predicted).
std::string plan_agreement_text(uint64_t predicted, uint64_t measured, double tolerance);

}  // namespace shardlm::backend
