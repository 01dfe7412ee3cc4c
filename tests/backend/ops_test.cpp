// Every optimised op against its scalar reference, for every dtype it takes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <cstdlib>
#include <string>
#include <random>
#include <tuple>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/error.h"
#include "core/fast_exp_ops.h"

namespace shardlm::backend {
namespace {

// Random values stored in dtype; returns the buffer of raw bytes.
std::vector<uint8_t> random_buffer(DType dtype, int64_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<uint8_t> buf(static_cast<size_t>(n) * dtype_size(dtype));
  for (int64_t i = 0; i < n; ++i) store_from_f32(buf.data(), dtype, static_cast<size_t>(i), dist(rng));
  return buf;
}

std::vector<float> random_f32(int64_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, float rel, float abs_tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], abs_tol + rel * std::fabs(want[i])) << "element " << i;
}

const char* name_of(DType d) { return dtype_safetensors_name(d); }

// (dtype, n tokens, m rows, k cols, bias)
using MatmulParam = std::tuple<DType, int, int, int, bool>;
class MatmulTest : public ::testing::TestWithParam<MatmulParam> {};

TEST_P(MatmulTest, MatchesReference) {
  auto [dtype, n, m, k, with_bias] = GetParam();
  std::mt19937 rng(n * 7919 + m * 31 + k);
  auto w = random_buffer(dtype, int64_t{m} * k, rng);
  auto b = random_buffer(dtype, m, rng);
  auto x = random_f32(int64_t{n} * k, rng);
  MatrixView wv{w.data(), dtype, m, k};
  VectorView bv{b.data(), dtype, m};
  std::vector<float> got(static_cast<size_t>(n) * m), want(got.size());
  matmul(x.data(), n, wv, with_bias ? &bv : nullptr, got.data());
  ref::matmul(x.data(), n, wv, with_bias ? &bv : nullptr, want.data());
  // f32 accumulation over k terms of unit variance: error ~ sqrt(k) ulp.
  expect_close(got, want, 1e-4f, 2e-4f * std::sqrt(static_cast<float>(k)));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, MatmulTest,
    ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16, DType::kF16), ::testing::Values(1, 3, 4, 70),
                       ::testing::Values(1, 7, 64), ::testing::Values(5, 64, 131), ::testing::Bool()),
    [](const auto& info) {
      return std::string(name_of(std::get<0>(info.param))) + "_n" + std::to_string(std::get<1>(info.param)) + "_m" +
             std::to_string(std::get<2>(info.param)) + "_k" + std::to_string(std::get<3>(info.param)) +
             (std::get<4>(info.param) ? "_bias" : "");
    });

// The packed GEMM (from 16 tokens on; bf16 on AMX from 8): k past one
// 256-wide panel block and not a multiple of it (nor of AMX's 32), m not a
// multiple of a panel (16 or 32 outputs), token counts that leave a partial
// register tile or AMX tile (16 rows).
INSTANTIATE_TEST_SUITE_P(
    PackedShapes, MatmulTest,
    ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16, DType::kF16), ::testing::Values(9, 16, 29, 50),
                       ::testing::Values(33, 100), ::testing::Values(300, 600), ::testing::Values(false)),
    [](const auto& info) {
      return std::string(name_of(std::get<0>(info.param))) + "_n" + std::to_string(std::get<1>(info.param)) + "_m" +
             std::to_string(std::get<2>(info.param)) + "_k" + std::to_string(std::get<3>(info.param));
    });

// Up to 16 tokens with k a multiple of 32, bf16 on AMX reads the weights in
// place as the A operand: m not a multiple of 16 (a zero-padded last block)
// nor of a 64-output work item, one and several items, 8 to 16 tokens.
INSTANTIATE_TEST_SUITE_P(
    AmxFewTokens, MatmulTest,
    ::testing::Combine(::testing::Values(DType::kBF16), ::testing::Values(8, 11, 16), ::testing::Values(16, 100, 200),
                       ::testing::Values(32, 896), ::testing::Values(false, true)),
    [](const auto& info) {
      return std::string(name_of(std::get<0>(info.param))) + "_n" + std::to_string(std::get<1>(info.param)) + "_m" +
             std::to_string(std::get<2>(info.param)) + "_k" + std::to_string(std::get<3>(info.param)) +
             (std::get<4>(info.param) ? "_bias" : "");
    });

