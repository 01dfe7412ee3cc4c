// Every Backend implementation against the scalar reference kernels, through
// the interface the model uses. One parameterised suite with an instance per
// backend: CPU, and CUDA, whose tests skip where no CUDA device exists (a
// build without CUDA, or a machine without a GPU: scripts/gpu-check.sh runs
// them on one, built as cuda_backend_interface_test). What a backend does not
// implement it must say through supports(OpArgs), and the test skips only that.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/moe_ops.h"
#include "core/error.h"
#include "random_inputs.h"

namespace shardlm::backend {
namespace {

using test_inputs::random_f32;

// A host tensor of dtype holding `values` (rounded to dtype).
Tensor host_tensor(DType dtype, TensorShape shape, const std::vector<float>& values) {
  Tensor t = Tensor::host(dtype, shape);
  for (size_t i = 0; i < values.size(); ++i) store_from_f32(t.data(), dtype, i, values[i]);
  return t;
}

class BackendTest : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override {
    if (!GetParam().is_cpu() && cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    b_ = make_backend({GetParam(), 2});
  }
  // A CPU backend computes in f32 throughout; a GPU rounds GEMM inputs, norm
  // and attention outputs to bf16 (8 bits of mantissa).
  float tol(float cpu_tol) const { return GetParam().is_cpu() ? cpu_tol : std::max(cpu_tol, 2e-2f); }
  // Whether the backend has the MoE ops. One without them must say so by
  // name (moe_route throws kUnsupported), and the CPU backend must have them.
  bool has_moe() {
    if (b_->supports(OpArgs::of(Op::kMoe))) return true;
    EXPECT_FALSE(GetParam().is_cpu()) << b_->unsupported(OpArgs::of(Op::kMoe));
    Tensor logits = on_device({1.0f, 2.0f}, {1, 2}), ids = b_->alloc(DType::kI32, {1, 1}),
           w = b_->alloc(DType::kF32, {1, 1});
    try {
      b_->moe_route(logits, 1, false, ids, w);
      ADD_FAILURE() << "moe_route ran where supports() said it does not";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
      EXPECT_NE(std::string(e.what()).find("not supported on"), std::string::npos) << e.what();
    }
    return false;
  }
  // The tensor on the backend's device (f32 activations are uploaded as is).
  Tensor on_device(const std::vector<float>& v, TensorShape shape) {
    Tensor t = b_->alloc(DType::kF32, shape);
    b_->upload(v.data(), t);
    return t;
  }
  std::vector<float> to_host(const Tensor& t) {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    b_->download(t, v.data());
    return v;
  }
  std::shared_ptr<Backend> b_;
};

void expect_close(const std::vector<float>& got, const std::vector<float>& want, float tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], tol * (1 + std::fabs(want[i]))) << i;
}

TEST_P(BackendTest, MatmulWithBiasMatchesReference) {
  std::mt19937 rng(1);
  for (DType wd : {DType::kF32, DType::kBF16}) {
    if (!b_->supports(OpArgs::dense_matmul(wd))) {  // CUDA keeps bf16 weights only
      EXPECT_FALSE(GetParam().is_cpu() || wd == DType::kBF16) << b_->unsupported(OpArgs::dense_matmul(wd));
      continue;
    }
    const int64_t n = 5, m = 37, k = 64;
    auto wv = random_f32(m * k, rng), bv = random_f32(m, rng), xv = random_f32(n * k, rng);
    Tensor w = b_->adopt_weight(host_tensor(wd, {m, k}, wv)), bias = b_->adopt_weight(host_tensor(wd, {m}, bv));
    Tensor x = on_device(xv, {n, k}), y = b_->alloc(DType::kF32, {n, m});
    b_->matmul(x, Linear{w, bias}, y);
    Tensor hw = host_tensor(wd, {m, k}, wv), hb = host_tensor(wd, {m}, bv);
    MatrixView mv{hw.data(), wd, m, k};
    VectorView bvw{hb.data(), wd, m};
    std::vector<float> want(static_cast<size_t>(n * m));
    ref::matmul(xv.data(), n, mv, &bvw, want.data());
    expect_close(to_host(y), want, tol(1e-4f));
  }
}

