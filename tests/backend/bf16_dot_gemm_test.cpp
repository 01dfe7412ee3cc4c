// The opt-in bf16-activation matmul (backend/cpu/bf16_dot_gemm.h) against a
// double-precision reference, within bounds derived from the inputs:
//   vs the exact product:      |y − Σ x·w| <= 2^-8 Σ|x·w| + γ_d Σ|x̂·w|
//   vs bf16(x) done here:      |y − Σ x̂·w| <= γ_d Σ|x̂·w|
// where x̂ = bf16(x) rounded to nearest even (a rounding of at most 2^-8 |x|,
// the unit roundoff of bf16's 8-bit significand), the products x̂·w are exact
// in f32, and γ_d = d·u / (1 − d·u), u = 2^-24, bounds f32 summation along
// the d additions an element's sum takes: for the dot kernel (n < 16, or any
// n in batch-invariant mode) 2·⌈k/32⌉ + 4 (two products per 32-wide chunk
// in its lane, then the 4-level tree over 16 lanes); for the token-vector
// kernel k (every product added in turn).
// Then: in batch-invariant mode a row alone or among others is bit-identical,
// and backend::matmul takes the kernel only when asked and the CPU has it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/bf16_dot_gemm.h"
#include "backend/cpu/cpu_backend.h"
#include "core/cpu_isa.h"
#include "backend/cpu/ops.h"
#include "core/error.h"
#include "random_inputs.h"

