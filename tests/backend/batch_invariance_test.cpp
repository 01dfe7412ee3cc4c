// Batch invariance: a row computed alone, among 3, 5, 16 and 64 rows (at
// different places in the batch) gives bit-identical output, on every
// kernel path this machine runs: backend/cpu/rows_gemm.h per ISA (scalar, AVX2,
// AVX-512), backend::matmul in batch-invariant mode (where 16 and 64 rows
// would otherwise take the packed GEMM), and paged attention whose
// context split would otherwise follow the number of rows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/cpu_isa.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/packed_gemm.h"
#include "backend/cpu/rows_gemm.h"
#include "random_inputs.h"

namespace shardlm::backend {
namespace {

using test_inputs::random_f32;
using test_inputs::random_weights;

std::vector<CpuIsa> isas_here() { return test_inputs::isas_up_to(detected_cpu_isa()); }

const int kBatches[] = {3, 5, 16, 64};

// The probe row's output, computed by f(x, n, y), alone and at position
// (n - 1) * 2 / 3 of a batch of n random rows.
template <class F>
void expect_invariant(const F& f, int64_t k, int64_t m, std::mt19937& rng, const std::string& what) {
  const std::vector<float> probe = random_f32(k, rng);
  std::vector<float> alone(static_cast<size_t>(m));
  f(probe.data(), 1, alone.data());
  for (int n : kBatches) {
    std::vector<float> x = random_f32(int64_t{n} * k, rng);
    const int64_t at = (n - 1) * 2 / 3;
    std::memcpy(x.data() + at * k, probe.data(), static_cast<size_t>(k) * sizeof(float));
    std::vector<float> y(static_cast<size_t>(n) * m);
    f(x.data(), n, y.data());
    ASSERT_EQ(std::memcmp(y.data() + at * m, alone.data(), static_cast<size_t>(m) * sizeof(float)), 0)
        << what << ": row " << at << " of " << n << " differs from the row alone";
  }
}

// Every ISA's kernel: invariant, and equal to the scalar reference within
// f32 rounding; shapes with a k tail (k % 16 != 0) and an m tail (m % 8 != 0).
TEST(RowsGemm, EveryIsaIsBatchInvariantAndMatchesReference) {
  std::mt19937 rng(7);
  for (CpuIsa isa : isas_here())
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16})
      // k = 8000: the bf16 pair order splits x in chunks of 32 such rows
      // (rows_gemm_impl.h kSplitFloats), so a batch of 64 spans two.
      for (auto [m, k] : {std::pair<int64_t, int64_t>{37, 203}, {64, 896}, {13, 7}, {9, 8000}}) {
        const std::vector<uint8_t> w = random_weights(dtype, m * k, rng);
        const std::string what = std::string(cpu_isa_name(isa)) + " " + dtype_safetensors_name(dtype) + " m" +
                                 std::to_string(m) + " k" + std::to_string(k);
        expect_invariant([&](const float* x, int64_t n, float* y) { rows_gemm(isa, x, n, w.data(), dtype, m, k, y); },
                         k, m, rng, what);
        const int64_t n = 7;
        const std::vector<float> x = random_f32(n * k, rng);
        std::vector<float> got(static_cast<size_t>(n * m)), want(got.size());
        rows_gemm(isa, x.data(), n, w.data(), dtype, m, k, got.data());
        ref::matmul(x.data(), n, MatrixView{w.data(), dtype, m, k}, nullptr, want.data());
        for (size_t i = 0; i < got.size(); ++i)
          ASSERT_NEAR(got[i], want[i], 1e-4f * std::sqrt(static_cast<float>(k)) * (1 + std::fabs(want[i])))
              << what << " element " << i;
      }
}

