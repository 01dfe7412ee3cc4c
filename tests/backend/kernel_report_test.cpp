// backend/cpu/kernel_report.h on its own: each dense matmul is counted once,
// on the kernel matmul_path() names (with the ISA active_cpu_isa() gives its
// rows kernel), in the right rows bucket and shape. ctest also runs it under
// SHARDLM_ISA=avx2 and scalar, and SHARDLM_AMX=off.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/cpu_isa.h"
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

// A grouped call (backend::matmul_many: q, k, v in one parallel region)
// counts as the matmuls it replaces: one per matrix, with its own shape.
TEST(KernelReportCounts, AGroupedCallCountsEachMatrix) {
  set_kernel_report(true);
  reset_kernel_report();
  const int64_t k = 64;
  std::vector<float> x(4 * k, 0.5f), yq(4 * 48), yk(4 * 16), yv(4 * 16);
  std::vector<uint16_t> wq(48 * k, 0x3f80), wk(16 * k, 0x3f80), wv(16 * k, 0x3f80);
  const MatmulPart parts[] = {{MatrixView{wq.data(), DType::kBF16, 48, k}, nullptr, yq.data()},
                              {MatrixView{wk.data(), DType::kBF16, 16, k}, nullptr, yk.data()},
                              {MatrixView{wv.data(), DType::kBF16, 16, k}, nullptr, yv.data()}};
  matmul_many(x.data(), 4, parts, 3);
  const std::vector<KernelCount> counts = kernel_report_counts();
  set_kernel_report(false);
  ASSERT_EQ(counts.size(), 2u);  // sorted by m: 16 × 64 twice, then 48 × 64 once
  EXPECT_EQ(counts[0].m, 16);
  EXPECT_EQ(counts[0].calls, 2);
  EXPECT_EQ(counts[1].m, 48);
  EXPECT_EQ(counts[1].calls, 1);
  for (const KernelCount& r : counts) {
    EXPECT_EQ(r.path.substr(0, 5), expected_path(4, DType::kBF16).substr(0, 5));
    EXPECT_EQ(r.k, k);
    EXPECT_EQ(r.rows_lo, 3);
    EXPECT_EQ(r.rows_hi, 4);
  }
}

}  // namespace
}  // namespace shardlm::backend