class DTypeTest : public ::testing::TestWithParam<DType> {};

TEST_P(DTypeTest, RmsNormMatchesReference) {
  std::mt19937 rng(1);
  const int64_t rows = 5, d = 96;
  auto w = random_buffer(GetParam(), d, rng);
  auto x = random_f32(rows * d, rng, 3.0f);
  VectorView wv{w.data(), GetParam(), d};
  std::vector<float> got(x.size()), want(x.size());
  rms_norm(x.data(), rows, wv, 1e-6f, got.data());
  ref::rms_norm(x.data(), rows, wv, 1e-6f, want.data());
  expect_close(got, want, 1e-5f, 1e-6f);
  // In place gives the same answer.
  std::vector<float> inplace = x;
  rms_norm(inplace.data(), rows, wv, 1e-6f, inplace.data());
  expect_close(inplace, want, 1e-5f, 1e-6f);
  // Gemma's (1 + w): the same as an f32 weight holding 1 + w.
  std::vector<float> plus_one(static_cast<size_t>(d));
  for (int64_t i = 0; i < d; ++i) plus_one[i] = 1.0f + load_as_f32(w.data(), GetParam(), static_cast<size_t>(i));
  std::vector<float> offset(x.size()), explicit_w(x.size());
  rms_norm(x.data(), rows, wv, 1e-6f, offset.data(), 1.0f);
  ref::rms_norm(x.data(), rows, VectorView{plus_one.data(), DType::kF32, d}, 1e-6f, explicit_w.data());
  expect_close(offset, explicit_w, 1e-5f, 1e-6f);
  ref::rms_norm(x.data(), rows, wv, 1e-6f, want.data(), 1.0f);
  expect_close(want, explicit_w, 1e-6f, 1e-7f);
}

// KV cache dtype: attention over a paged cache with several chunks (a
// prefill chunk after cached tokens, a decode, a fresh prompt), GQA with an
// offset head range as an uneven TP rank sees it.
TEST_P(DTypeTest, PagedAttentionMatchesReference) {
  const DType dtype = GetParam();
  std::mt19937 rng(2);
  const int64_t hd = 32, block = 4, n_blocks = 16;
  // Rank holding global Q heads [3, 8) of a group-size-3 model: KV heads [1, 3).
  AttentionHeads heads{5, 3, 1, 3};
  const int64_t nkv = 2;
  std::vector<uint8_t> kbuf(static_cast<size_t>(n_blocks * block * nkv * hd) * dtype_size(dtype));
  std::vector<uint8_t> vbuf(kbuf.size());
  KvLayerView cache{kbuf.data(), vbuf.data(), dtype, n_blocks, block, nkv, hd};
  std::vector<int32_t> t0{3, 0, 7}, t1{5, 9, 2, 11}, t2{1, 4};
  // seq0: 3 new after 6 cached; seq1: 1 new after 12 cached; seq2: 7 new.
  std::vector<AttentionSeq> seqs{{0, 3, 6, t0.data(), 3}, {3, 1, 12, t1.data(), 4}, {4, 7, 0, t2.data(), 2}};
  // Fill the cached prefix, then write the chunks.
  auto past_k = random_f32(n_blocks * block * nkv * hd, rng), past_v = random_f32(past_k.size(), rng);
  for (size_t i = 0; i < past_k.size(); ++i) {
    store_from_f32(kbuf.data(), dtype, i, past_k[i]);
    store_from_f32(vbuf.data(), dtype, i, past_v[i]);
  }
  const int64_t n_tok = 11;
  auto k = random_f32(n_tok * nkv * hd, rng), v = random_f32(k.size(), rng);
  kv_cache_write(cache, seqs.data(), 3, k.data(), v.data());
  auto q = random_f32(n_tok * heads.n_q_heads * hd, rng);
  std::vector<float> got(q.size()), want(q.size());
  paged_attention(q.data(), cache, seqs.data(), 3, heads, got.data());
  ref::paged_attention(q.data(), cache, seqs.data(), 3, heads, want.data());
  expect_close(got, want, 1e-4f, 1e-5f);
  // Writing stored the new keys where the block table says.
  const int64_t pos = 6 + 2;  // seq0 token 2
  const int64_t slot = t0[pos / block] * block + pos % block;
  EXPECT_NEAR(load_as_f32(kbuf.data(), dtype, static_cast<size_t>(slot * nkv * hd + 5)), k[2 * nkv * hd + 5],
              dtype == DType::kF32 ? 0.0f : 0.02f);
}

