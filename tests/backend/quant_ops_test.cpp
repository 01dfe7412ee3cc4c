// The quantized matmul kernels (AWQ, GPTQ 4/8-bit incl. act-order, FP8
// block/per-tensor/per-channel) against a matmul on dequantized weights. The
// parts are made by the loader's round-to-nearest packer (what make-model
// writes); the dequantized oracle is the loader's dequantize_linear, which
// shares no code with the kernels, and the backend's own ref::dequantize must
// agree with it bit for bit. Through the Backend interface, as the model calls it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/cpu_isa.h"
#include "backend/cpu/quant_ops.h"
#include "backend/cpu/quant_ops_isa.h"
#include "core/error.h"
#include "loader/quant_config.h"
#include "loader/quant_pack.h"

namespace shardlm::backend {
namespace {

struct Case {
  std::string name;
  std::string format;   // published_quant_config format, or "fp8-tensor" / "fp8-channel"
  int64_t group = 128;
  bool desc_act = false;
  bool sym = true;
  DType scales = DType::kF16;
  int64_t n_out = 136, n_in = 256;  // 17 words of 8 channels: a partial AWQ block; 8.5 GPTQ blocks of 16
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

struct Packed {
  QuantConfig cfg;
  std::map<QuantPart, std::vector<uint8_t>> bytes;
  std::map<QuantPart, std::vector<int64_t>> shapes;
  std::map<QuantPart, DType> dtypes;
};

Packed pack(const Case& c, const std::vector<float>& w) {
  Packed p;
  const std::string fmt = c.format.rfind("fp8", 0) == 0 ? "fp8" : c.format;
  p.cfg = published_quant_config(fmt, c.group, c.desc_act, c.sym, "test");
  p.cfg.scales_dtype = c.scales;
  const int64_t N = c.n_out, K = c.n_in;
  std::vector<TensorSpec> parts;
  auto part = [&](QuantPart qp, std::vector<int64_t> shape, DType d) {
    TensorSpec t{"m." + std::string(quant_part_name(qp)), shape};
    t.part = qp;
    t.dtypes = {d};
    parts.push_back(t);
    p.shapes[qp] = shape;
    p.dtypes[qp] = d;
  };
  const int64_t pf = p.cfg.pack_factor(), G = p.cfg.n_groups(K);
  switch (p.cfg.method) {
    case QuantMethod::kAwq:
      part(QuantPart::kQWeight, {K, N / pf}, DType::kI32);
      part(QuantPart::kQZeros, {G, N / pf}, DType::kI32);
      part(QuantPart::kScales, {G, N}, c.scales);
      break;
    case QuantMethod::kGptq:
      part(QuantPart::kQWeight, {K / pf, N}, DType::kI32);
      part(QuantPart::kQZeros, {G, N / pf}, DType::kI32);
      part(QuantPart::kScales, {G, N}, c.scales);
      part(QuantPart::kGIdx, {K}, DType::kI32);
      break;
    default:
      part(QuantPart::kFp8Weight, {N, K}, DType::kF8E4M3);
      if (c.format == "fp8") {
        part(QuantPart::kScaleInv, {(N + 127) / 128, (K + 127) / 128}, c.scales);
      } else {
        p.cfg.weight_block_size.clear();
        part(QuantPart::kScaleInv, c.format == "fp8-channel" ? std::vector<int64_t>{N} : std::vector<int64_t>{},
             c.scales);
      }
  }
  if (c.format == "fp8-channel") {  // the packer writes blocks or one scale: per channel by hand
    std::vector<float> s(static_cast<size_t>(N));
    std::vector<uint8_t> q(static_cast<size_t>(N * K)), sb(static_cast<size_t>(N) * dtype_size(c.scales));
    for (int64_t n = 0; n < N; ++n) {
      float amax = 0;
      for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(w[n * K + k]));
      store_from_f32(sb.data(), c.scales, n, amax / 448.0f);
      s[n] = load_as_f32(sb.data(), c.scales, n);
      for (int64_t k = 0; k < K; ++k) q[n * K + k] = f32_to_f8e4m3(w[n * K + k] / s[n]);
    }
    p.bytes[QuantPart::kFp8Weight] = q;
    p.bytes[QuantPart::kScaleInv] = sb;
  } else {
    p.bytes = quantize_linear(p.cfg, w.data(), N, K, parts);
  }
  return p;
}

Tensor part_tensor(const Packed& p, QuantPart qp) {
  const auto& b = p.bytes.at(qp);
  Tensor t = Tensor::host(p.dtypes.at(qp), TensorShape{std::span<const int64_t>(p.shapes.at(qp))});
  std::memcpy(t.data(), b.data(), b.size());
  return t;
}

Linear linear(const Case& c, const Packed& p) {
  Linear l;
  QuantizedWeight& q = l.quant;
  q.n_out = c.n_out;
  q.n_in = c.n_in;
  q.bits = p.cfg.bits;
  switch (p.cfg.method) {
    case QuantMethod::kAwq: q.scheme = WeightScheme::kAwq; break;
    case QuantMethod::kGptq: q.scheme = WeightScheme::kGptq; break;
    default: q.scheme = WeightScheme::kFp8; q.bits = 8;
  }
  if (q.scheme == WeightScheme::kFp8) {
    l.weight = part_tensor(p, QuantPart::kFp8Weight);
    q.scales = part_tensor(p, QuantPart::kScaleInv);
    if (!p.cfg.weight_block_size.empty()) {
      q.block_n = p.cfg.weight_block_size[0];
      q.block_k = p.cfg.weight_block_size[1];
    } else {
      q.block_n = c.format == "fp8-channel" ? 1 : c.n_out;
      q.block_k = c.n_in;
    }
    return l;
  }
  q.group_size = p.cfg.group_rows(c.n_in);
  q.zero_offset = p.cfg.method == QuantMethod::kGptq ? p.cfg.zero_offset : 0;
  q.qweight = part_tensor(p, QuantPart::kQWeight);
  q.qzeros = part_tensor(p, QuantPart::kQZeros);
  q.scales = part_tensor(p, QuantPart::kScales);
  if (q.scheme == WeightScheme::kGptq) q.g_idx = part_tensor(p, QuantPart::kGIdx);
  return l;
}

std::vector<float> oracle_weight(const Case& c, const Packed& p) {
  std::map<QuantPart, QuantPartView> views;
  for (const auto& [qp, b] : p.bytes) views[qp] = {b.data(), p.dtypes.at(qp), p.shapes.at(qp)};
  if (c.format == "fp8-channel") {  // dequantize_linear's per-channel branch reads [N]
    views[QuantPart::kScaleInv].shape = {c.n_out};
  }
  return dequantize_linear(p.cfg, views, c.n_out, c.n_in);
}

class QuantMatmulTest : public ::testing::TestWithParam<Case> {};

TEST_P(QuantMatmulTest, MatchesMatmulOnDequantizedWeights) {
  const Case c = GetParam();
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  std::vector<float> w(static_cast<size_t>(c.n_out * c.n_in));
  for (auto& v : w) v = dist(rng);
  const Packed p = pack(c, w);
  const Linear l = linear(c, p);
  const std::vector<float> deq = oracle_weight(c, p);
  // The backend's reference unpacking equals the loader's, element for element.
  std::vector<float> mine(deq.size());
  ref::dequantize(quant_view(l.quant, l.weight), mine.data());
  for (size_t i = 0; i < deq.size(); ++i) ASSERT_EQ(mine[i], deq[i]) << c.name << " element " << i;

  auto b = make_backend({Device{}, 2});
  ASSERT_TRUE(b->supports(OpArgs::quant_matmul(l.quant.scheme, l.quant.bits)));
  std::normal_distribution<float> xd(0.0f, 1.0f);
  const QuantMatrixView view = quant_view(l.quant, l.weight);
  // The int8-activation kernels run wherever the build has them (AVX-512 VNNI)
  // on AWQ and on GPTQ whose groups follow the rows; elsewhere kInt8 is kF32.
  const bool int8_runs = int8_activations_run(view);
  // SHARDLM_ISA below avx512 (a ctest run sets avx2 and scalar) turns them off.
  const bool expect_int8 = (c.format == "awq" || c.format == "gptq" || c.format == "gptq-int8") && !c.desc_act &&
                           active_cpu_isa() >= CpuIsa::kAvx512;
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
  EXPECT_EQ(int8_runs, expect_int8) << c.name;
#else
  EXPECT_FALSE(int8_runs) << c.name << ": no VNNI in this build";
  (void)expect_int8;
#endif
  for (int64_t n : {1, 2, 3, 5, 9, 17, 33}) {  // GEMV, the GEMM token blocks (8, 4, 2, 1), fp8 packed GEMM
    std::vector<float> x(static_cast<size_t>(n * c.n_in));
    for (auto& v : x) v = xd(rng);
    // x̂: x rounded to int8 per 32 inputs by this test's own code (d = max|x| / 127).
    std::vector<float> xh(x.size()), xerr(x.size());
    for (int64_t t = 0; t < n; ++t)
      for (int64_t k0 = 0; k0 < c.n_in; k0 += 32) {
        const int64_t k1 = std::min<int64_t>(c.n_in, k0 + 32);
        float amax = 0;
        for (int64_t k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(x[t * c.n_in + k]));
        const float d = amax / 127.0f, inv = amax > 0 ? 127.0f / amax : 0.0f;
        for (int64_t k = k0; k < k1; ++k) {
          const size_t i = static_cast<size_t>(t * c.n_in + k);
          xh[i] = d * std::nearbyint(x[i] * inv);
          xerr[i] = amax / 254.0f;  // the stated bound on |x - x̂|
        }
      }
    Tensor xt = b->alloc(DType::kF32, {n, c.n_in}), yt = b->alloc(DType::kF32, {n, c.n_out});
    b->upload(x.data(), xt);
    b->matmul(xt, l, yt);
    std::vector<float> yb(static_cast<size_t>(n * c.n_out)), y(yb.size()), y8(yb.size()), yr(yb.size());
    b->download(yt, yb.data());
    quant_matmul(x.data(), n, view, nullptr, y.data(), QuantActivations::kF32);
    quant_matmul(x.data(), n, view, nullptr, y8.data(), QuantActivations::kInt8);
    ref::quant_matmul(x.data(), n, view, nullptr, yr.data());
    // The AVX2 kernels wherever the CPU runs them, whatever path the build chose.
    const bool avx2_runs = l.quant.scheme != WeightScheme::kFp8 && detected_cpu_isa() >= CpuIsa::kAvx2;
    std::vector<float> y2(yb.size());
    if (avx2_runs) quant_avx2::quant_matmul(x.data(), n, view, y2.data());
    const bool backend_int8 = default_quant_activations() == QuantActivations::kInt8 && int8_runs;
    double max_ref = 0;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < c.n_out; ++j) {
        double s = 0, sh = 0, bound = 0;
        for (int64_t k = 0; k < c.n_in; ++k) {
          const size_t xi = static_cast<size_t>(t * c.n_in + k);
          const double wv = deq[j * c.n_in + k];
          s += static_cast<double>(x[xi]) * wv;
          sh += static_cast<double>(xh[xi]) * wv;
          bound += std::fabs(wv) * xerr[xi];
        }
        max_ref = std::max(max_ref, std::fabs(s));
        const size_t i = static_cast<size_t>(t * c.n_out + j);
        ASSERT_NEAR(y[i], s, 1e-4 * (1 + std::fabs(s))) << c.name << " f32 n=" << n << " token " << t << " channel " << j;
        ASSERT_NEAR(yr[i], s, 1e-5 * (1 + std::fabs(s))) << c.name << " ref n=" << n;
        if (avx2_runs) {
          ASSERT_NEAR(y2[i], s, 1e-4 * (1 + std::fabs(s)))
              << c.name << " avx2 n=" << n << " token " << t << " channel " << j;
        }
        const double want8 = int8_runs ? sh : s;
        ASSERT_NEAR(y8[i], want8, 1e-4 * (1 + std::fabs(want8)))
            << c.name << " int8 n=" << n << " token " << t << " channel " << j;
        ASSERT_LE(std::fabs(y8[i] - s), bound + 1e-4 * (1 + std::fabs(s))) << c.name << " int8 error bound";
        const double want_b = backend_int8 ? sh : s;
        ASSERT_NEAR(yb[i], want_b, 1e-4 * (1 + std::fabs(want_b))) << c.name << " backend n=" << n;
      }
    ASSERT_GT(max_ref, 0.1) << "a test whose outputs are all ~0 proves nothing";
  }
}

// Batch invariance (backend/cpu/ops.h set_batch_invariant): with f32
// activations, a row's output is bit-identical computed alone or as one of
// 3, 5, 16 or 64 rows, whichever token tile or GEMM the row count selects.
TEST_P(QuantMatmulTest, ARowAloneOrInAnyBatchIsBitIdentical) {
  const Case c = GetParam();
  std::mt19937 rng(9);
  std::normal_distribution<float> dist(0.0f, 0.05f), xd(0.0f, 1.0f);
  std::vector<float> w(static_cast<size_t>(c.n_out * c.n_in));
  for (auto& v : w) v = dist(rng);
  const Packed p = pack(c, w);
  const Linear l = linear(c, p);
  const QuantMatrixView view = quant_view(l.quant, l.weight);
  set_batch_invariant(true);
  std::vector<float> probe(static_cast<size_t>(c.n_in)), alone(static_cast<size_t>(c.n_out));
  for (auto& v : probe) v = xd(rng);
  quant_matmul(probe.data(), 1, view, nullptr, alone.data(), QuantActivations::kF32);
  for (int64_t n : {3, 5, 16, 64}) {
    std::vector<float> x(static_cast<size_t>(n * c.n_in)), y(static_cast<size_t>(n * c.n_out));
    for (auto& v : x) v = xd(rng);
    const int64_t at = (n - 1) * 2 / 3;
    std::copy(probe.begin(), probe.end(), x.begin() + at * c.n_in);
    quant_matmul(x.data(), n, view, nullptr, y.data(), QuantActivations::kF32);
    for (int64_t j = 0; j < c.n_out; ++j)
      ASSERT_EQ(y[static_cast<size_t>(at * c.n_out + j)], alone[static_cast<size_t>(j)])
          << c.name << ": row " << at << " of " << n << ", channel " << j;
    if (l.quant.scheme == WeightScheme::kFp8 || detected_cpu_isa() < CpuIsa::kAvx2) continue;
    // The AVX2 kernels hold to the same order by construction (one FMA chain per group and element).
    std::vector<float> alone2(alone.size()), y2(y.size());
    quant_avx2::quant_matmul(probe.data(), 1, view, alone2.data());
    quant_avx2::quant_matmul(x.data(), n, view, y2.data());
    for (int64_t j = 0; j < c.n_out; ++j)
      ASSERT_EQ(y2[static_cast<size_t>(at * c.n_out + j)], alone2[static_cast<size_t>(j)])
          << c.name << " avx2: row " << at << " of " << n << ", channel " << j;
  }
  set_batch_invariant(false);
}

INSTANTIATE_TEST_SUITE_P(
    Formats, QuantMatmulTest,
    ::testing::Values(Case{"awq_g128", "awq", 128}, Case{"awq_g64", "awq", 64},
                      Case{"awq_g64_bf16_scales", "awq", 64, false, true, DType::kBF16},
                      Case{"awq_wide", "awq", 128, false, true, DType::kF16, 264, 384},
                      Case{"gptq4_sym", "gptq", 128}, Case{"gptq4_asym", "gptq", 64, false, false},
                      Case{"gptq4_act_order", "gptq", 32, true, false},
                      Case{"gptq4_one_group", "gptq", -1, false, false},
                      Case{"gptq8_sym", "gptq-int8", 128}, Case{"gptq8_act_asym", "gptq-int8", 64, true, false},
                      Case{"fp8_block_bf16", "fp8", 128, false, true, DType::kBF16},
                      Case{"fp8_block_f32", "fp8", 128, false, true, DType::kF32},
                      Case{"fp8_block_partial", "fp8", 128, false, true, DType::kBF16, 200, 300},
                      Case{"fp8_tensor", "fp8-tensor", 128, false, true, DType::kF32},
                      Case{"fp8_channel", "fp8-channel", 128, false, true, DType::kBF16, 136, 200}),
    [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

// An FP8 slice that starts inside a [128, 128] scale block (a K/V head range
// under uneven TP): rows [64, 192) and columns [64, 300) of a 200 × 300 matrix.
TEST(QuantFp8Slice, ASliceInsideAScaleBlockKeepsThatBlocksScale) {
  Case c{"fp8", "fp8", 128, false, true, DType::kBF16, 200, 300};
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  std::vector<float> w(static_cast<size_t>(c.n_out * c.n_in));
  for (auto& v : w) v = dist(rng);
  const Packed p = pack(c, w);
  const std::vector<float> deq = oracle_weight(c, p);
  const Linear full = linear(c, p);
  const int64_t r0 = 64, r1 = 192, k0 = 64, K = c.n_in;
  // Rows: a view of the weight, the scale rows [0, 2) (both blocks the rows touch).
  Linear rows = full;
  rows.weight = full.weight.slice_rows(r0, r1);
  rows.quant.n_out = r1 - r0;
  rows.quant.row_offset = r0 % 128;
  // Columns [k0, K): a copy, as the loader makes one; scale columns [0, 3).
  Linear cols = full;
  cols.weight = Tensor::host(DType::kF8E4M3, {c.n_out, K - k0});
  for (int64_t n = 0; n < c.n_out; ++n)
    std::memcpy(cols.weight.ptr<uint8_t>() + n * (K - k0), full.weight.ptr<uint8_t>() + n * K + k0,
                static_cast<size_t>(K - k0));
  cols.quant.n_in = K - k0;
  cols.quant.col_offset = k0 % 128;
  auto b = make_backend({Device{}, 2});
  for (int64_t n : {1, 3, 20}) {  // 20: the packed GEMM, its panels cut at the slice's block edges
    std::vector<float> x(static_cast<size_t>(n * K));
    for (auto& v : x) v = dist(rng) * 20;
    Tensor xt = b->alloc(DType::kF32, {n, K}), yt = b->alloc(DType::kF32, {n, r1 - r0});
    b->upload(x.data(), xt);
    b->matmul(xt, rows, yt);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < r1 - r0; ++j) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) s += double(x[t * K + k]) * deq[(r0 + j) * K + k];
        ASSERT_NEAR(yt.ptr<float>()[t * (r1 - r0) + j], s, 1e-4 * (1 + std::fabs(s))) << "row slice " << j;
      }
    Tensor xc = b->alloc(DType::kF32, {n, K - k0}), yc = b->alloc(DType::kF32, {n, c.n_out});
    for (int64_t t = 0; t < n; ++t)
      std::memcpy(xc.ptr<float>() + t * (K - k0), x.data() + t * K + k0, sizeof(float) * static_cast<size_t>(K - k0));
    b->matmul(xc, cols, yc);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < c.n_out; ++j) {
        double s = 0;
        for (int64_t k = k0; k < K; ++k) s += double(x[t * K + k]) * deq[j * K + k];
        ASSERT_NEAR(yc.ptr<float>()[t * c.n_out + j], s, 1e-4 * (1 + std::fabs(s))) << "column slice " << j;
      }
  }
}

