// backend/cpu/kernel_report.h on its own: each dense matmul is counted once,
// on the kernel matmul_path() names (with the ISA active_cpu_isa() gives its
// rows kernel), in the right rows bucket and shape. ctest also runs it under
// SHARDLM_ISA=avx2 and scalar, and SHARDLM_AMX=off.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "backend/cpu/cpu_isa.h"
#include "backend/cpu/kernel_report.h"
#include "backend/cpu/ops.h"

namespace shardlm::backend {
namespace {

std::string expected_path(int64_t n, DType dtype) {
  switch (matmul_path(n, dtype)) {
    case MatmulPath::kRows: {
      const CpuIsa isa = active_cpu_isa();
      return std::string("rows/") + (isa == CpuIsa::kAvx512Bf16 ? "avx512" : cpu_isa_name(isa));
    }
    case MatmulPath::kPacked: return "packed/";  // avx512 or avx2: the build's -march
    case MatmulPath::kAmx: return "packed/amx";
    case MatmulPath::kBf16Dot: return "bf16dot/avx512bf16";
  }
  return "?";
}

TEST(KernelReportCounts, EachMatmulOnceOnTheKernelItTook) {
  set_kernel_report(true);
  const int64_t m = 48, k = 64;
  std::vector<float> x(128 * k, 0.5f), y(128 * m);
  std::vector<uint16_t> w16(m * k, 0x3f80);  // 1.0 in bf16 and 1.875 in f16: any value will do
  std::vector<float> w32(m * k, 1.0f);
  struct Case {
    int64_t n, lo, hi;
  };
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    const void* data = dtype == DType::kF32 ? static_cast<const void*>(w32.data()) : w16.data();
    for (const Case& c : {Case{1, 1, 1}, Case{2, 2, 2}, Case{3, 3, 4}, Case{8, 5, 8}, Case{31, 17, 32},
                          Case{32, 17, 32}, Case{100, 65, 128}}) {
      SCOPED_TRACE(std::string(kernel_weights_name(dtype)) + " n=" + std::to_string(c.n));
      reset_kernel_report();
      matmul(x.data(), c.n, MatrixView{data, dtype, m, k}, nullptr, y.data());
      const std::vector<KernelCount> counts = kernel_report_counts();
      ASSERT_EQ(counts.size(), 1u);
      const KernelCount& r = counts[0];
      const std::string want = expected_path(c.n, dtype);
      EXPECT_EQ(r.path.substr(0, want.size()), want);
      if (want == "packed/") EXPECT_NE(r.path, "packed/amx");
      EXPECT_EQ(r.weights, kernel_weights_name(dtype));
      EXPECT_EQ(r.rows_lo, c.lo);
      EXPECT_EQ(r.rows_hi, c.hi);
      EXPECT_EQ(r.m, m);
      EXPECT_EQ(r.k, k);
      EXPECT_EQ(r.calls, 1);
    }
  }
  // Off: nothing is counted.
  set_kernel_report(false);
  reset_kernel_report();
  matmul(x.data(), 1, MatrixView{w32.data(), DType::kF32, m, k}, nullptr, y.data());
  EXPECT_TRUE(kernel_report_counts().empty());
}

}  // namespace
}  // namespace shardlm::backend