// Batch-1 decode over a long context: few (row, KV head) items, so the
// context is split into chunks merged afterwards (flash-decoding): one row,
// one KV head, 1001 positions in 3 chunks, with 2 and 4 threads.
TEST_P(DTypeTest, SplitContextDecodeMatchesReference) {
  const DType dtype = GetParam();
  std::mt19937 rng(5);
  const int64_t hd = 64, block = 16, n_blocks = 64, nkv = 1;
  AttentionHeads heads{3, 0, 0, 3};  // one KV head read by 3 Q heads
  std::vector<uint8_t> kbuf(static_cast<size_t>(n_blocks * block * nkv * hd) * dtype_size(dtype));
  std::vector<uint8_t> vbuf(kbuf.size());
  KvLayerView cache{kbuf.data(), vbuf.data(), dtype, n_blocks, block, nkv, hd};
  std::vector<int32_t> table(n_blocks);
  for (int64_t b = 0; b < n_blocks; ++b) table[b] = static_cast<int32_t>((b * 37) % n_blocks);
  auto past_k = random_f32(n_blocks * block * nkv * hd, rng, 2.0f), past_v = random_f32(past_k.size(), rng);
  for (size_t i = 0; i < past_k.size(); ++i) {
    store_from_f32(kbuf.data(), dtype, i, past_k[i]);
    store_from_f32(vbuf.data(), dtype, i, past_v[i]);
  }
  // One new token after 1000 cached positions.
  std::vector<AttentionSeq> seqs{{0, 1, 1000, table.data(), n_blocks}};
  auto k = random_f32(nkv * hd, rng), v = random_f32(k.size(), rng);
  kv_cache_write(cache, seqs.data(), 1, k.data(), v.data());
  auto q = random_f32(heads.n_q_heads * hd, rng);
  std::vector<float> want(q.size());
  ref::paged_attention(q.data(), cache, seqs.data(), 1, heads, want.data());
  for (int threads : {2, 4}) {
    set_num_threads(threads);
    std::vector<float> got(q.size());
    paged_attention(q.data(), cache, seqs.data(), 1, heads, got.data());
    expect_close(got, want, 1e-4f, 1e-5f);
  }
  set_num_threads(0);
}

// The register-tiled paths (scores 8 heads per pass, values as many heads as
// fit in registers) across head sizes and group sizes, with a prefill chunk
// over a cached prefix that crosses several 16-position blocks.
TEST_P(DTypeTest, GroupedHeadsMatchReferenceAcrossHeadSizes) {
  const DType dtype = GetParam();
  for (int64_t hd : {64, 128, 96})
    for (int64_t group : {1, 3, 7, 10}) {
      std::mt19937 rng(static_cast<uint32_t>(hd * 31 + group));
      const int64_t block = 16, n_blocks = 8, nkv = 2;
      AttentionHeads heads{2 * group, 0, 0, group};
      std::vector<uint8_t> kbuf(static_cast<size_t>(n_blocks * block * nkv * hd) * dtype_size(dtype));
      std::vector<uint8_t> vbuf(kbuf.size());
      KvLayerView cache{kbuf.data(), vbuf.data(), dtype, n_blocks, block, nkv, hd};
      std::vector<int32_t> table{5, 2, 7, 0, 3, 6, 1, 4};
      auto past_k = random_f32(n_blocks * block * nkv * hd, rng), past_v = random_f32(past_k.size(), rng);
      for (size_t i = 0; i < past_k.size(); ++i) {
        store_from_f32(kbuf.data(), dtype, i, past_k[i]);
        store_from_f32(vbuf.data(), dtype, i, past_v[i]);
      }
      std::vector<AttentionSeq> seqs{{0, 5, 37, table.data(), 8}};  // 5 new tokens after 37 cached
      auto k = random_f32(5 * nkv * hd, rng), v = random_f32(k.size(), rng);
      kv_cache_write(cache, seqs.data(), 1, k.data(), v.data());
      auto q = random_f32(5 * heads.n_q_heads * hd, rng);
      std::vector<float> got(q.size()), want(q.size());
      paged_attention(q.data(), cache, seqs.data(), 1, heads, got.data());
      ref::paged_attention(q.data(), cache, seqs.data(), 1, heads, want.data());
      SCOPED_TRACE("head_dim " + std::to_string(hd) + ", group " + std::to_string(group));
      expect_close(got, want, 1e-4f, 1e-5f);
    }
}