TEST(QuantBias, AddsTheBiasAfterTheQuantizedProduct) {
  Case c{"awq", "awq", 64};
  std::vector<float> w(static_cast<size_t>(c.n_out * c.n_in), 0.01f);
  const Packed p = pack(c, w);
  Linear l = linear(c, p);
  l.bias = Tensor::host(DType::kF32, {c.n_out});
  for (int64_t j = 0; j < c.n_out; ++j) l.bias.ptr<float>()[j] = static_cast<float>(j);
  auto b = make_backend({Device{}, 1});
  std::vector<float> x(static_cast<size_t>(c.n_in), 1.0f);
  Tensor xt = b->alloc(DType::kF32, {1, c.n_in}), yt = b->alloc(DType::kF32, {1, c.n_out});
  b->upload(x.data(), xt);
  b->matmul(xt, l, yt);
  const std::vector<float> deq = oracle_weight(c, p);
  for (int64_t j = 0; j < c.n_out; ++j) {
    double s = j;
    for (int64_t k = 0; k < c.n_in; ++k) s += deq[j * c.n_in + k];
    EXPECT_NEAR(yt.ptr<float>()[j], s, 1e-4 * (1 + std::fabs(s)));
  }
}

// A backend without quantized kernels refuses by name before any weight is read.
class NoQuantBackend final : public Backend {
 public:
  Device device() const override { return Device{DeviceKind::kCuda, 3}; }
  std::string name() const override { return "test"; }
  DType activation_dtype() const override { return DType::kF32; }
  Tensor alloc(DType, TensorShape) override { return {}; }
  int64_t allocated_bytes() const override { return 0; }
  Tensor adopt_weight(Tensor host) override { return host; }
  void upload(const void*, Tensor&) override {}
  void download(const Tensor&, void*) override {}
  void synchronize() override {}
  void begin_step(const StepMetadata&) override {}
  void do_embed(const Tensor&, int64_t, int64_t, int64_t, const StepMetadata&, Tensor&) override {}
  void do_matmul(const Tensor&, const Linear&, Tensor&) override {}
  void do_rms_norm(const Tensor&, const NormWeight&, float, Tensor&) override {}
  void do_add_rms_norm(Tensor&, const Tensor&, const NormWeight&, float, Tensor&) override {}
  void do_add(Tensor&, const Tensor&) override {}
  void do_scale(Tensor&, float) override {}
  void do_rope(Tensor&, const Tensor&, const StepMetadata&, float) override {}
  void do_silu_mul(const Tensor&, const Tensor&, Tensor&) override {}
  void do_gelu_tanh_mul(const Tensor&, const Tensor&, Tensor&) override {}
  void do_kv_cache_write(const KvLayerView&, const StepMetadata&, const Tensor&, const Tensor&) override {}
  void do_paged_attention(const Tensor&, const KvLayerView&, const StepMetadata&, const AttentionHeads&,
                       Tensor&) override {}
  void do_gather_logit_rows(const Tensor&, const StepMetadata&, Tensor&) override {}
};

