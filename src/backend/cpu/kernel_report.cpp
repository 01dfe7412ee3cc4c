#include "backend/cpu/kernel_report.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>

#include "backend/cpu/amx_gemm.h"
#include "core/cpu_isa.h"

namespace shardlm::backend {

namespace kernel_report_detail {
std::atomic<int> g_state{-1};
}  // namespace kernel_report_detail

namespace {

// (path, weights, rows bucket's upper end, m, k) → calls.
using Key = std::tuple<std::string, std::string, int64_t, int64_t, int64_t>;

struct Counts {
  std::mutex mu;
  std::map<Key, int64_t> calls;
};

// Never destroyed: the table is printed by an atexit handler, which may run
// after other statics are gone, and OpenMP workers may still count.
Counts& counts() {
  static Counts* c = new Counts;
  return *c;
}

// The destination named by SHARDLM_KERNEL_REPORT ("" when unset or "0").
std::string& destination() {
  static std::string* d = new std::string;
  return *d;
}

// n = 1 → 1; otherwise the smallest power of two >= n, the bucket (hi/2, hi].
int64_t bucket_hi(int64_t n) {
  int64_t hi = 1;
  while (hi < n) hi *= 2;
  return hi;
}

void print_at_exit() {
  const std::string table = kernel_report_table();
  const std::string& dest = destination();
  if (dest == "1") {
    std::fwrite(table.data(), 1, table.size(), stderr);
    return;
  }
  // One write of the whole block, in append mode: processes sharing the file
  // (MPI ranks) do not interleave their lines.
  std::FILE* f = std::fopen(dest.c_str(), "a");
  if (!f) {
    std::fprintf(stderr, "SHARDLM_KERNEL_REPORT=%s: cannot open the file for appending: %s\n", dest.c_str(),
                 std::strerror(errno));
    return;
  }
  std::fwrite(table.data(), 1, table.size(), f);
  std::fclose(f);
}

}  // namespace

namespace kernel_report_detail {

int init_from_env() {
  static const int state = [] {
    const char* env = std::getenv("SHARDLM_KERNEL_REPORT");
    if (!env || !*env || std::strcmp(env, "0") == 0) return 0;
    destination() = env;
    counts();  // made before the handler is registered
    std::atexit(print_at_exit);
    return 1;
  }();
  // set_kernel_report may have run first: keep its choice.
  int expected = -1;
  g_state.compare_exchange_strong(expected, state, std::memory_order_relaxed);
  return g_state.load(std::memory_order_relaxed);
}

void record(const char* path, const char* weights, int64_t n, int64_t m, int64_t k) {
  Counts& c = counts();
  std::lock_guard<std::mutex> lock(c.mu);
  ++c.calls[Key{path, weights, bucket_hi(n), m, k}];
}

}  // namespace kernel_report_detail

void set_kernel_report(bool on) { kernel_report_detail::g_state.store(on ? 1 : 0, std::memory_order_relaxed); }

void reset_kernel_report() {
  Counts& c = counts();
  std::lock_guard<std::mutex> lock(c.mu);
  c.calls.clear();
}

std::vector<KernelCount> kernel_report_counts() {
  Counts& c = counts();
  std::lock_guard<std::mutex> lock(c.mu);
  std::vector<KernelCount> out;
  out.reserve(c.calls.size());
  for (const auto& [key, calls] : c.calls) {
    KernelCount r;
    r.path = std::get<0>(key);
    r.weights = std::get<1>(key);
    r.rows_hi = std::get<2>(key);
    r.rows_lo = r.rows_hi == 1 ? 1 : r.rows_hi / 2 + 1;
    r.m = std::get<3>(key);
    r.k = std::get<4>(key);
    r.calls = calls;
    out.push_back(std::move(r));
  }
  return out;
}

std::string kernel_report_table() {
  std::ostringstream o;
  o << "kernel report (pid " << getpid() << "): cpu " << cpu_model_name() << "; isa "
    << cpu_isa_name(active_cpu_isa()) << " (cpu has " << cpu_isa_name(detected_cpu_isa()) << "); amx "
    << (amx_available() ? "on" : "off") << "\n";
  char line[160];
  std::snprintf(line, sizeof line, "%-20s %-10s %-10s %-14s %s\n", "path", "weights", "rows", "mxk", "calls");
  o << line;
  for (const KernelCount& r : kernel_report_counts()) {
    std::string rows = std::to_string(r.rows_hi);
    if (r.rows_lo != r.rows_hi) rows = std::to_string(r.rows_lo) + "-" + rows;
    const std::string mk = std::to_string(r.m) + "x" + std::to_string(r.k);
    std::snprintf(line, sizeof line, "%-20s %-10s %-10s %-14s %lld\n", r.path.c_str(), r.weights.c_str(), rows.c_str(),
                  mk.c_str(), static_cast<long long>(r.calls));
    o << line;
  }
  o << "end of kernel report\n";
  return o.str();
}

const char* kernel_weights_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kF8E4M3: return "fp8";
    case DType::kI32: return "i32";
    case DType::kI8: return "i8";
    case DType::kU8: return "u8";
  }
  return "?";
}

const char* kernel_weights_name(WeightScheme scheme, int bits) {
  switch (scheme) {
    case WeightScheme::kAwq: return "awq-int4";
    case WeightScheme::kGptq: return bits == 4 ? "gptq-int4" : "gptq-int8";
    case WeightScheme::kFp8: return "fp8";
    case WeightScheme::kDense: return "dense";
  }
  return "?";
}

}  // namespace shardlm::backend