TEST_P(BackendTest, AddRmsNormFusesTheResidualAdd) {
  std::mt19937 rng(2);
  const int64_t rows = 3, d = 48;
  auto hv = random_f32(rows * d, rng), dv = random_f32(rows * d, rng), wv = random_f32(d, rng);
  Tensor hidden = on_device(hv, {rows, d}), delta = on_device(dv, {rows, d}), out = b_->alloc(DType::kF32, {rows, d});
  Tensor w = b_->adopt_weight(host_tensor(DType::kBF16, {d}, wv));
  b_->add_rms_norm(hidden, delta, w, 1e-6f, out);
  std::vector<float> sum(hv.size()), want(hv.size());
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = hv[i] + dv[i];
  Tensor hw = host_tensor(DType::kBF16, {d}, wv);
  ref::rms_norm(sum.data(), rows, VectorView{hw.data(), DType::kBF16, d}, 1e-6f, want.data());
  expect_close(to_host(hidden), sum, 1e-6f);  // an f32 add on every device
  expect_close(to_host(out), want, tol(1e-5f));
}

TEST_P(BackendTest, AttentionStepMatchesReference) {
  // bf16 and FP8 E4M3 (--kv-cache-dtype fp8) caches: written by the backend, read back by the reference.
  for (DType kv_dtype : {DType::kBF16, DType::kF8E4M3}) {
    SCOPED_TRACE(dtype_safetensors_name(kv_dtype));
    // Two sequences: one prefilling 3 tokens, one decoding after 5 cached.
    std::mt19937 rng(3);
    const int64_t n_kv = 2, group = 3, hd = 64, bs = 4, n_blocks = 6;
    const AttentionHeads heads{n_kv * group, 0, 0, group};
    if (!b_->supports(OpArgs::attention(heads, hd, kv_dtype))) {  // CUDA: a bf16 cache only
      EXPECT_FALSE(GetParam().is_cpu() || kv_dtype == DType::kBF16)
          << b_->unsupported(OpArgs::attention(heads, hd, kv_dtype));
      continue;
    }
    StepMetadata meta;
    std::vector<int32_t> ids_a{1, 2, 3}, ids_b{4}, table_a{0}, table_b{2, 5};
    meta.add_seq(ids_a, 0, table_a, true);
    meta.add_seq(ids_b, 5, table_b, true);
    meta.finish();
    ASSERT_EQ(meta.n_tokens(), 4);
    ASSERT_EQ(meta.positions()[3], 5);
    ASSERT_EQ(meta.logit_rows()[0], 2);
    ASSERT_EQ(meta.logit_rows()[1], 3);
    const int64_t n = meta.n_tokens();
    Tensor k_cache = b_->alloc(kv_dtype, {n_blocks, bs, n_kv, hd}), v_cache = b_->alloc(kv_dtype, {n_blocks, bs, n_kv, hd});
    KvLayerView cache{k_cache.data(), v_cache.data(), kv_dtype, n_blocks, bs, n_kv, hd};
    // Sequence b's 5 cached positions first, as earlier steps would have written them.
    StepMetadata past;
    std::vector<int32_t> ids_past{9, 9, 9, 9, 9};
    past.add_seq(ids_past, 0, table_b, false);
    past.finish();
    b_->begin_step(past);
    b_->kv_cache_write(cache, past, on_device(random_f32(5 * n_kv * hd, rng), {5, n_kv, hd}),
                       on_device(random_f32(5 * n_kv * hd, rng), {5, n_kv, hd}));
    b_->begin_step(meta);
    auto qv = random_f32(n * heads.n_q_heads * hd, rng), kv = random_f32(n * n_kv * hd, rng),
         vv = random_f32(n * n_kv * hd, rng);
    Tensor q = on_device(qv, {n, heads.n_q_heads, hd}), k = on_device(kv, {n, n_kv, hd}), v = on_device(vv, {n, n_kv, hd});
    std::vector<float> inv(hd / 2);
    rope_inv_freq(RopeConfig{hd}, inv.data());
    Tensor inv_freq = on_device(inv, {hd / 2});
    b_->rope(q, inv_freq, meta, 1.0f);
    b_->rope(k, inv_freq, meta, 1.0f);
    b_->kv_cache_write(cache, meta, k, v);
    Tensor out = b_->alloc(DType::kF32, {n, heads.n_q_heads, hd});
    b_->paged_attention(q, cache, meta, heads, out);
    // Reference: the same rope, then ref attention over the same cache.
    std::vector<float> q_ref = qv;
    ref::rope(q_ref.data(), n, heads.n_q_heads, hd, meta.positions(), inv.data());
    std::vector<float> want(static_cast<size_t>(n * heads.n_q_heads * hd));
    std::vector<uint8_t> k_host(k_cache.nbytes()), v_host(v_cache.nbytes());
    b_->download(k_cache, k_host.data());
    b_->download(v_cache, v_host.data());
    KvLayerView host_cache{k_host.data(), v_host.data(), kv_dtype, n_blocks, bs, n_kv, hd};
    ref::paged_attention(q_ref.data(), host_cache, meta.seqs(), meta.n_seqs(), heads, want.data());
    expect_close(to_host(out), want, tol(1e-4f));
    // Logit rows: the last token of each sequence.
    Tensor rows = b_->alloc(DType::kF32, {2, heads.n_q_heads * hd});
    b_->gather_logit_rows(out.reshape({n, heads.n_q_heads * hd}), meta, rows);
    auto got_rows = to_host(rows), all = to_host(out);
    const int64_t d = heads.n_q_heads * hd;
    for (int64_t i = 0; i < d; ++i) {
      ASSERT_EQ(got_rows[i], all[2 * d + i]);
      ASSERT_EQ(got_rows[d + i], all[3 * d + i]);
    }
  }
}

