#include "backend/device/memory_accounting.h"

#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace shardlm::backend {

namespace {

std::string gib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / static_cast<double>(uint64_t{1} << 30));
  return buf;
}

int idx(MemCategory c) { return static_cast<int>(c); }

}  // namespace

const char* mem_category_name(MemCategory category) {
  switch (category) {
    case MemCategory::kWeights: return "weights";
    case MemCategory::kKvCache: return "kv_cache";
    case MemCategory::kWorkspace: return "workspace";
    case MemCategory::kRuntime: return "runtime";
  }
  return "?";
}

DeviceMemoryAccounting::DeviceMemoryAccounting(MemInfoSource& source) : source_(source), baseline_(source.query()) {}

uint64_t DeviceMemoryAccounting::measure(MemCategory category, uint64_t requested_bytes,
                                         const std::function<void()>& allocate) {
  const DeviceMemInfo before = source_.query();
  allocate();
  const DeviceMemInfo after = source_.query();
  uint64_t delta = 0;
  if (after.free_bytes <= before.free_bytes)
    delta = before.free_bytes - after.free_bytes;
  else
    ++n_negative_;
  measured_[idx(category)] += delta;
  requested_[idx(category)] += requested_bytes;
  return delta;
}

uint64_t DeviceMemoryAccounting::measure_release(MemCategory category, uint64_t requested_bytes,
                                                 const std::function<void()>& release) {
  const DeviceMemInfo before = source_.query();
  release();
  const DeviceMemInfo after = source_.query();
  uint64_t delta = 0;
  if (after.free_bytes >= before.free_bytes)
    delta = after.free_bytes - before.free_bytes;
  else
    ++n_negative_;
  uint64_t& m = measured_[idx(category)];
  uint64_t& r = requested_[idx(category)];
  m = delta > m ? 0 : m - delta;
  r = requested_bytes > r ? 0 : r - requested_bytes;
  return delta;
}

uint64_t DeviceMemoryAccounting::measured(MemCategory category) const { return measured_[idx(category)]; }
uint64_t DeviceMemoryAccounting::requested(MemCategory category) const { return requested_[idx(category)]; }

uint64_t DeviceMemoryAccounting::measured_total() const {
  uint64_t sum = 0;
  for (uint64_t m : measured_) sum += m;
  return sum;
}

int64_t DeviceMemoryAccounting::used_since_baseline() {
  const DeviceMemInfo now = source_.query();
  return static_cast<int64_t>(baseline_.free_bytes) - static_cast<int64_t>(now.free_bytes);
}

std::string DeviceMemoryAccounting::summary() const {
  std::string out;
  for (int c = 0; c < kNumMemCategories; ++c) {
    if (c) out += ", ";
    out += str_cat(mem_category_name(static_cast<MemCategory>(c)), " ", gib(measured_[c]), " (asked ",
                   gib(requested_[c]), ")");
  }
  return out;
}

uint64_t kv_cache_budget_bytes(const UtilizationBudgetInput& in) {
  const double u = in.gpu_memory_utilization;
  if (!(u > 0.0 && u <= 1.0))
    fail(ErrorCode::kInvalidArgument, "--gpu-memory-utilization ", u,
         " must be in (0, 1]: the fraction of each device's total memory this instance may use");
  const uint64_t total = in.at_startup.total_bytes;
  const auto allowed = static_cast<uint64_t>(std::floor(static_cast<double>(total) * u));
  if (in.at_startup.free_bytes < allowed)
    fail(ErrorCode::kOutOfMemory, "device ", in.device, ": free memory at startup (", gib(in.at_startup.free_bytes),
         " of ", gib(total), ") is less than --gpu-memory-utilization ", u, " × total = ", gib(allowed),
         "; lower --gpu-memory-utilization or stop the other processes using this device");
  if (in.held_bytes >= allowed)
    fail(ErrorCode::kOutOfMemory, "device ", in.device, ": weights, workspace and runtime already take ",
         gib(in.held_bytes), " of the ", gib(allowed), " that --gpu-memory-utilization ", u,
         " allows; nothing is left for the KV cache. Raise --gpu-memory-utilization, use more tensor-parallel "
         "ranks (-tp) or lower --max-num-batched-tokens");
  return allowed - in.held_bytes;
}

uint64_t gpu_rank_memory_bytes(double u, const DeviceMemInfo& at_startup, int n_ranks_on_device, int device) {
  if (n_ranks_on_device < 1)
    fail(ErrorCode::kInvalidArgument, "device ", device, ": ", n_ranks_on_device, " ranks on it; at least 1");
  UtilizationBudgetInput in;
  in.gpu_memory_utilization = u;
  in.at_startup = at_startup;
  in.held_bytes = 0;
  in.device = device;
  // The checks of the rule (u in (0, 1], free >= total × u) and floor(total × u).
  const uint64_t allowed = kv_cache_budget_bytes(in);
  return allowed / static_cast<uint64_t>(n_ranks_on_device);
}

std::string plan_agreement_text(uint64_t predicted, uint64_t measured, double tolerance) {
  if (predicted == measured) return "as planned";
  const double d = plan_disagreement(predicted, measured);
  const double sign = measured >= predicted ? 1.0 : -1.0;
  char buf[96];
  if (d <= tolerance)
    std::snprintf(buf, sizeof buf, "within %.1f%% of plan (%+.2f%%)", tolerance * 100.0, sign * d * 100.0);
  else if (predicted == 0)
    std::snprintf(buf, sizeof buf, "DIFFERS from plan (planned 0)");
  else
    std::snprintf(buf, sizeof buf, "DIFFERS from plan by %+.2f%%", sign * d * 100.0);
  return buf;
}

double plan_disagreement(uint64_t predicted, uint64_t measured) {
  if (predicted == 0) return measured == 0 ? 0.0 : INFINITY;
  const double diff = std::fabs(static_cast<double>(measured) - static_cast<double>(predicted));
  return diff / static_cast<double>(predicted);
}

}  // namespace shardlm::backend