// Gemma 3's local layers: a query at position p sees (p - window, p] only,
// scaled by query_pre_attn_scalar^-0.5; over a prefill chunk after a cached
// prefix, a decode, a fresh prompt shorter than the window, and a batch-1
// decode whose 600-key window the kernel splits into chunks.
TEST_P(DTypeTest, SlidingWindowAndScaleMatchReference) {
  const DType dtype = GetParam();
  std::mt19937 rng(9);
  const int64_t hd = 64, block = 4, n_blocks = 300, nkv = 1;
  std::vector<uint8_t> kbuf(static_cast<size_t>(n_blocks * block * nkv * hd) * dtype_size(dtype));
  std::vector<uint8_t> vbuf(kbuf.size());
  KvLayerView cache{kbuf.data(), vbuf.data(), dtype, n_blocks, block, nkv, hd};
  auto past_k = random_f32(n_blocks * block * nkv * hd, rng), past_v = random_f32(past_k.size(), rng);
  for (size_t i = 0; i < past_k.size(); ++i) {
    store_from_f32(kbuf.data(), dtype, i, past_k[i]);
    store_from_f32(vbuf.data(), dtype, i, past_v[i]);
  }
  std::vector<int32_t> t0{3, 0, 7}, t1{5, 9, 2, 11}, t2{1, 4}, t3(251);
  for (int32_t b = 0; b < 251; ++b) t3[b] = 20 + (b * 7) % 251;
  for (int64_t window : {5, 600}) {
    AttentionHeads heads{2, 0, 0, 2};
    heads.scale = 0.0625f;
    heads.window = window;
    std::vector<AttentionSeq> seqs{{0, 3, 6, t0.data(), 3}, {3, 1, 12, t1.data(), 4}, {4, 3, 0, t2.data(), 2}};
    if (window == 600) seqs = {{0, 1, 1000, t3.data(), 251}};
    int64_t n_tok = 0;
    for (const AttentionSeq& q : seqs) n_tok += q.n_tokens;
    auto k = random_f32(n_tok * nkv * hd, rng), v = random_f32(k.size(), rng);
    kv_cache_write(cache, seqs.data(), static_cast<int64_t>(seqs.size()), k.data(), v.data());
    auto q = random_f32(n_tok * heads.n_q_heads * hd, rng, 3.0f);
    std::vector<float> got(q.size()), want(q.size()), full(q.size());
    paged_attention(q.data(), cache, seqs.data(), static_cast<int64_t>(seqs.size()), heads, got.data());
    ref::paged_attention(q.data(), cache, seqs.data(), static_cast<int64_t>(seqs.size()), heads, want.data());
    SCOPED_TRACE("window " + std::to_string(window));
    expect_close(got, want, 1e-4f, 1e-5f);
    // The window and the scale change the answer (the test could fail).
    AttentionHeads unwindowed = heads;
    unwindowed.window = 0;
    ref::paged_attention(q.data(), cache, seqs.data(), static_cast<int64_t>(seqs.size()), unwindowed, full.data());
    EXPECT_GT(std::fabs(full[0] - want[0]) + std::fabs(full[hd] - want[hd]), 1e-3f);
  }
}