// Sliding windows, explicit softmax scales and the head sizes of Mistral
// (128), Phi-3-mini (96) and Gemma 3 (256): a mixed step (a prompt and a
// chunk after 600 cached positions: CUDA's prefill kernel), then an
// all-decode step (CUDA's split-K decode: 610 positions are two 512-token
// partitions, or one window's worth), on the backend's cache, against ref.
TEST_P(BackendTest, AttentionWindowsScalesAndHeadSizesMatchReference) {
  struct Case {
    int64_t head_dim, window;
    float scale;
  };
  for (const Case& c : {Case{64, 0, 0.0f}, Case{96, 40, 0.0f}, Case{128, 520, 0.0f}, Case{256, 0, 0.0625f},
                        Case{256, 100, 0.0625f}}) {
    SCOPED_TRACE(testing::Message() << "head_dim " << c.head_dim << ", window " << c.window << ", scale " << c.scale);
    std::mt19937 rng(static_cast<uint32_t>(c.head_dim + c.window));
    const int64_t n_kv = 2, group = 2, hd = c.head_dim, bs = 16, n_blocks = 42;
    const AttentionHeads heads{n_kv * group, 0, 0, group, c.scale, c.window};
    ASSERT_TRUE(b_->supports(OpArgs::attention(heads, hd, DType::kBF16))) << b_->unsupported(OpArgs::attention(heads, hd, DType::kBF16));
    Tensor k_cache = b_->alloc(DType::kBF16, {n_blocks, bs, n_kv, hd}),
           v_cache = b_->alloc(DType::kBF16, {n_blocks, bs, n_kv, hd});
    const KvLayerView cache{k_cache.data(), v_cache.data(), DType::kBF16, n_blocks, bs, n_kv, hd};
    std::vector<int32_t> table_a{0, 1, 2}, table_b(39);
    for (size_t i = 0; i < table_b.size(); ++i) table_b[i] = static_cast<int32_t>(41 - i);  // any order
    // Sequence b's first 600 positions, as earlier steps would have written them.
    StepMetadata past;
    std::vector<int32_t> ids_past(600, 9);
    past.add_seq(ids_past, 0, table_b, false);
    past.finish();
    b_->begin_step(past);
    b_->kv_cache_write(cache, past, on_device(random_f32(600 * n_kv * hd, rng), {600, n_kv, hd}),
                       on_device(random_f32(600 * n_kv * hd, rng), {600, n_kv, hd}));
    auto run_step = [&](const StepMetadata& meta) {
      b_->begin_step(meta);
      const int64_t n = meta.n_tokens();
      b_->kv_cache_write(cache, meta, on_device(random_f32(n * n_kv * hd, rng), {n, n_kv, hd}),
                         on_device(random_f32(n * n_kv * hd, rng), {n, n_kv, hd}));
      auto qv = random_f32(n * heads.n_q_heads * hd, rng);
      Tensor out = b_->alloc(DType::kF32, {n, heads.n_q_heads, hd});
      b_->paged_attention(on_device(qv, {n, heads.n_q_heads, hd}), cache, meta, heads, out);
      std::vector<uint8_t> k_host(k_cache.nbytes()), v_host(v_cache.nbytes());
      b_->download(k_cache, k_host.data());
      b_->download(v_cache, v_host.data());
      const KvLayerView host_cache{k_host.data(), v_host.data(), DType::kBF16, n_blocks, bs, n_kv, hd};
      std::vector<float> want(static_cast<size_t>(n * heads.n_q_heads * hd));
      ref::paged_attention(qv.data(), host_cache, meta.seqs(), meta.n_seqs(), heads, want.data());
      expect_close(to_host(out), want, tol(1e-4f));
    };
    StepMetadata mixed;
    std::vector<int32_t> ids_a(37, 1), ids_b(9, 2);
    mixed.add_seq(ids_a, 0, table_a, true);
    mixed.add_seq(ids_b, 600, table_b, true);
    mixed.finish();
    run_step(mixed);
    StepMetadata decode;
    std::vector<int32_t> one{3};
    decode.add_seq(one, 37, table_a, true);
    decode.add_seq(one, 609, table_b, true);
    decode.finish();
    run_step(decode);
  }
}

