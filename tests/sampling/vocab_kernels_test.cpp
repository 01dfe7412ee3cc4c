// sampling/vocab_kernels.h: every path this CPU runs (scalar always, AVX2,
// AVX-512) gives the scalar path's bits, over inputs with NaN, +-inf, ties
// and tails; fast_exp's error against exp in double; argmax's ties and NaN;
// the blocked inverse CDF against a plain running sum.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "sampling/sampler.h"
#include "sampling/speculative_sampling.h"
#include "sampling/vocab_kernels.h"

namespace shardlm {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

uint32_t bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}
uint64_t bits(double d) {
  uint64_t b;
  std::memcpy(&b, &d, sizeof b);
  return b;
}
float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

std::vector<VocabIsa> paths() {
  std::vector<VocabIsa> out;
  for (VocabIsa isa : {VocabIsa::kScalar, VocabIsa::kAvx2, VocabIsa::kAvx512})
    if (vocab_isa_supported(isa)) out.push_back(isa);
  return out;
}

// Inputs of the exp: specials, the clamp and range edges, points where
// rint(x log2e) ties, and a sweep of bit patterns over [-110, 95].
std::vector<float> exp_inputs() {
  std::vector<float> x = {0.0f, -0.0f, kInf, -kInf, std::numeric_limits<float>::quiet_NaN(),
                          -std::numeric_limits<float>::quiet_NaN(), 1e-30f, -1e-30f,
                          std::numeric_limits<float>::denorm_min(), -104.0f, -103.97f, -103.9f, -87.34f, -87.33f,
                          -87.0f, 88.72f, 88.7228f, 88.73f, 89.0f, 89.5f, -1e30f, 1e30f, std::log(2.0f) / 2,
                          -std::log(2.0f) / 2, std::log(2.0f) * 1.5f, -std::log(2.0f) * 1.5f};
  for (uint32_t b = 0; b < 0x42be0000u; b += 4099) x.push_back(from_bits(b));            // [0, 95]
  for (uint32_t b = 0x80000000u; b < 0xc2dc0000u; b += 4099) x.push_back(from_bits(b));  // [-110, -0]
  return x;
}

TEST(VocabKernels, ExpGivesTheSameBitsOnEveryPath) {
  const std::vector<float> x = exp_inputs();
  ASSERT_GT(x.size(), 500000u);
  std::vector<float> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = fast_exp(x[i]);
  for (VocabIsa isa : paths()) {
    // Every length mod 16 once (the tails), then the whole sweep in place.
    for (size_t n = 0; n <= 40; ++n) {
      std::vector<float> y(n);
      vocab_kernels(isa).exp(x.data(), y.data(), n);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(bits(y[i]), bits(want[i])) << vocab_isa_name(isa) << " x=" << x[i];
    }
    std::vector<float> y = x;
    vocab_kernels(isa).exp(y.data(), y.data(), y.size());
    size_t differ = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      if (bits(y[i]) == bits(want[i])) continue;
      if (++differ <= 5) ADD_FAILURE() << vocab_isa_name(isa) << ": exp(" << x[i] << ") = " << y[i] << ", scalar " << want[i];
    }
    EXPECT_EQ(differ, 0u) << vocab_isa_name(isa);
  }
}