TEST(QuantSupport, ABackendWithoutKernelsNamesTheSchemeAndDevice) {
  NoQuantBackend b;
  try {
    b.require(OpArgs::quant_matmul(WeightScheme::kAwq, 4));
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("quantized awq 4-bit is not supported on cuda:3"), std::string::npos)
        << e.what();
  }
  auto cpu = make_backend({Device{}, 1});
  EXPECT_FALSE(cpu->supports(OpArgs::quant_matmul(WeightScheme::kAwq, 8)));
  EXPECT_NE(cpu->unsupported(OpArgs::quant_matmul(WeightScheme::kAwq, 8)).find("8-bit AWQ"), std::string::npos);
  EXPECT_THROW(cpu->require(OpArgs::quant_matmul(WeightScheme::kGptq, 3)), Error);
  EXPECT_NO_THROW(cpu->require(OpArgs::quant_matmul(WeightScheme::kFp8, 8)));
  EXPECT_TRUE(cpu->supports(OpArgs::quant_matmul(WeightScheme::kGptq, 8)));
  EXPECT_FALSE(b.supports(OpArgs::quant_matmul(WeightScheme::kFp8, 8)));
  EXPECT_TRUE(b.supports(OpArgs::dense_matmul(DType::kBF16)));
}

}  // namespace
}  // namespace shardlm::backend