// The reference's window: keys before it do not matter, the oldest key inside it does.
TEST(Ops, ReferenceWindowIgnoresOnlyOlderKeys) {
  const int64_t hd = 8, window = 3;
  std::mt19937 rng(3);
  std::vector<float> kc(8 * hd), vc(8 * hd);
  for (auto* c : {&kc, &vc})
    for (auto& x : *c) x = std::normal_distribution<float>(0.0f, 1.0f)(rng);
  KvLayerView cache{kc.data(), vc.data(), DType::kF32, 2, 4, 1, hd};
  std::vector<int32_t> table{0, 1};
  AttentionSeq s{0, 1, 5, table.data(), 2};  // position 5 sees 3, 4, 5
  AttentionHeads heads{1, 0, 0, 1};
  heads.window = window;
  auto q = random_f32(hd, rng);
  std::vector<float> base(hd), out(hd);
  ref::paged_attention(q.data(), cache, &s, 1, heads, base.data());
  for (int64_t i = 0; i < 3 * hd; ++i) vc[i] += 5.0f;  // positions 0-2: outside
  ref::paged_attention(q.data(), cache, &s, 1, heads, out.data());
  for (int64_t i = 0; i < hd; ++i) EXPECT_EQ(out[i], base[i]);
  for (int64_t i = 3 * hd; i < 4 * hd; ++i) vc[i] += 5.0f;  // position 3: inside
  ref::paged_attention(q.data(), cache, &s, 1, heads, out.data());
  EXPECT_GT(std::fabs(out[0] - base[0]), 1e-3f);
}

// Blocks released after leaving a sliding window (-1 in the table, kv's
// kNoBlock): the kernels read and write only the window's blocks, so a table
// with holes before it gives the output of the full table; a hole inside the
// window is refused, never read.
TEST(Ops, SlidingWindowTableHolesBeforeTheWindowAreNeverRead) {
  const int64_t hd = 16, block = 4, nkv = 1;
  std::mt19937 rng(5);
  std::vector<float> kc(8 * block * hd), vc(kc.size());
  for (auto* c : {&kc, &vc})
    for (auto& x : *c) x = std::normal_distribution<float>(0.0f, 1.0f)(rng);
  KvLayerView cache{kc.data(), vc.data(), DType::kF32, 8, block, nkv, hd};
  AttentionHeads heads{2, 0, 0, 2};
  heads.window = 5;
  // A chunk of 3 at positions 13-15: the row at 13 reads from 9, so blocks 0 and 1 (positions 0-7) are not read.
  std::vector<int32_t> full{6, 2, 5, 1}, holed{-1, -1, 5, 1};
  AttentionSeq with_full{0, 3, 13, full.data(), 4}, with_holes{0, 3, 13, holed.data(), 4};
  auto k = random_f32(3 * hd, rng), v = random_f32(k.size(), rng), q = random_f32(3 * 2 * hd, rng);
  kv_cache_write(cache, &with_holes, 1, k.data(), v.data());
  std::vector<float> want(q.size()), got(q.size());
  paged_attention(q.data(), cache, &with_full, 1, heads, want.data());
  paged_attention(q.data(), cache, &with_holes, 1, heads, got.data());
  EXPECT_EQ(got, want);
  std::vector<int32_t> hole_in_window{-1, -1, -1, 1};  // the row at 13 reads position 9, in block 2
  AttentionSeq bad{0, 3, 13, hole_in_window.data(), 4};
  EXPECT_THROW(paged_attention(q.data(), cache, &bad, 1, heads, got.data()), shardlm::Error);
  AttentionHeads no_window = heads;
  no_window.window = 0;
  EXPECT_THROW(paged_attention(q.data(), cache, &with_holes, 1, no_window, got.data()), shardlm::Error);
}

INSTANTIATE_TEST_SUITE_P(DTypes, DTypeTest, ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(name_of(info.param)); });