// Prompt logprobs: a chunk's logit rows are its last n_logit_rows tokens,
// in position order; gather_logit_rows takes exactly those rows.
TEST_P(BackendTest, GatherTakesEveryLogitRowOfAPromptChunk) {
  StepMetadata meta;
  std::vector<int32_t> ids_a{1, 2, 3}, ids_b{4, 5}, table_a{0}, table_b{1, 2};
  meta.add_seq(ids_a, 0, table_a, 3);   // every position
  meta.add_seq(ids_b, 5, table_b, 1);   // the sampled one
  meta.finish();
  ASSERT_EQ(meta.n_logits(), 4);
  EXPECT_EQ(std::vector<int32_t>(meta.logit_rows(), meta.logit_rows() + 4), (std::vector<int32_t>{0, 1, 2, 4}));
  const int64_t d = 8;
  Tensor x = b_->alloc(DType::kF32, {meta.n_tokens(), d}), out = b_->alloc(DType::kF32, {meta.n_logits(), d});
  std::vector<float> host(static_cast<size_t>(meta.n_tokens() * d));
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i);
  b_->upload(host.data(), x);
  b_->begin_step(meta);
  b_->gather_logit_rows(x, meta, out);
  std::vector<float> got(static_cast<size_t>(meta.n_logits() * d));
  b_->download(out, got.data());
  const int32_t want_rows[] = {0, 1, 2, 4};
  for (int r = 0; r < 4; ++r)
    for (int64_t c = 0; c < d; ++c) EXPECT_EQ(got[size_t(r * d + c)], float(want_rows[r] * d + c)) << r << "," << c;
  StepMetadata bad;
  EXPECT_THROW(bad.add_seq(ids_b, 0, table_b, 3), Error);  // more rows than tokens
}

TEST_P(BackendTest, EmbedRefusesIdsOutsideTheVocabulary) {
  Tensor table = b_->adopt_weight(host_tensor(DType::kBF16, {4, 8}, std::vector<float>(32, 1.0f)));
  StepMetadata meta;
  std::vector<int32_t> ids{3, 7}, table_ids{0};
  meta.add_seq(ids, 0, table_ids, true);
  meta.finish();
  Tensor out = b_->alloc(DType::kF32, {2, 8});
  // Rows 4..7 live on another rank: zeros here.
  StepMetadata one;
  std::vector<int32_t> in_range{3, 5};
  one.add_seq(in_range, 0, table_ids, true);
  one.finish();
  b_->embed(table, 0, 4, 8, one, out);
  auto got = to_host(out);
  EXPECT_EQ(got[0], 1.0f);
  EXPECT_EQ(got[8], 0.0f);
  try {
    b_->embed(table, 0, 4, 6, meta, out);
    FAIL() << "id 7 of a 6-token vocabulary was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("token id 7"), std::string::npos) << e.what();
  }
}