namespace shardlm::backend {
namespace {

using test_inputs::random_f32;

float bf16_bits_to_f32(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, written here (not the kernel's instruction): finite inputs.
uint16_t f32_to_bf16_rne(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

std::vector<uint16_t> random_bf16(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (auto& h : v) h = f32_to_bf16_rne(dist(rng));
  return v;
}

double gamma_for(int64_t n, int64_t k) {
  const bool dot = n < kBf16TokenVectorMinRows || batch_invariant();
  const double d = dot ? 2.0 * static_cast<double>((k + 31) / 32) + 4.0 : static_cast<double>(k);
  const double u = std::ldexp(1.0, -24);
  return d * u / (1.0 - d * u);
}

bool runs_here() { return bf16_dot_gemm_runs(); }

struct Shape {
  int64_t n, m, k;
};

// n = 1 (decode), 3 (the 8-row tiles), 17 and 64 (prefill tiles, a partial
// token group); k with a tail past the 32-wide chunks (203, 33, 7) and
// without (896); m not a multiple of the 4- or 8-row tiles.
const Shape kShapes[] = {{1, 37, 203},  {3, 37, 203}, {17, 37, 203}, {64, 37, 203}, {1, 13, 7},  {17, 13, 7},
                         {64, 50, 33},  {3, 50, 33},  {1, 64, 896},  {17, 66, 896}, {64, 19, 96}, {5, 4099, 64}};

// Restores the process's choices when a test ends.
struct Restore {
  ~Restore() {
    set_default_dense_activations(DenseActivations::kF32);
    set_batch_invariant(false);
  }
};

// Both kernels: 17 and 64 rows take the token-vector one, and the dot one
// in batch-invariant mode.
TEST(Bf16DotGemm, MatchesTheReferenceWithinTheBf16Bound) {
  if (!runs_here()) GTEST_SKIP() << "bf16 dot kernel cannot run here: " << bf16_dot_gemm_missing();
  Restore restore;
  std::mt19937 rng(2027);
  for (bool invariant : {false, true}) {
    set_batch_invariant(invariant);
    for (const Shape& s : kShapes) {
      const std::vector<float> x = random_f32(s.n * s.k, rng);
      const std::vector<uint16_t> w = random_bf16(s.m * s.k, rng);
      std::vector<float> y(static_cast<size_t>(s.n * s.m), NAN);
      bf16_dot_gemm(x.data(), s.n, w.data(), s.m, s.k, y.data());
      const double g = gamma_for(s.n, s.k), bf16_u = std::ldexp(1.0, -8);
      int64_t differs_from_exact = 0;
      for (int64_t t = 0; t < s.n; ++t)
        for (int64_t j = 0; j < s.m; ++j) {
          double exact = 0, rounded = 0, abs_exact = 0, abs_rounded = 0;
          for (int64_t i = 0; i < s.k; ++i) {
            const double xv = x[static_cast<size_t>(t * s.k + i)];
            const double xr = bf16_bits_to_f32(f32_to_bf16_rne(x[static_cast<size_t>(t * s.k + i)]));
            const double wv = bf16_bits_to_f32(w[static_cast<size_t>(j * s.k + i)]);
            exact += xv * wv;
            rounded += xr * wv;
            abs_exact += std::fabs(xv * wv);
            abs_rounded += std::fabs(xr * wv);
          }
          const double got = y[static_cast<size_t>(t * s.m + j)];
          const std::string where = std::string(invariant ? "invariant " : "") + "n" + std::to_string(s.n) + " m" +
                                    std::to_string(s.m) + " k" + std::to_string(s.k) + " at [" + std::to_string(t) +
                                    ", " + std::to_string(j) + "]";
          ASSERT_LE(std::fabs(got - rounded), g * abs_rounded)
              << where << ": got " << got << ", bf16(x)·w " << rounded;
          ASSERT_LE(std::fabs(got - exact), bf16_u * abs_exact + g * abs_rounded) << where << ": exact " << exact;
          if (std::fabs(got - exact) > g * abs_exact) ++differs_from_exact;
        }
      // The rounding is real: most elements sit outside the exact path's f32 bound.
      if (s.k >= 32) {
        EXPECT_GT(differs_from_exact, s.n * s.m / 4) << "n" << s.n << " m" << s.m << " k" << s.k;
      }
    }
  }
}

// In batch-invariant mode, a row alone, then at (n − 1)·2/3 among 3, 5, 16
// and 64 random rows: bit-identical (the order of an element's sum depends on
// k alone).
TEST(Bf16DotGemm, ARowIsBitIdenticalAloneOrInABatch) {
  if (!runs_here()) GTEST_SKIP() << bf16_dot_gemm_missing();
  Restore restore;
  set_batch_invariant(true);
  std::mt19937 rng(9);
  for (auto [m, k] : {std::pair<int64_t, int64_t>{37, 203}, {150, 896}}) {
    const std::vector<uint16_t> w = random_bf16(m * k, rng);
    const std::vector<float> probe = random_f32(k, rng);
    std::vector<float> alone(static_cast<size_t>(m));
    bf16_dot_gemm(probe.data(), 1, w.data(), m, k, alone.data());
    for (int n : {3, 5, 16, 64}) {
      std::vector<float> x = random_f32(n * k, rng);
      const int64_t at = (n - 1) * 2 / 3;
      std::memcpy(x.data() + at * k, probe.data(), static_cast<size_t>(k) * sizeof(float));
      std::vector<float> y(static_cast<size_t>(n * m));
      bf16_dot_gemm(x.data(), n, w.data(), m, k, y.data());
      ASSERT_EQ(std::memcmp(y.data() + at * m, alone.data(), static_cast<size_t>(m) * sizeof(float)), 0)
          << "m" << m << " k" << k << ": row " << at << " of " << n << " differs from the row alone";
    }
  }
}

// backend::matmul takes the kernel for bf16 weights only when asked and only
// where it runs; f32 and f16 weights stay on the exact kernels; asking where
// it cannot run is refused, naming why, and changes nothing.
TEST(Bf16DotChoice, TakenOnlyWhenAskedAndTheCpuHasIt) {
  Restore restore;
  const char* env = std::getenv("SHARDLM_DENSE_ACTIVATIONS");
  if (!env || !*env) {
    EXPECT_EQ(default_dense_activations(), DenseActivations::kF32);  // exact by default
  }
  set_default_dense_activations(DenseActivations::kF32);
  for (int64_t n : {1, 16, 512}) EXPECT_NE(matmul_path(n, DType::kBF16), MatmulPath::kBf16Dot) << n;
  const bool cpu_has = detected_cpu_isa() >= CpuIsa::kAvx512Bf16 && active_cpu_isa() >= CpuIsa::kAvx512Bf16;
  EXPECT_EQ(bf16_dot_gemm_runs(), cpu_has && bf16_dot_gemm_built());
  if (!bf16_dot_gemm_runs()) {
    try {
      set_default_dense_activations(DenseActivations::kBf16);
      FAIL() << "bf16 activations accepted where the kernel cannot run";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
      EXPECT_NE(std::string(e.what()).find(bf16_dot_gemm_missing()), std::string::npos) << e.what();
    }
    EXPECT_EQ(default_dense_activations(), DenseActivations::kF32);
    EXPECT_NE(matmul_path(64, DType::kBF16), MatmulPath::kBf16Dot);
    return;
  }
  set_default_dense_activations(DenseActivations::kBf16);
  for (int64_t n : {1, 3, 16, 512}) EXPECT_EQ(matmul_path(n, DType::kBF16), MatmulPath::kBf16Dot) << n;
  EXPECT_NE(matmul_path(64, DType::kF32), MatmulPath::kBf16Dot);
  EXPECT_NE(matmul_path(64, DType::kF16), MatmulPath::kBf16Dot);
  EXPECT_NE(CpuBackend(1).name().find("bf16 activations"), std::string::npos) << CpuBackend(1).name();
  // Row-invariant, so batch invariance keeps it.
  set_batch_invariant(true);
  EXPECT_EQ(matmul_path(64, DType::kBF16), MatmulPath::kBf16Dot);
  set_batch_invariant(false);
  // Through backend::matmul, with a bias: the kernel's bits, plus the bias.
  std::mt19937 rng(4);
  const int64_t n = 9, m = 70, k = 100;
  const std::vector<uint16_t> w = random_bf16(m * k, rng), b = random_bf16(m, rng);
  const std::vector<float> x = random_f32(n * k, rng);
  std::vector<float> got(static_cast<size_t>(n * m)), kernel(got.size()), exact(got.size());
  matmul(x.data(), n, MatrixView{w.data(), DType::kBF16, m, k}, nullptr, got.data());
  bf16_dot_gemm(x.data(), n, w.data(), m, k, kernel.data());
  EXPECT_EQ(got, kernel);
  const VectorView bias{b.data(), DType::kBF16, m};
  matmul(x.data(), n, MatrixView{w.data(), DType::kBF16, m, k}, &bias, got.data());
  for (int64_t i = 0; i < n * m; ++i)
    ASSERT_EQ(got[static_cast<size_t>(i)], kernel[static_cast<size_t>(i)] + bf16_bits_to_f32(b[static_cast<size_t>(i % m)]));
  set_default_dense_activations(DenseActivations::kF32);
  matmul(x.data(), n, MatrixView{w.data(), DType::kBF16, m, k}, nullptr, exact.data());
  EXPECT_NE(exact, kernel);  // off again: the exact kernels
}

// SHARDLM_DENSE_ACTIVATIONS (a ctest run sets bf16): read once, and bf16
// where the kernel cannot run is refused naming the variable.
TEST(Bf16DotChoice, TheVariableSetsTheDefault) {
  const char* env = std::getenv("SHARDLM_DENSE_ACTIVATIONS");
  if (!env || std::string(env) != "bf16") GTEST_SKIP() << "SHARDLM_DENSE_ACTIVATIONS is not bf16 (ctest sets it)";
  if (!bf16_dot_gemm_runs()) {
    try {
      default_dense_activations();
      FAIL() << "SHARDLM_DENSE_ACTIVATIONS=bf16 accepted where the kernel cannot run";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("SHARDLM_DENSE_ACTIVATIONS=bf16"), std::string::npos) << e.what();
    }
    return;
  }
  EXPECT_EQ(default_dense_activations(), DenseActivations::kBf16);
  EXPECT_EQ(matmul_path(1, DType::kBF16), MatmulPath::kBf16Dot);
  Restore restore;
}

TEST(Bf16DotChoice, NamesAndParsing) {
  DenseActivations a = DenseActivations::kF32;
  EXPECT_TRUE(parse_dense_activations("bf16", &a));
  EXPECT_EQ(a, DenseActivations::kBf16);
  EXPECT_TRUE(parse_dense_activations("f32", &a));
  EXPECT_EQ(a, DenseActivations::kF32);
  EXPECT_FALSE(parse_dense_activations("fp16", &a));
  EXPECT_STREQ(dense_activations_name(DenseActivations::kBf16), "bf16");
  EXPECT_STREQ(matmul_path_name(MatmulPath::kBf16Dot), "bf16dot");
}

}  // namespace
}  // namespace shardlm::backend