TEST(Ops, AttentionOfOneTokenReturnsItsValue) {
  const int64_t hd = 8;
  std::vector<float> kc(4 * hd, 0.0f), vc(4 * hd, 0.0f);
  KvLayerView cache{kc.data(), vc.data(), DType::kF32, 1, 4, 1, hd};
  std::vector<int32_t> table{0};
  AttentionSeq s{0, 1, 0, table.data(), 1};
  std::vector<float> k(hd, 1.0f), v(hd), q(hd, 0.5f), out(hd);
  for (int i = 0; i < hd; ++i) v[i] = static_cast<float>(i);
  kv_cache_write(cache, &s, 1, k.data(), v.data());
  paged_attention(q.data(), cache, &s, 1, {1, 0, 0, 1}, out.data());
  for (int i = 0; i < hd; ++i) EXPECT_FLOAT_EQ(out[i], static_cast<float>(i));
}

TEST(Ops, RopeMatchesReferenceAndRotatesPairs) {
  std::mt19937 rng(3);
  const int64_t n = 6, heads = 3, hd = 16;
  RopeConfig rc;
  rc.head_dim = hd;
  rc.theta = 1e6;
  std::vector<float> inv(hd / 2);
  rope_inv_freq(rc, inv.data());
  EXPECT_FLOAT_EQ(inv[0], 1.0f);
  EXPECT_NEAR(inv[1], std::pow(1e6, -2.0 / 16), 1e-7);
  std::vector<int32_t> pos{0, 1, 2, 17, 100, 4095};
  auto x = random_f32(n * heads * hd, rng);
  auto got = x, want = x;
  rope(got.data(), n, heads, hd, pos.data(), inv.data());
  ref::rope(want.data(), n, heads, hd, pos.data(), inv.data());
  expect_close(got, want, 1e-6f, 1e-6f);
  // Position 0 is the identity; rotation keeps each pair's norm.
  for (int64_t i = 0; i < heads * hd; ++i) EXPECT_FLOAT_EQ(got[i], x[i]);
  const float* a = &x[(4 * heads) * hd];
  const float* b = &got[(4 * heads) * hd];
  for (int64_t i = 0; i < hd / 2; ++i)
    EXPECT_NEAR(a[i] * a[i] + a[i + hd / 2] * a[i + hd / 2], b[i] * b[i] + b[i + hd / 2] * b[i + hd / 2], 1e-4);
}

// Phi's partial rotary (the first 12 of 16 dims rotate, the last 4 pass
// through) with LongRoPE's attention factor on cos and sin, and its short
// factors dividing the frequencies.
TEST(Ops, PartialRotaryWithLongRopeFactors) {
  std::mt19937 rng(8);
  const int64_t n = 4, heads = 2, hd = 16, rot = 12;
  RopeConfig rc;
  rc.head_dim = rot;
  rc.scaling = RopeConfig::Scaling::kLongRope;
  rc.ext_factors = {1.0, 1.5, 2.0, 3.0, 4.0, 8.0};
  std::vector<float> inv(rot / 2);
  rope_inv_freq(rc, inv.data());
  for (int64_t i = 0; i < rot / 2; ++i)
    EXPECT_NEAR(inv[i], 1.0 / (rc.ext_factors[i] * std::pow(10000.0, 2.0 * i / rot)), 1e-7) << i;
  std::vector<int32_t> pos{0, 3, 50, 4000};
  auto x = random_f32(n * heads * hd, rng);
  auto got = x, want = x;
  const float mscale = 1.19024f;
  rope(got.data(), n, heads, hd, pos.data(), inv.data(), rot, mscale);
  ref::rope(want.data(), n, heads, hd, pos.data(), inv.data(), rot, mscale);
  expect_close(got, want, 1e-6f, 1e-6f);
  for (int64_t r = 0; r < n * heads; ++r) {
    for (int64_t i = rot; i < hd; ++i) EXPECT_EQ(got[r * hd + i], x[r * hd + i]) << "pass-through dim " << i;
    for (int64_t i = 0; i < rot / 2; ++i) {  // each rotated pair's norm times mscale
      const float* a = &x[r * hd];
      const float* b = &got[r * hd];
      EXPECT_NEAR(mscale * mscale * (a[i] * a[i] + a[i + rot / 2] * a[i + rot / 2]),
                  b[i] * b[i] + b[i + rot / 2] * b[i + rot / 2], 1e-4);
    }
  }
}

