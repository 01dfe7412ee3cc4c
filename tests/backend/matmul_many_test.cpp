// Grouped matmuls (issue 28): rows_gemm_many, backend::matmul_many and
// Backend::matmul_many give each part bit for bit what a call of its own
// gives, on every rows kernel this CPU runs: uneven m (tails of the row
// blocks and of the chunks), k with and without a lane tail, n = 1..31 (the
// block-major and the chunked orders), biases, and the cases that fall back
// to one call per part (mixed dtypes, the packed GEMM at 32+ rows, a
// quantized Linear). ctest also runs it under SHARDLM_ISA=avx2 and scalar.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/cpu_isa.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/rows_gemm.h"
#include "core/error.h"
#include "random_inputs.h"

namespace shardlm::backend {
namespace {

using test_inputs::random_f32;
using test_inputs::random_weights;

std::vector<CpuIsa> isas_here() { return test_inputs::isas_up_to(active_cpu_isa()); }

// Bit-equal, with the first differing element named.
void expect_bits(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", alone " << want[i];
      return;
    }
}

// Part shapes: q/k/v-like (one large, two small with tails), more than
// kChunkBlocks blocks, a matrix smaller than one block, one of 0 rows.
const std::vector<std::vector<int64_t>> kPartRows = {{100, 13, 13}, {37, 5}, {3}, {64, 0, 9}};
// k: whole vectors, a lane tail, and rows past kAheadMaxRowBytes in f32.
const int64_t kCols[] = {64, 67, 1100};

TEST(RowsGemmMany, EachPartEqualsItsOwnCallOnEveryIsa) {
  std::mt19937 rng(28);
  for (CpuIsa isa : isas_here()) {
    for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
      for (int64_t k : kCols) {
        for (const std::vector<int64_t>& ms : kPartRows) {
          std::vector<std::vector<uint8_t>> w;
          for (int64_t m : ms) w.push_back(random_weights(dtype, m * k, rng));
          for (int64_t n = 1; n <= 31; n += (k > 100 ? 5 : 1)) {
            const std::vector<float> x = random_f32(n * k, rng);
            std::vector<std::vector<float>> alone, grouped;
            std::vector<RowsGemmPart> parts;
            for (size_t p = 0; p < ms.size(); ++p) {
              alone.emplace_back(static_cast<size_t>(n * ms[p]));
              grouped.emplace_back(static_cast<size_t>(n * ms[p]), -7.0f);
              rows_gemm(isa, x.data(), n, w[p].data(), dtype, ms[p], k, alone[p].data());
            }
            for (size_t p = 0; p < ms.size(); ++p) parts.push_back({w[p].data(), ms[p], grouped[p].data()});
            rows_gemm_many(isa, x.data(), n, k, dtype, parts.data(), static_cast<int64_t>(parts.size()));
            for (size_t p = 0; p < ms.size(); ++p)
              expect_bits(grouped[p], alone[p],
                          std::string(cpu_isa_name(isa)) + " " + dtype_safetensors_name(dtype) + " k=" +
                              std::to_string(k) + " n=" + std::to_string(n) + " part " + std::to_string(p) + " of " +
                              std::to_string(ms.size()) + " (m=" + std::to_string(ms[p]) + ")");
          }
        }
      }
    }
  }
}

TEST(RowsGemmMany, RefusesMorePartsThanItHolds) {
  float x = 1.0f, y[kRowsGemmMaxParts + 1];
  const float w = 1.0f;
  std::vector<RowsGemmPart> parts;
  for (int64_t p = 0; p <= kRowsGemmMaxParts; ++p) parts.push_back({&w, 1, &y[p]});
  EXPECT_THROW(rows_gemm_many(active_cpu_isa(), &x, 1, 1, DType::kF32, parts.data(), kRowsGemmMaxParts + 1), Error);
}

// backend::matmul_many against one matmul per part, biases included. `dtypes`
// gives each part's weight dtype (a mix falls back to one call per part).
void expect_ops_many_equal(int64_t n, int64_t k, const std::vector<int64_t>& ms, const std::vector<DType>& dtypes,
                           std::mt19937& rng, const std::string& what) {
  std::vector<std::vector<uint8_t>> w, b;
  std::vector<VectorView> bias(ms.size());
  std::vector<std::vector<float>> alone, grouped;
  std::vector<MatmulPart> parts;
  const std::vector<float> x = random_f32(n * k, rng);
  for (size_t p = 0; p < ms.size(); ++p) {
    w.push_back(random_weights(dtypes[p], ms[p] * k, rng));
    b.push_back(random_weights(dtypes[p], ms[p], rng));
    bias[p] = {b[p].data(), dtypes[p], ms[p]};
    alone.emplace_back(static_cast<size_t>(n * ms[p]));
    grouped.emplace_back(static_cast<size_t>(n * ms[p]), -7.0f);
    const VectorView* bp = p % 2 == 0 ? &bias[p] : nullptr;  // every other part with a bias
    const MatrixView wv{w[p].data(), dtypes[p], ms[p], k};
    matmul(x.data(), n, wv, bp, alone[p].data());
    parts.push_back({wv, bp, grouped[p].data()});
  }
  matmul_many(x.data(), n, parts.data(), static_cast<int64_t>(parts.size()));
  for (size_t p = 0; p < ms.size(); ++p)
    expect_bits(grouped[p], alone[p], what + " n=" + std::to_string(n) + " part " + std::to_string(p));
}