TEST_P(BackendTest, AllocatedBytesAreCountedAndReturned) {
  if (!GetParam().is_cpu())
    GTEST_SKIP() << "a GPU's bytes are the driver's measurement (allocation granularity included): "
                    "cuda_backend_test's AllocationsAreMeasuredAndWeightsStayBf16 checks them";
  const int64_t before = b_->allocated_bytes();
  {
    Tensor a = b_->alloc(DType::kBF16, {1000, 1000});  // over the mmap threshold
    Tensor c = b_->alloc(DType::kF32, {3});
    EXPECT_EQ(b_->allocated_bytes() - before, 2000000 + 12);
    // A view adopted as a weight costs nothing; an owned host buffer is copied and counted.
    std::vector<uint16_t> mapped(64);
    Tensor view = b_->adopt_weight(Tensor::view(mapped.data(), DType::kBF16, {8, 8}));
    if (GetParam().is_cpu()) EXPECT_EQ(view.data(), mapped.data());
    Tensor owned = b_->adopt_weight(Tensor::host(DType::kBF16, {8, 8}));
    EXPECT_GE(b_->allocated_bytes() - before, 2000000 + 12 + 128);
  }
  EXPECT_EQ(b_->allocated_bytes(), before);
}

TEST_P(BackendTest, MoeRouteTakesTopKOfTheSoftmax) {
  if (!has_moe()) GTEST_SKIP() << b_->unsupported(OpArgs::of(Op::kMoe));
  // Row 0 by hand: logits 1, 3, 2, 3 -> experts 1 and 3 (the tie goes to the lower id first),
  // each e^3 / (e + 2e^3 + e^2); renormalised, 1/2 each. Row 1: random, against ref.
  std::mt19937 rng(7);
  const int64_t n_experts = 4, k = 2;
  std::vector<float> lv{1, 3, 2, 3};
  auto r1 = random_f32(n_experts, rng);
  lv.insert(lv.end(), r1.begin(), r1.end());
  for (bool renorm : {false, true}) {
    Tensor logits = on_device(lv, {2, n_experts});
    Tensor ids = b_->alloc(DType::kI32, {2, k}), w = b_->alloc(DType::kF32, {2, k});
    b_->moe_route(logits, k, renorm, ids, w);
    std::vector<int32_t> got_ids(4);
    b_->download(ids, got_ids.data());
    auto got_w = to_host(w);
    EXPECT_EQ(got_ids[0], 1);
    EXPECT_EQ(got_ids[1], 3);
    const double p = std::exp(3.0) / (std::exp(1.0) + 2 * std::exp(3.0) + std::exp(2.0));
    EXPECT_NEAR(got_w[0], renorm ? 0.5 : p, 1e-6);
    EXPECT_NEAR(got_w[1], renorm ? 0.5 : p, 1e-6);
    std::vector<int32_t> want_ids(4);
    std::vector<float> want_w(4);
    ref::moe_route(lv.data(), 2, n_experts, k, renorm, want_ids.data(), want_w.data());
    EXPECT_EQ(got_ids, want_ids);
    expect_close(got_w, want_w, tol(1e-6f));
    EXPECT_GT(lv[4 + got_ids[2]], lv[4 + got_ids[3]]);
  }
}