// LongRoPE's two tables: the tokens marked use_long rotate with the long
// factors' frequencies, each other token with the short ones', as the
// reference does token by token with the one it takes.
TEST(Ops, LongRopeTakesTheLongTableWhereMarked) {
  std::mt19937 rng(9);
  const int64_t n = 5, heads = 3, hd = 8;
  RopeConfig rc;
  rc.head_dim = hd;
  rc.scaling = RopeConfig::Scaling::kLongRope;
  rc.ext_factors = {1.0, 1.2, 1.7, 2.5};
  std::vector<float> inv_short(hd / 2), inv_long(hd / 2);
  rope_inv_freq(rc, inv_short.data());
  rc.ext_factors = {1.0, 3.0, 9.0, 27.0};
  rope_inv_freq(rc, inv_long.data());
  const std::vector<int32_t> pos{14, 15, 16, 17, 3};
  const std::vector<uint8_t> use_long{0, 0, 1, 1, 1};
  auto x = random_f32(n * heads * hd, rng);
  auto got = x;
  rope(got.data(), n, heads, hd, pos.data(), inv_short.data(), hd, 1.5f, inv_long.data(), use_long.data());
  for (int64_t t = 0; t < n; ++t) {
    std::vector<float> want(x.begin() + t * heads * hd, x.begin() + (t + 1) * heads * hd);
    ref::rope(want.data(), 1, heads, hd, &pos[t], use_long[t] ? inv_long.data() : inv_short.data(), hd, 1.5f);
    expect_close(std::vector<float>(got.begin() + t * heads * hd, got.begin() + (t + 1) * heads * hd), want, 1e-6f,
                 1e-6f);
  }
  auto short_only = x;
  rope(short_only.data(), n, heads, hd, pos.data(), inv_short.data(), hd, 1.5f);
  EXPECT_EQ(std::vector<float>(short_only.begin(), short_only.begin() + 2 * heads * hd),
            std::vector<float>(got.begin(), got.begin() + 2 * heads * hd));
  EXPECT_NE(short_only, got);  // the marked tokens turned otherwise
}

TEST(Ops, Llama3RopeScalingBands) {
  // Llama-3.1-8B: theta 500000, factor 8, low 1, high 4, original 8192.
  RopeConfig rc;
  rc.head_dim = 128;
  rc.theta = 500000.0;
  rc.scaling = RopeConfig::Scaling::kLlama3;
  rc.factor = 8.0;
  rc.low_freq_factor = 1.0;
  rc.high_freq_factor = 4.0;
  rc.original_max_position = 8192;
  std::vector<float> inv(64), plain(64);
  rope_inv_freq(rc, inv.data());
  RopeConfig base = rc;
  base.scaling = RopeConfig::Scaling::kNone;
  rope_inv_freq(base, plain.data());
  for (int i = 0; i < 64; ++i) {
    const double wavelen = 2 * M_PI / plain[i];
    if (wavelen < 8192.0 / 4.0) {
      EXPECT_FLOAT_EQ(inv[i], plain[i]) << i;  // high frequencies untouched
    } else if (wavelen > 8192.0) {
      EXPECT_FLOAT_EQ(inv[i], static_cast<float>(plain[i] / 8.0)) << i;  // low frequencies divided
    } else {
      EXPECT_LT(inv[i], plain[i]);
      EXPECT_GT(inv[i], plain[i] / 8.0f);
    }
  }
}

// Bit equality, NaN with NaN.
bool same_bits(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  uint32_t ua, ub;
  std::memcpy(&ua, &a, 4);
  std::memcpy(&ub, &b, 4);
  return ua == ub;
}