TEST(MatmulMany, EqualsOneMatmulPerPartWithBiases) {
  std::mt19937 rng(7);
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32})
    for (int64_t n : {1, 2, 5, 7, 16, 31, 32, 40})  // 32 and 40: the packed GEMM where this CPU has it
      expect_ops_many_equal(n, 96, {72, 24, 24}, {dtype, dtype, dtype}, rng, dtype_safetensors_name(dtype));
}

TEST(MatmulMany, MixedDtypesFallBackToOneCallEach) {
  std::mt19937 rng(8);
  for (int64_t n : {1, 9, 31})
    expect_ops_many_equal(n, 80, {40, 12, 12}, {DType::kBF16, DType::kF32, DType::kBF16}, rng, "bf16+f32");
}

TEST(MatmulMany, BatchInvariantModeGroupsEveryRowCount) {
  std::mt19937 rng(9);
  set_batch_invariant(true);
  for (int64_t n : {33, 64}) expect_ops_many_equal(n, 64, {48, 16}, {DType::kBF16, DType::kBF16}, rng, "invariant");
  set_batch_invariant(false);
}

// Through the backend: dense Linears with biases, and a quantized (FP8
// per-tensor) one among them, which sends the call to one matmul per output.
TEST(BackendMatmulMany, EqualsOneMatmulPerOutput) {
  std::mt19937 rng(10);
  CpuBackend cpu;
  const int64_t k = 64;
  auto dense = [&](int64_t m, bool with_bias) {
    Linear l;
    l.weight = Tensor::host(DType::kBF16, {m, k});
    const std::vector<uint8_t> w = random_weights(DType::kBF16, m * k, rng);
    std::memcpy(l.weight.data(), w.data(), w.size());
    if (with_bias) {
      l.bias = Tensor::host(DType::kBF16, {m});
      const std::vector<uint8_t> b = random_weights(DType::kBF16, m, rng);
      std::memcpy(l.bias.data(), b.data(), b.size());
    }
    return l;
  };
  Linear fp8;
  fp8.weight = Tensor::host(DType::kF8E4M3, {24, k});
  for (int64_t i = 0; i < 24 * k; ++i)  // no NaN pattern (S.1111.111): at most S.0111.111
    static_cast<uint8_t*>(fp8.weight.data())[i] = static_cast<uint8_t>((rng() & 0x80) | (rng() & 0x3f));
  fp8.quant.scheme = WeightScheme::kFp8;
  fp8.quant.bits = 8;
  fp8.quant.n_out = 24;
  fp8.quant.n_in = k;
  fp8.quant.block_n = 24;
  fp8.quant.block_k = k;
  fp8.quant.scales = Tensor::host(DType::kF32, {1, 1});
  *static_cast<float*>(fp8.quant.scales.data()) = 0.5f;
  const Linear q = dense(40, true), kk = dense(8, true), v = dense(8, false);
  for (const std::vector<const Linear*>& ws :
       {std::vector<const Linear*>{&q, &kk, &v}, std::vector<const Linear*>{&q, &fp8, &v}}) {
    for (int64_t n : {1, 6, 17}) {
      Tensor x = Tensor::host(DType::kF32, {n, k});
      const std::vector<float> xv = random_f32(n * k, rng);
      std::memcpy(x.data(), xv.data(), xv.size() * sizeof(float));
      std::vector<Tensor> alone, grouped;
      std::vector<MatmulOut> outs;
      for (const Linear* w : ws) {
        alone.push_back(Tensor::host(DType::kF32, {n, w->out_features()}));
        grouped.push_back(Tensor::host(DType::kF32, {n, w->out_features()}));
        cpu.matmul(x, *w, alone.back());
      }
      for (size_t p = 0; p < ws.size(); ++p) outs.push_back({ws[p], &grouped[p]});
      cpu.matmul_many(x, outs);
      for (size_t p = 0; p < ws.size(); ++p) {
        const float* a = static_cast<const float*>(alone[p].data());
        const float* g = static_cast<const float*>(grouped[p].data());
        expect_bits(std::vector<float>(g, g + alone[p].numel()), std::vector<float>(a, a + alone[p].numel()),
                    std::string(ws[1] == &fp8 ? "with fp8" : "dense") + " n=" + std::to_string(n) + " output " +
                        std::to_string(p));
      }
    }
  }
  // The shapes are checked for every output before any runs.
  Tensor x = Tensor::host(DType::kF32, {2, k}), y_bad = Tensor::host(DType::kF32, {2, 7});
  Tensor y = Tensor::host(DType::kF32, {2, 40});
  for (int64_t i = 0; i < y.numel(); ++i) static_cast<float*>(y.data())[i] = -7.0f;
  const MatmulOut bad[] = {{&q, &y}, {&kk, &y_bad}};
  EXPECT_THROW(cpu.matmul_many(x, bad), Error);
  EXPECT_EQ(static_cast<const float*>(y.data())[0], -7.0f) << "the first output ran before the second was checked";
}

}  // namespace
}  // namespace shardlm::backend
