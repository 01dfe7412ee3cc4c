// Which kernel each matmul took, counted where the CPU backend dispatches
// (never recomputed from the rules that choose it), so a benchmark can say
// "pp512's 896×4864 matmuls ran on packed/avx512" and a test can check that
// forcing SHARDLM_ISA, SHARDLM_AMX=off or bf16 activations moved them.
//
// Off unless SHARDLM_KERNEL_REPORT is set (read once): "1" prints the table
// to stderr when the process exits; any other value except "0" is a file the
// table is appended to (one block per process, so MPI ranks may share it).
// Off, a dispatch costs one relaxed atomic load; on, a mutex and a map
// update per matmul (a matmul is microseconds; the count is not).
//
// The table: one row per (path, weights, rows bucket, m, k):
//   path        the kernel: rows/avx512, rows/avx2, rows/scalar (the GEMV
//               family, backend/cpu/rows_gemm.h), packed/avx512,
//               packed/avx2 (backend/cpu/packed_gemm.h), packed/amx,
//               bf16dot/avx512bf16, int8/vnni (AWQ/GPTQ under int8
//               activations), quant/avx512, quant/avx2, quant/scalar (AWQ/GPTQ
//               f32 activations), fp8rows/simd, fp8rows/scalar
//   weights     bf16, f32, f16, awq-int4, gptq-int4, gptq-int8, fp8
//   rows        the call's n (tokens) as a power-of-two range: 1, 2, 3-4, 5-8, ...
//   m×k         output rows × inputs of the matrix (a rank's shard)
//   calls       how many times
// Internal to the backend layer (tests read the counts through this header).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/op_args.h"
#include "core/dtype.h"

namespace shardlm::backend {

struct KernelCount {
  std::string path;
  std::string weights;
  int64_t rows_lo = 0, rows_hi = 0;  // the rows bucket [lo, hi]
  int64_t m = 0, k = 0;
  int64_t calls = 0;
};

namespace kernel_report_detail {
extern std::atomic<int> g_state;  // -1: environment not read yet; 0 off; 1 on
int init_from_env();
void record(const char* path, const char* weights, int64_t n, int64_t m, int64_t k);
}  // namespace kernel_report_detail

// Whether dispatches are being counted (SHARDLM_KERNEL_REPORT, or set_kernel_report).
inline bool kernel_report_on() {
  int s = kernel_report_detail::g_state.load(std::memory_order_relaxed);
  if (s < 0) s = kernel_report_detail::init_from_env();
  return s > 0;
}

// Counts one call of kernel `path` on a [m, k] matrix of `weights` with n
// rows of x. Both names are string literals (kept as they are).
inline void count_kernel(const char* path, const char* weights, int64_t n, int64_t m, int64_t k) {
  if (kernel_report_on()) kernel_report_detail::record(path, weights, n, m, k);
}

// Turns counting on or off (tests); counts already made stay until reset.
void set_kernel_report(bool on);
void reset_kernel_report();
// The counts so far, sorted by path, weights, rows, m, k.
std::vector<KernelCount> kernel_report_counts();
// The table as printed at exit: a header naming the CPU, the active ISA
// and AMX, then one line per KernelCount (whitespace-separated columns).
std::string kernel_report_table();

// The weights column's name of a dense dtype ("bf16", "f32", "f16") and of a
// quantized scheme ("awq-int4", "gptq-int4", "gptq-int8", "fp8").
const char* kernel_weights_name(DType dtype);
const char* kernel_weights_name(WeightScheme scheme, int bits);

}  // namespace shardlm::backend