TEST(VocabKernels, ExpEdgeCases) {
  EXPECT_EQ(bits(fast_exp(0.0f)), bits(1.0f));
  EXPECT_EQ(bits(fast_exp(-0.0f)), bits(1.0f));
  EXPECT_EQ(bits(fast_exp(-kInf)), bits(0.0f));
  EXPECT_EQ(fast_exp(kInf), kInf);
  EXPECT_TRUE(std::isnan(fast_exp(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(bits(fast_exp(-1e30f)), bits(0.0f));
  EXPECT_EQ(fast_exp(1e30f), kInf);
  EXPECT_EQ(fast_exp(89.0f), kInf);
  EXPECT_EQ(bits(fast_exp(-104.0f)), bits(0.0f));  // exp(-104) < 2^-150: rounds to 0
  EXPECT_EQ(fast_exp(std::numeric_limits<float>::denorm_min()), 1.0f);
  // Subnormal results are kept (as std::exp keeps them), not flushed.
  const float sub = fast_exp(-100.0f);
  EXPECT_GT(sub, 0.0f);
  EXPECT_LT(sub, std::numeric_limits<float>::min());
  EXPECT_NEAR(sub, std::exp(-100.0), 2 * std::numeric_limits<float>::denorm_min());
}

// Error in units of the last place of the f32 result, against exp in double.
double ulp_error(float x) {
  const double want = std::exp(static_cast<double>(x));
  int e = 0;
  std::frexp(want, &e);  // want = m 2^e, m in [0.5, 1)
  const double ulp = std::ldexp(1.0, std::max(e - 24, -149));
  return std::fabs(static_cast<double>(fast_exp(x)) - want) / ulp;
}

TEST(VocabKernels, ExpIsWithinTwoUlpOfExpInDouble) {
  double worst = 0.0, worst_sub = 0.0;
  float worst_x = 0.0f;
  auto visit = [&](float x) {
    const double err = ulp_error(x);
    if (std::exp(static_cast<double>(x)) < std::numeric_limits<float>::min()) {
      worst_sub = std::max(worst_sub, err);
    } else if (err > worst) {
      worst = err;
      worst_x = x;
    }
  };
  // Every 127th f32 of the finite-result range [-103.97, 88.72], every f32
  // in [-1, 1]'s densest stretch [-2^-4, 2^-4] at a stride of 7.
  for (uint32_t b = 0; b <= 0x42b17217u; b += 127) visit(from_bits(b));
  for (uint32_t b = 0x80000000u; b <= 0xc2cff1b4u; b += 127) visit(from_bits(b));
  for (uint32_t b = 0x3d800000u - (1u << 22); b <= 0x3d800000u; b += 7) {
    visit(from_bits(b));
    visit(-from_bits(b));
  }
  std::printf("fast_exp: max error %.3f ulp (at x = %.9g) over normal results, %.3f ulp of 2^-149 over subnormal ones\n",
              worst, worst_x, worst_sub);
  EXPECT_LE(worst, 2.0) << "at x = " << worst_x;
  EXPECT_LE(worst_sub, 1.0);  // the last multiply rounds once
}

// A row like a model's: a normal body, a few strong tokens, NaN, -inf,
// +inf-free, with exact ties (values on a grid) in the vector bodies.
std::vector<float> test_row(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.5f);
  std::vector<float> z(n);
  for (float& v : z) v = std::round(normal(rng) * 64.0f) / 64.0f;
  for (size_t j = 0; j < std::min<size_t>(n, 8); ++j) z[rng() % n] = 12.0f;  // ties at the top
  for (size_t j = 0; j < n / 50; ++j) z[rng() % n] = std::numeric_limits<float>::quiet_NaN();
  for (size_t j = 0; j < n / 50; ++j) z[rng() % n] = -kInf;
  return z;
}

TEST(VocabKernels, EveryKernelGivesTheScalarPathsBits) {
  const VocabKernels& ref = vocab_kernels(VocabIsa::kScalar);
  for (size_t n : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{33}, size_t{1000}, size_t{151936},
                   size_t{151943}}) {
    const std::vector<float> z = test_row(n, n);
    for (VocabIsa isa : paths()) {
      SCOPED_TRACE(std::string(vocab_isa_name(isa)) + ", n = " + std::to_string(n));
      const VocabKernels& k = vocab_kernels(isa);
      const float max_l = ref.max(z.data(), n);
      EXPECT_EQ(bits(k.max(z.data(), n)), bits(max_l));
      for (float v : {max_l, 12.0f, 0.0f, -kInf, 1.5f, 99.0f})
        EXPECT_EQ(k.find_equal(z.data(), n, v), ref.find_equal(z.data(), n, v)) << v;
      for (float v : {-kInf, 0.0f, 5.0f, 11.99f, 12.0f})
        EXPECT_EQ(k.find_greater(z.data(), n, v), ref.find_greater(z.data(), n, v)) << v;
      EXPECT_EQ(bits(k.sum_exp(z.data(), n, max_l)), bits(ref.sum_exp(z.data(), n, max_l)));

      for (auto [inv_t, min_w] : {std::pair{1.0f, 0.0f}, std::pair{1.0f / 0.7f, 0.0f}, std::pair{1.0f / 1.5f, 0.05f}}) {
        std::vector<float> w(n), w_ref(n), w_plain(n);
        std::vector<double> exp_sums(n / kVocabLanes);
        const ExpWeights got = k.weights(z.data(), n, max_l, inv_t, min_w, w.data(), exp_sums.data());
        const ExpWeights want = ref.weights(z.data(), n, max_l, inv_t, min_w, w_ref.data(), nullptr);
        const ExpWeights plain = k.weights(z.data(), n, max_l, inv_t, min_w, w_plain.data(), nullptr);
        EXPECT_EQ(bits(got.mass), bits(want.mass));
        EXPECT_EQ(bits(plain.mass), bits(want.mass));
        EXPECT_EQ(got.n_positive, want.n_positive);
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(bits(w[i]), bits(w_ref[i])) << i;
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(bits(w_plain[i]), bits(w_ref[i])) << i;

        // top_p's buckets, with a candidate floor and a scale that sends
        // some logits past the last bucket.
        std::vector<int32_t> ids(n), ids_ref(n);
        for (auto [min_cand, scale] : {std::pair{1e-3f, 300.0f}, std::pair{std::numeric_limits<float>::denorm_min(), 30.0f}}) {
          std::vector<double> mass(kMassBuckets, 0.0), mass_ref(kMassBuckets, 0.0);
          const size_t last = k.bucket_mass(z.data(), w.data(), n, min_cand, max_l, scale, mass.data());
          ASSERT_EQ(last, ref.bucket_mass(z.data(), w.data(), n, min_cand, max_l, scale, mass_ref.data()));
          for (size_t b = 0; b < kMassBuckets; ++b) ASSERT_EQ(bits(mass[b]), bits(mass_ref[b])) << b;
          for (size_t b : {size_t{0}, last / 2, last, kMassBuckets - 1}) {
            const size_t c = k.collect_bucket(z.data(), w.data(), n, min_cand, max_l, scale, b, ids.data());
            ASSERT_EQ(c, ref.collect_bucket(z.data(), w.data(), n, min_cand, max_l, scale, b, ids_ref.data())) << b;
            for (size_t j = 0; j < c; ++j) ASSERT_EQ(ids[j], ids_ref[j]);
          }
        }

        std::vector<double> sums(n / kVocabLanes), sums_ref(n / kVocabLanes);
        k.block_sums(w.data(), n, sums.data());
        ref.block_sums(w.data(), n, sums_ref.data());
        for (size_t j = 0; j < sums.size(); ++j) ASSERT_EQ(bits(sums[j]), bits(sums_ref[j])) << j;
        for (size_t j = 0; j < sums.size(); ++j) ASSERT_EQ(bits(exp_sums[j]), bits(sums_ref[j])) << j;

        // The boundary at a tied logit (12) keeps the ties up to its id;
        // none (-inf, -1) keeps every positive weight. In place, as the
        // sampler compacts.
        const size_t tie = ref.find_equal(z.data(), n, 12.0f);
        for (auto [z_b, b] : {std::pair{-kInf, int32_t{-1}}, std::pair{12.0f, static_cast<int32_t>(tie)},
                              std::pair{2.0f, static_cast<int32_t>(n / 2)}}) {
          std::vector<float> wk = w, wr = w;
          const size_t m = k.compact(wk.data(), z.data(), n, z_b, b, ids.data(), wk.data());
          ASSERT_EQ(m, ref.compact(wr.data(), z.data(), n, z_b, b, ids_ref.data(), wr.data())) << z_b;
          for (size_t j = 0; j < m; ++j) {
            ASSERT_EQ(ids[j], ids_ref[j]) << j;
            ASSERT_EQ(bits(wk[j]), bits(wr[j])) << j;
            ASSERT_EQ(bits(wk[j]), bits(w[ids[j]])) << j;
          }
        }
      }
    }
  }
}

TEST(VocabKernels, ScalarCompactionKeepsWhatTheRankingSays) {
  // The reference itself: positive weights at or above (12, id 5) by logit.
  const std::vector<float> z = {12.0f, 3.0f, 12.0f, 13.0f, -kInf, 12.0f, 12.0f, 1.0f};
  const std::vector<float> w = {1.0f, 0.5f, 1.0f, 1.0f, 0.0f, 1.0f, 1.0f, 0.0f};
  std::vector<int32_t> ids(8);
  std::vector<float> out(8);
  const size_t m = vocab_kernels(VocabIsa::kScalar).compact(w.data(), z.data(), 8, 12.0f, 5, ids.data(), out.data());
  ASSERT_EQ(m, 4u);
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[1], 2);
  EXPECT_EQ(ids[2], 3);
  EXPECT_EQ(ids[3], 5);
}