TEST_P(BackendTest, MoeExpertsGroupedMatchTokenByTokenReference) {
  if (!has_moe()) GTEST_SKIP() << b_->unsupported(OpArgs::of(Op::kMoe));
  // 9 tokens, top-3 of 8 experts; the rank holds experts [2, 7) (uneven EP),
  // BF16 and F32 weights. Token 0 routes only to experts it does not hold.
  std::mt19937 rng(8);
  const int64_t n = 9, hidden = 32, inter = 24, k = 3, n_experts = 8, begin = 2, n_local = 5;
  auto xv = random_f32(n * hidden, rng);
  std::vector<int32_t> idv(static_cast<size_t>(n * k));
  std::vector<float> wv(static_cast<size_t>(n * k));
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int32_t> perm(n_experts);
    for (int32_t e = 0; e < n_experts; ++e) perm[e] = e;
    std::shuffle(perm.begin(), perm.end(), rng);
    if (t == 0) perm = {0, 1, 7};
    for (int64_t j = 0; j < k; ++j) {
      idv[t * k + j] = perm[j];
      wv[t * k + j] = std::uniform_real_distribution<float>(0.1f, 1.0f)(rng);
    }
  }
  for (DType wd : {DType::kBF16, DType::kF32}) {
    std::vector<ExpertLinears> experts;
    std::vector<Tensor> host;  // ref's copies, same rounding
    std::vector<ExpertMatrices> views;
    for (int64_t e = 0; e < n_local; ++e) {
      auto g = random_f32(inter * hidden, rng), u = random_f32(inter * hidden, rng), d = random_f32(hidden * inter, rng);
      experts.push_back({b_->adopt_weight(host_tensor(wd, {inter, hidden}, g)),
                         b_->adopt_weight(host_tensor(wd, {inter, hidden}, u)),
                         b_->adopt_weight(host_tensor(wd, {hidden, inter}, d))});
      host.push_back(host_tensor(wd, {inter, hidden}, g));
      host.push_back(host_tensor(wd, {inter, hidden}, u));
      host.push_back(host_tensor(wd, {hidden, inter}, d));
      const size_t i = host.size() - 3;
      views.push_back({{host[i].data(), wd, inter, hidden}, {host[i + 1].data(), wd, inter, hidden},
                       {host[i + 2].data(), wd, hidden, inter}});
    }
    Tensor x = on_device(xv, {n, hidden}), w = on_device(wv, {n, k}), out = b_->alloc(DType::kF32, {n, hidden});
    Tensor ids = b_->alloc(DType::kI32, {n, k});
    b_->upload(idv.data(), ids);
    b_->moe_experts(x, ids, w, experts.data(), n_local, begin, out);
    std::vector<float> want(static_cast<size_t>(n * hidden));
    ref::moe_experts(xv.data(), n, hidden, idv.data(), wv.data(), k, views.data(), begin, n_local, want.data());
    auto got = to_host(out);
    expect_close(got, want, tol(1e-4f));
    for (int64_t i = 0; i < hidden; ++i) ASSERT_EQ(got[i], 0.0f) << "token 0 has no expert here";
    float norm = 0;
    for (float v : want) norm += std::fabs(v);
    EXPECT_GT(norm, 1.0f);
  }
}

// The one capability query: what the CPU runs, and a refusal that names the
// op, the device and the reason.
TEST(BackendSupports, RefusalNamesTheOpTheDeviceAndTheReason) {
  auto cpu = make_backend({Device{}, 1});
  EXPECT_TRUE(cpu->supports(OpArgs::of(Op::kMoe)));
  EXPECT_TRUE(cpu->supports(OpArgs::dense_matmul(DType::kF16)));
  EXPECT_FALSE(cpu->supports(OpArgs::dense_matmul(DType::kI32)));
  EXPECT_NE(cpu->unsupported(OpArgs::dense_matmul(DType::kI32)).find("int32"), std::string::npos)
      << cpu->unsupported(OpArgs::dense_matmul(DType::kI32));
  // Any window, scale and head size, over any cache dtype the CPU stores.
  EXPECT_TRUE(cpu->supports(OpArgs::attention(AttentionHeads{4, 0, 0, 2, 0.1f, 7}, 80, DType::kF8E4M3)));
  EXPECT_FALSE(cpu->supports(OpArgs::attention(AttentionHeads{4, 0, 0, 2}, 64, DType::kI32)));
  EXPECT_FALSE(cpu->supports(OpArgs::of(Op::kSampleRows)));
  try {
    cpu->require(OpArgs::of(Op::kSampleRows));
    FAIL() << "the CPU has no device sampler";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    const std::string what = e.what();
    EXPECT_NE(what.find("sample_rows (sampling on the device) is not supported on cpu"), std::string::npos) << what;
    EXPECT_NE(what.find("sampled on the host"), std::string::npos) << what;
  }
  EXPECT_EQ(describe(OpArgs::attention(AttentionHeads{4, 0, 0, 2, 0.0625f, 1024}, 256, DType::kBF16)),
            "paged_attention (head_dim 256, sliding window 1024, softmax scale 0.0625, bfloat16 KV cache)");
}

