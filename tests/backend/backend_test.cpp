// Every Backend implementation against the scalar reference kernels, through
// the interface the model uses. One parameterised suite; each backend this
// build has is an instance (CPU always; CUDA adds itself when built).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"

namespace shardlm::backend {
namespace {

std::vector<float> random_f32(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

// A host tensor of dtype holding `values` (rounded to dtype).
Tensor host_tensor(DType dtype, TensorShape shape, const std::vector<float>& values) {
  Tensor t = Tensor::host(dtype, shape);
  for (size_t i = 0; i < values.size(); ++i) store_from_f32(t.data(), dtype, i, values[i]);
  return t;
}

class BackendTest : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override { b_ = make_backend({GetParam(), 2}); }
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
    expect_close(to_host(y), want, 1e-4f);
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
  expect_close(to_host(hidden), sum, 1e-6f);
  expect_close(to_host(out), want, 1e-5f);
}

TEST_P(BackendTest, AttentionStepMatchesReference) {
  // bf16 and FP8 E4M3 (--kv-cache-dtype fp8) caches: written by the backend, read back by the reference.
  for (DType kv_dtype : {DType::kBF16, DType::kF8E4M3}) {
    SCOPED_TRACE(dtype_safetensors_name(kv_dtype));
    // Two sequences: one prefilling 3 tokens, one decoding after 5 cached.
    std::mt19937 rng(3);
    const int64_t n_kv = 2, group = 3, hd = 16, bs = 4, n_blocks = 6;
    const AttentionHeads heads{n_kv * group, 0, 0, group};
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
    b_->rope(q, inv_freq, meta);
    b_->rope(k, inv_freq, meta);
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
    expect_close(to_host(out), want, 1e-4f);
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

INSTANTIATE_TEST_SUITE_P(Cpu, BackendTest, ::testing::Values(Device{}),
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