// argmax (and each path's max + find_equal, which it is): lowest id among
// ties, NaN never wins, all -inf gives the first non-NaN, all NaN gives 0,
// with the cases placed inside the vector bodies and in the tails.
TEST(VocabKernels, ArgmaxTakesTheLowestTiedIdAndSkipsNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (size_t n : {size_t{5}, size_t{40}, size_t{151936}, size_t{151939}}) {
    for (size_t at : {size_t{1}, n / 3, n / 3 + 16, n - 2}) {  // n / 3 and n / 3 + 16: both accumulators
      if (at + 1 >= n) continue;
      SCOPED_TRACE("n = " + std::to_string(n) + ", at = " + std::to_string(at));
      std::vector<float> z(n, 1.0f);
      z[at] = 7.0f;
      z[at + 1] = 7.0f;  // a tie: the lower id wins
      z[0] = nan;        // NaN first: never the answer
      if (at > 2) z[at - 1] = nan;
      // After the maximum, in its lane of each path's accumulators (two of 8
      // or two of 16 floats): must not displace it.
      for (size_t d : {16, 17, 32, 33})
        if (at + d < n) z[at + d] = nan;
      EXPECT_EQ(argmax(z), static_cast<int32_t>(at));
      for (VocabIsa isa : paths()) {
        const VocabKernels& k = vocab_kernels(isa);
        EXPECT_EQ(k.find_equal(z.data(), n, k.max(z.data(), n)), at) << vocab_isa_name(isa);
      }
      z.assign(n, -kInf);
      z[0] = nan;
      z[at] = nan;
      EXPECT_EQ(argmax(z), at == 1 ? 2 : 1);  // all -inf: the first that is not NaN
      z.assign(n, nan);
      EXPECT_EQ(argmax(z), 0);
      z.assign(n, 0.0f);
      z[at] = kInf;
      z[n - 1] = kInf;
      EXPECT_EQ(argmax(z), static_cast<int32_t>(at));
    }
  }
}