// Every ISA's kernel reads no element outside a row's own [k]: the weight
// rows and token rows on either side of the checked ones are all NaN, so a
// tail load, or the pair order's load 2 bytes before a bf16 row (rows_gemm.h),
// that let one in would turn the checked outputs to NaN. k around the vector
// widths (16, 32) and below them; m and n leave tails of the 4- and 8-row tiles.
TEST(RowsGemm, ARowsSumReadsNothingOutsideItsRows) {
  std::mt19937 rng(13);
  const float nan = std::nanf("");
  for (CpuIsa isa : isas_here())
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16})
      for (int64_t k : {1, 7, 15, 16, 17, 31, 33, 47, 63, 65, 203})
        for (int64_t n : {1, 5, 16}) {
          const int64_t m = 13;
          std::vector<uint8_t> w = random_weights(dtype, m * k, rng);
          std::vector<float> x = random_f32(n * k, rng);
          for (int64_t j = 1; j < m; j += 2)
            for (int64_t i = 0; i < k; ++i) store_from_f32(w.data(), dtype, static_cast<size_t>(j * k + i), nan);
          for (int64_t t = 1; t < n; t += 2)
            for (int64_t i = 0; i < k; ++i) x[static_cast<size_t>(t * k + i)] = nan;
          std::vector<float> got(static_cast<size_t>(n * m)), want(got.size());
          rows_gemm(isa, x.data(), n, w.data(), dtype, m, k, got.data());
          ref::matmul(x.data(), n, MatrixView{w.data(), dtype, m, k}, nullptr, want.data());
          for (int64_t t = 0; t < n; t += 2)
            for (int64_t j = 0; j < m; j += 2) {
              const size_t e = static_cast<size_t>(t * m + j);
              ASSERT_NEAR(got[e], want[e], 1e-4f * std::sqrt(static_cast<float>(k)) * (1 + std::fabs(want[e])))
                  << cpu_isa_name(isa) << " " << dtype_safetensors_name(dtype) << " k" << k << " n" << n << " row "
                  << t << " column " << j;
            }
        }
}

// backend::matmul, with bias, in batch-invariant mode: 16 and 64 rows stay
// on the rows kernel (off, they take the packed GEMM where the build has one:
// see MatmulPath; a build without -march=native, the sanitizer pass's, has none).
TEST(BatchInvariantMatmul, EveryRowCountTakesTheRowsKernel) {
  set_batch_invariant(false);
  EXPECT_EQ(matmul_path(1, DType::kBF16), MatmulPath::kRows);
  if (packed_matmul_available(DType::kBF16))
    EXPECT_NE(matmul_path(64, DType::kBF16), MatmulPath::kRows);
  else
    EXPECT_EQ(matmul_path(64, DType::kBF16), MatmulPath::kRows);
  set_batch_invariant(true);
  EXPECT_EQ(matmul_path(64, DType::kBF16), MatmulPath::kRows);
  EXPECT_EQ(matmul_path(512, DType::kF32), MatmulPath::kRows);
  std::mt19937 rng(11);
  const int64_t m = 150, k = 320;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    const std::vector<uint8_t> w = random_weights(dtype, m * k, rng), b = random_weights(dtype, m, rng);
    const MatrixView wv{w.data(), dtype, m, k};
    const VectorView bv{b.data(), dtype, m};
    expect_invariant([&](const float* x, int64_t n, float* y) { matmul(x, n, wv, &bv, y); }, k, m, rng,
                     dtype_safetensors_name(dtype));
  }
  set_batch_invariant(false);
}