// The public ops check shapes once, before any device sees them: a backend
// whose do_<op>s check nothing (this one counts its calls) still refuses a
// mismatch, and a good call reaches it exactly once.
class CountingBackend final : public Backend {
 public:
  int calls = 0;
  Device device() const override { return Device{}; }
  std::string name() const override { return "counting"; }
  DType activation_dtype() const override { return DType::kF32; }
  Tensor alloc(DType d, TensorShape s) override { return Tensor::host(d, s); }
  int64_t allocated_bytes() const override { return 0; }
  Tensor adopt_weight(Tensor host) override { return host; }
  void upload(const void*, Tensor&) override {}
  void download(const Tensor&, void*) override {}
  void synchronize() override {}
  void begin_step(const StepMetadata&) override {}

 protected:
  void do_embed(const Tensor&, int64_t, int64_t, int64_t, const StepMetadata&, Tensor&) override { ++calls; }
  void do_matmul(const Tensor&, const Linear&, Tensor&) override { ++calls; }
  void do_rms_norm(const Tensor&, const NormWeight&, float, Tensor&) override { ++calls; }
  void do_add_rms_norm(Tensor&, const Tensor&, const NormWeight&, float, Tensor&) override { ++calls; }
  void do_add(Tensor&, const Tensor&) override { ++calls; }
  void do_scale(Tensor&, float) override { ++calls; }
  void do_rope(Tensor&, const Tensor&, const StepMetadata&, float) override { ++calls; }
  void do_silu_mul(const Tensor&, const Tensor&, Tensor&) override { ++calls; }
  void do_gelu_tanh_mul(const Tensor&, const Tensor&, Tensor&) override { ++calls; }
  void do_kv_cache_write(const KvLayerView&, const StepMetadata&, const Tensor&, const Tensor&) override { ++calls; }
  void do_paged_attention(const Tensor&, const KvLayerView&, const StepMetadata&, const AttentionHeads&,
                          Tensor&) override {
    ++calls;
  }
  void do_gather_logit_rows(const Tensor&, const StepMetadata&, Tensor&) override { ++calls; }
};