// The blocked inverse CDF against a running sum in long double: the index it
// draws has a positive weight and its cumulative interval holds u * total
// (to rounding), on rows with zeros, for draws spread over [0, 1).
TEST(VocabKernels, BlockedInverseCdfDrawsTheTokenWhoseIntervalHoldsU) {
  std::mt19937_64 rng(3);
  for (size_t n : {size_t{3}, size_t{16}, size_t{17}, size_t{4099}, size_t{151936}}) {
    std::vector<float> w(n);
    std::uniform_real_distribution<float> unit(0.0f, 1.0f);
    for (float& v : w) v = rng() % 4 == 0 ? 0.0f : std::exp(-20.0f * unit(rng));
    w[n / 2] = 1.0f;
    std::vector<long double> cum(n + 1, 0.0L);
    for (size_t i = 0; i < n; ++i) cum[i + 1] = cum[i] + w[i];
    for (int d = 0; d < 200; ++d) {
      const double u = uniform_from_draw(rng());
      const size_t j = inverse_cdf_index(w, u);
      ASSERT_LT(j, n);
      ASSERT_GT(w[j], 0.0f) << "n = " << n << ", u = " << u;
      const long double target = u * cum[n], slack = 1e-12L * cum[n];
      EXPECT_LE(cum[j], target + slack) << "n = " << n << ", u = " << u << ", j = " << j;
      EXPECT_GT(cum[j + 1], target - slack) << "n = " << n << ", u = " << u << ", j = " << j;
    }
  }
}

// Where rounding keeps the running sum inside the chosen block from passing
// u * total, the block's last positive weight is drawn. Block 1's 16 weights
// of 64 vanish one by one into 2^60 (half an ulp is 128) but their block
// sum, 1024, does not; u = 1 - 2^-52 puts u * total = 2^60 + 768 inside it.
TEST(VocabKernels, BlockedInverseCdfFallsBackToTheBlocksLastPositiveWeight) {
  std::vector<float> w(48, 0.0f);
  w[0] = 0x1p60f;
  for (size_t i = 16; i < 32; ++i) w[i] = 64.0f;
  EXPECT_EQ(inverse_cdf_index(w, 1.0 - 0x1p-52), 31u);
  EXPECT_EQ(inverse_cdf_index(w, 0.5), 0u);
  EXPECT_EQ(inverse_cdf_index(std::vector<float>(40, 0.0f), 0.5), 39u);  // all zero: the last
}

// Temperature alone: draw_unfiltered (the weights by token id, block sums
// from the exp pass) draws the same token as the general path (the
// kept weights compacted, then inverse_cdf_index), to within rounding of a
// boundary, which these draws do not come near.
TEST(VocabKernels, DrawUnfilteredMatchesTheCompactedDraw) {
  std::mt19937_64 rng(11);
  for (size_t vocab : {size_t{7}, size_t{100}, size_t{151936}}) {
    for (double min_p : {0.0, 0.02}) {
      const SamplingParams p{.temperature = 0.8, .min_p = min_p};
      SamplingScratch a, b;
      const std::vector<float> z = test_row(vocab, vocab + 1);
      for (int d = 0; d < 50; ++d) {
        const double u = uniform_from_draw(rng());
        const int32_t got = draw_unfiltered(p, z, a, u);
        const size_t n = filter_tokens(p, z, b);
        ASSERT_GT(n, 0u);
        const int32_t want = b.kept[inverse_cdf_index(std::span<const float>(b.weight.data(), n), u)];
        EXPECT_EQ(got, want) << "vocab " << vocab << ", min_p " << min_p << ", u " << u;
      }
    }
  }
  SamplingScratch s;
  const std::vector<float> none(50, -kInf);
  EXPECT_EQ(draw_unfiltered(SamplingParams{}, none, s, 0.5), -1);
}

}  // namespace
}  // namespace shardlm