// Decode rows attending over their caches: the probe sequence alone, then
// among others (whose contexts differ), with a context long enough that a
// lone row's attention is split across threads.
TEST(BatchInvariantAttention, ARowsAttentionIgnoresTheOtherRows) {
  CpuBackend backend;
  ASSERT_TRUE(backend.set_batch_invariant(true));
  EXPECT_TRUE(backend.batch_invariant());
  std::mt19937 rng(5);
  const int64_t hd = 64, block = 16, nkv = 2, n_q = 4, ctx = 700;
  const int64_t blocks_per_seq = (ctx + block) / block + 1, n_seqs_max = 64, n_blocks = blocks_per_seq * n_seqs_max;
  std::vector<uint16_t> kbuf(static_cast<size_t>(n_blocks * block * nkv * hd)), vbuf(kbuf.size());
  for (size_t i = 0; i < kbuf.size(); ++i) {
    store_from_f32(kbuf.data(), DType::kBF16, i, std::normal_distribution<float>()(rng));
    store_from_f32(vbuf.data(), DType::kBF16, i, std::normal_distribution<float>()(rng));
  }
  const KvLayerView cache{kbuf.data(), vbuf.data(), DType::kBF16, n_blocks, block, nkv, hd};
  std::vector<int32_t> tables(static_cast<size_t>(n_blocks));
  for (int64_t i = 0; i < n_blocks; ++i) tables[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  const AttentionHeads heads{n_q, 0, 0, n_q / nkv};
  const int64_t row_elems = n_q * hd;
  const std::vector<float> probe_q = random_f32(row_elems, rng);
  // Sequence s uses blocks [s * blocks_per_seq, ...); the probe is sequence 0 with ctx cached tokens.
  auto run = [&](int64_t n, std::vector<float>& out) {
    std::vector<AttentionSeq> seqs;
    std::vector<float> q = random_f32(n * row_elems, rng);
    const int64_t at = (n - 1) * 2 / 3;
    std::memcpy(q.data() + at * row_elems, probe_q.data(), static_cast<size_t>(row_elems) * sizeof(float));
    for (int64_t s = 0; s < n; ++s) {
      const int64_t seq_blocks = (s == at ? 0 : s + 1) * blocks_per_seq % n_blocks;
      const int64_t past = s == at ? ctx : 50 + (37 * s) % 600;
      seqs.push_back({s, 1, past, tables.data() + seq_blocks, blocks_per_seq});
    }
    std::vector<float> o(static_cast<size_t>(n * row_elems));
    paged_attention(q.data(), cache, seqs.data(), n, heads, o.data());
    out.assign(o.begin() + at * row_elems, o.begin() + (at + 1) * row_elems);
  };
  std::vector<float> alone, among;
  run(1, alone);
  for (int n : kBatches) {
    run(n, among);
    ASSERT_EQ(std::memcmp(among.data(), alone.data(), alone.size() * sizeof(float)), 0)
        << "attention of the probe row among " << n << " rows differs from the row alone";
  }
  backend.set_batch_invariant(false);
}

// SHARDLM_ISA (a ctest run sets it to scalar and avx2): the active kernel
// is the one asked for, the backend's name says so, and matmul still
// matches the reference.
TEST(CpuIsaChoice, TheVariableChoosesTheKernel) {
  const char* env = std::getenv("SHARDLM_ISA");
  if (!env) GTEST_SKIP() << "SHARDLM_ISA unset (the ctest runs with it set)";
  if (std::string(env) == "avx2" && detected_cpu_isa() == CpuIsa::kScalar) GTEST_SKIP() << "no AVX2 here";
  EXPECT_STREQ(cpu_isa_name(active_cpu_isa()), env);
  EXPECT_NE(CpuBackend(1).name().find(env), std::string::npos) << CpuBackend(1).name();
  std::mt19937 rng(3);
  const int64_t m = 40, k = 100, n = 4;
  const std::vector<uint8_t> w = random_weights(DType::kBF16, m * k, rng);
  const std::vector<float> x = random_f32(n * k, rng);
  std::vector<float> got(static_cast<size_t>(n * m)), want(got.size());
  matmul(x.data(), n, MatrixView{w.data(), DType::kBF16, m, k}, nullptr, got.data());
  ref::matmul(x.data(), n, MatrixView{w.data(), DType::kBF16, m, k}, nullptr, want.data());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 2e-3f * (1 + std::fabs(want[i])));
}

TEST(CpuIsaChoice, DetectionNamesAPathAndAModel) {
  EXPECT_FALSE(cpu_model_name().empty());
  const std::string name = cpu_isa_name(detected_cpu_isa());
  EXPECT_TRUE(name == "scalar" || name == "avx2" || name == "avx512" || name == "avx512bf16") << name;
}

}  // namespace
}  // namespace shardlm::backend