TEST(BackendShapeChecks, ThePublicOpRefusesAMismatchBeforeTheDevice) {
  CountingBackend b;
  auto expect_internal = [&](const std::function<void()>& call, const char* what) {
    try {
      call();
      ADD_FAILURE() << what << ": a mismatch was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInternal) << what;
    }
  };
  Tensor x = Tensor::host(DType::kF32, {3, 8}), y = Tensor::host(DType::kF32, {3, 5}), w = Tensor::host(DType::kF32, {5, 8});
  Tensor w_bad = Tensor::host(DType::kF32, {5, 7}), bias_bad = Tensor::host(DType::kF32, {4});
  Tensor norm_w = Tensor::host(DType::kF32, {8}), out = Tensor::host(DType::kF32, {3, 8});
  b.matmul(x, Linear{w, {}}, y);
  EXPECT_EQ(b.calls, 1);
  expect_internal([&] { b.matmul(x, Linear{w_bad, {}}, y); }, "matmul in");
  expect_internal([&] { b.matmul(x, Linear{w, bias_bad}, y); }, "matmul bias");
  expect_internal([&] { b.matmul(x, Linear{w, {}}, out); }, "matmul out");
  expect_internal([&] { b.rms_norm(x, NormWeight(Tensor::host(DType::kF32, {7})), 1e-6f, out); }, "rms_norm weight");
  expect_internal([&] { b.add_rms_norm(out, y, norm_w, 1e-6f, out); }, "add_rms_norm delta");
  expect_internal([&] { b.add(out, y); }, "add");
  expect_internal([&] { b.silu_mul(x, y, out); }, "silu_mul");
  expect_internal([&] { b.gelu_tanh_mul(x, x, y); }, "gelu_tanh_mul");
  StepMetadata meta;
  std::vector<int32_t> ids{1, 2, 3}, table{0};
  meta.add_seq(ids, 0, table, true);
  meta.finish();
  const KvLayerView cache{nullptr, nullptr, DType::kBF16, 1, 16, 2, 4};
  const AttentionHeads heads{4, 0, 0, 2};
  Tensor q = Tensor::host(DType::kF32, {3, 4, 4}), kv = Tensor::host(DType::kF32, {3, 2, 4});
  b.kv_cache_write(cache, meta, kv, kv);
  b.paged_attention(q, cache, meta, heads, q);
  EXPECT_EQ(b.calls, 3);
  expect_internal([&] { b.kv_cache_write(cache, meta, kv, q); }, "kv_cache_write v");
  expect_internal([&] { b.paged_attention(q, cache, meta, heads, kv); }, "paged_attention out");
  expect_internal([&] { b.rope(x, norm_w, meta, 1.0f); }, "rope x");
  expect_internal([&] { b.gather_logit_rows(y, meta, out); }, "gather_logit_rows out");
  expect_internal([&] { b.embed(w, 0, 4, 8, meta, out); }, "embed table");
  EXPECT_EQ(b.calls, 3) << "a mismatched call reached the device";
  // Ids outside the vocabulary are the caller's input: kInvalidArgument, also before the device.
  EXPECT_THROW(b.embed(Tensor::host(DType::kF32, {2, 8}), 0, 2, 2, meta, out), Error);
  EXPECT_EQ(b.calls, 3);
}

// matmul_many on a backend that does not group (the base's default, which
// CUDA keeps): one do_matmul per output, and every output's shapes checked
// before the first runs.
TEST(BackendShapeChecks, MatmulManyIsOneMatmulPerOutputByDefault) {
  CountingBackend b;
  Tensor x = Tensor::host(DType::kF32, {3, 8}), w5 = Tensor::host(DType::kF32, {5, 8});
  Tensor w2 = Tensor::host(DType::kF32, {2, 8}), y5 = Tensor::host(DType::kF32, {3, 5});
  Tensor y2 = Tensor::host(DType::kF32, {3, 2}), y_bad = Tensor::host(DType::kF32, {3, 4});
  const Linear l5{w5, {}}, l2{w2, {}};
  const MatmulOut good[] = {{&l5, &y5}, {&l2, &y2}, {&l2, &y2}};
  b.matmul_many(x, good);
  EXPECT_EQ(b.calls, 3);
  const MatmulOut bad[] = {{&l5, &y5}, {&l2, &y_bad}};
  try {
    b.matmul_many(x, bad);
    ADD_FAILURE() << "matmul_many accepted y " << y_bad.describe() << " for a [2, 8] weight";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInternal);
  }
  EXPECT_EQ(b.calls, 3) << "an output ran before a later one's shapes were checked";
}

INSTANTIATE_TEST_SUITE_P(Cpu, BackendTest, ::testing::Values(Device{}),
                         [](const auto& info) { return info.param.is_cpu() ? "cpu" : "cuda"; });
INSTANTIATE_TEST_SUITE_P(Cuda, BackendTest, ::testing::Values(Device{DeviceKind::kCuda, 0}),
                         [](const auto& info) { return info.param.is_cpu() ? "cpu" : "cuda"; });

TEST(MakeBackend, CudaWithoutTheBuildFlagIsRefusedNamingIt) {
#if !defined(SHARDLM_HAVE_CUDA)
  try {
    make_backend({Device{DeviceKind::kCuda, 0}});
    FAIL() << "a CUDA backend from a build without CUDA";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("-DSHARDLM_CUDA=ON"), std::string::npos) << e.what();
  }
#endif
}

}  // namespace
}  // namespace shardlm::backend