// silu_mul and softmax take exp from core/fast_exp_ops.h in whole vectors
// and then element by element: every element, in the vector body or in the
// tail, has the scalar formula's bits (so a row's values never depend on
// where it starts or how long it is), edge inputs included.
TEST(Ops, SiluMulAndSoftmaxGiveTheScalarFastExpBitsInVectorsAndTail) {
  std::mt19937 rng(11);
  for (int64_t n : {1, 7, 16, 37, 1000, 70001}) {  // 70001: split across threads
    auto g = random_f32(n, rng, 12.0f), u = random_f32(n, rng);
    const float edges[] = {0.0f, -0.0f, 88.0f, -88.0f, 104.5f, -104.5f, 1e-40f, INFINITY, -INFINITY, NAN};
    for (size_t e = 0; e < std::size(edges); ++e) g[(e * 5) % n] = edges[e];
    std::vector<float> got(n);
    silu_mul(g.data(), u.data(), n, got.data());
    for (int64_t i = 0; i < n; ++i) {
      const float want = g[i] / (1.0f + fast_exp_scalar(-g[i])) * u[i];
      ASSERT_TRUE(same_bits(got[i], want)) << "n " << n << " i " << i << " g " << g[i] << ": " << got[i] << " vs " << want;
    }
    auto row = random_f32(n, rng, 30.0f);
    auto soft = row;
    softmax(soft.data(), 1, n);
    float mx = -INFINITY;
    for (float v : row) mx = std::max(mx, v);
    std::vector<float> want(n);
    float sum = 0.0f;
    for (int64_t i = 0; i < n; ++i) sum += (want[i] = fast_exp_scalar(row[i] - mx));
    for (int64_t i = 0; i < n; ++i) {
      want[i] *= 1.0f / sum;
      ASSERT_TRUE(same_bits(soft[i], want[i])) << "softmax n " << n << " i " << i;
    }
  }
}

TEST(Ops, SiluMulAndSoftmaxMatchReference) {
  std::mt19937 rng(4);
  auto g = random_f32(1000, rng, 4.0f), u = random_f32(1000, rng);
  std::vector<float> got(1000), want(1000);
  silu_mul(g.data(), u.data(), 1000, got.data());
  ref::silu_mul(g.data(), u.data(), 1000, want.data());
  expect_close(got, want, 1e-6f, 1e-7f);
  // GeGLU (gelu_pytorch_tanh): torch gives gelu(1.0, approximate="tanh") = 0.8411920070648193.
  gelu_tanh_mul(g.data(), u.data(), 1000, got.data());
  ref::gelu_tanh_mul(g.data(), u.data(), 1000, want.data());
  expect_close(got, want, 2e-6f, 1e-6f);  // f32 tanh saturates to -1 a little early: gelu(-5) ~ -1e-6
  const float one = 1.0f, two = 2.0f;
  float y = 0;
  gelu_tanh_mul(&one, &two, 1, &y);
  EXPECT_NEAR(y, 2.0f * 0.8411920070648193f, 1e-6f);
  auto s = random_f32(3 * 333, rng, 10.0f);
  auto s2 = s;
  softmax(s.data(), 3, 333);
  ref::softmax(s2.data(), 3, 333);
  expect_close(s, s2, 1e-5f, 1e-8f);
  double sum = 0;
  for (int i = 0; i < 333; ++i) sum += s[i];
  EXPECT_NEAR(sum, 1.0, 1e-5);
}

// OMP_NUM_THREADS, when set, caps what a rank asks for (so that the TSan
// pass, and a user who sets it, run the kernels on that many threads).
TEST(OpsThreads, OmpNumThreadsCapsTheRankShare) {
  const char* saved = std::getenv("OMP_NUM_THREADS");
  const std::string restore = saved ? saved : "";
  setenv("OMP_NUM_THREADS", "1", 1);
  set_num_threads(3);
  EXPECT_EQ(num_threads(), 1);
  setenv("OMP_NUM_THREADS", "2,1", 1);  // nested form: the first number counts
  set_num_threads(3);
  EXPECT_EQ(num_threads(), 2);
  set_num_threads(1);
  EXPECT_EQ(num_threads(), 1);
  unsetenv("OMP_NUM_THREADS");
  set_num_threads(3);
  EXPECT_EQ(num_threads(), 3);
  if (saved) setenv("OMP_NUM_THREADS", restore.c_str(), 1);
  set_num_threads(0);
}

}  // namespace
}  // namespace shardlm::backend
