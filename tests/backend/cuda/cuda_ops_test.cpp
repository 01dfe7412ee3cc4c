// The CUDA backend against the CPU reference ops (backend::ref), op by op.
// Built only with -DSHARDLM_CUDA=ON. Tests that need a GPU skip without one
// (CI compiles them; scripts/gpu-check.sh runs them on a device); the
// host-side ones (device probe, error mapping) run everywhere.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_probe.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/sampling.h"
#include "backend/cpu/ops.h"
#include "core/dtype.h"
#include "core/error.h"

namespace shardlm::backend::cuda {
namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define REQUIRE_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device (scripts/gpu-check.sh runs this on one)"

uint16_t to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}
float from_bf16_bits(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Values exactly representable in bf16, so CPU and GPU see the same inputs.
std::vector<float> random_bf16_values(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = from_bf16_bits(to_bf16_bits(d(rng)));
  return v;
}
std::vector<uint16_t> bits(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = to_bf16_bits(v[i]);
  return b;
}

template <typename T>
T* upload(const std::vector<T>& v) {
  T* d = nullptr;
  SHARDLM_CUDA_CHECK(cudaMalloc(&d, std::max<size_t>(1, v.size() * sizeof(T))));
  SHARDLM_CUDA_CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}
template <typename T>
std::vector<T> download(const T* d, size_t n) {
  std::vector<T> v(n);
  SHARDLM_CUDA_CHECK(cudaDeviceSynchronize());
  SHARDLM_CUDA_CHECK(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}
std::vector<float> download_bf16(const bf16* d, size_t n) {
  auto b = download(reinterpret_cast<const uint16_t*>(d), n);
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = from_bf16_bits(b[i]);
  return f;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, float rel, float abs_tol,
                  const char* what) {
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i) {
    if (!(std::fabs(got[i] - want[i]) <= abs_tol + rel * std::fabs(want[i]))) {
      ADD_FAILURE() << what << "[" << i << "] = " << got[i] << ", reference " << want[i];
      ++bad;
    }
  }
}

TEST(CudaHost, ProbeNeverThrowsAndSaysWhyWithoutDevices) {
  GpuReport r = probe_gpus();
  EXPECT_TRUE(r.built_with_cuda);
  if (r.devices.empty()) {
    EXPECT_FALSE(r.unavailable.empty());
  }
  EXPECT_GT(r.nccl_version, 0);  // the library answers without a GPU
}

TEST(CudaHost, ErrorsAreTypedWithTheCall) {
  try {
    throw_cuda_error(cudaErrorMemoryAllocation, "cudaMalloc(&p, 1 << 40)", "x.cpp", 7);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory);
    EXPECT_NE(std::string(e.what()).find("cudaMalloc(&p, 1 << 40)"), std::string::npos);
  }
  try {
    throw_cuda_error(cudaErrorNoKernelImageForDevice, "kernel<<<>>>", "x.cu", 1);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("CMAKE_CUDA_ARCHITECTURES"), std::string::npos);
  }
}

TEST(CudaOps, RmsNormResidualMatchesReference) {
  REQUIRE_GPU();
  const int64_t n = 5, dim = 3584;
  auto x = random_bf16_values(n * dim, 1), dx = random_bf16_values(n * dim, 2), w = random_bf16_values(dim, 3);
  std::vector<float> sum(n * dim), want(n * dim);
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = x[i] + dx[i];
  auto wb = bits(w);
  ref::rms_norm(sum.data(), n, {wb.data(), DType::kBF16, dim}, 1e-6f, want.data());
  float* d_x = upload(x);
  float* d_dx = upload(dx);
  auto* d_w = reinterpret_cast<bf16*>(upload(wb));
  bf16* d_out = nullptr;
  SHARDLM_CUDA_CHECK(cudaMalloc(&d_out, n * dim * 2));
  rms_norm_residual(d_x, d_dx, n, dim, d_w, 1e-6f, 0.0f, d_out, nullptr);
  expect_close(download(d_x, n * dim), sum, 1e-6f, 1e-6f, "residual");
  expect_close(download_bf16(d_out, n * dim), want, 1e-2f, 1e-2f, "normed");
  cudaFree(d_x), cudaFree(d_dx), cudaFree(d_w), cudaFree(d_out);
}

TEST(CudaOps, RopeMatchesReferenceForEveryRopeType) {
  REQUIRE_GPU();
  for (auto scaling : {RopeConfig::Scaling::kNone, RopeConfig::Scaling::kLinear, RopeConfig::Scaling::kLlama3}) {
    RopeConfig cfg{.head_dim = 128, .theta = 1e6, .scaling = scaling, .factor = 4.0};
    std::vector<float> inv(64);
    rope_inv_freq(cfg, inv.data());
    const int64_t n = 7, heads = 4;
    auto x = random_bf16_values(n * heads * 128, 4);
    std::vector<int32_t> pos = {0, 1, 5, 100, 4095, 30000, 131071};
    auto want = x;
    ref::rope(want.data(), n, heads, 128, pos.data(), inv.data());
    float* d_x = upload(x);
    int32_t* d_pos = upload(pos);
    float* d_inv = upload(inv);
    rope(d_x, n, heads, 128, heads * 128, d_pos, d_inv, 128, 1.0f, nullptr);
    expect_close(download(d_x, x.size()), want, 1e-4f, 2e-3f, "rope");
    cudaFree(d_x), cudaFree(d_pos), cudaFree(d_inv);
  }
}

TEST(CudaOps, SiluMulAndGemmMatchReference) {
  REQUIRE_GPU();
  const int64_t n = 9, k = 512, m = 384;
  auto x = random_bf16_values(n * k, 5), w = random_bf16_values(m * k, 6, 0.05f);
  auto wb = bits(w);
  std::vector<float> want(n * m);
  ref::matmul(x.data(), n, {wb.data(), DType::kBF16, m, k}, nullptr, want.data());
  auto xb = bits(x);
  auto* d_x = reinterpret_cast<bf16*>(upload(xb));
  auto* d_w = reinterpret_cast<bf16*>(upload(wb));
  float* d_y = nullptr;
  SHARDLM_CUDA_CHECK(cudaMalloc(&d_y, n * m * 4));
  LtGemm gemm;
  gemm.matmul(d_x, n, d_w, m, k, d_y, nullptr);
  auto y = download(d_y, n * m);
  expect_close(y, want, 1e-3f, 1e-3f, "gemm");
  // gate = first half of each row, up = second half.
  std::vector<float> want_act(n * m / 2);
  for (int64_t t = 0; t < n; ++t)
    ref::silu_mul(y.data() + t * m, y.data() + t * m + m / 2, m / 2, want_act.data() + t * (m / 2));
  bf16* d_act = nullptr;
  SHARDLM_CUDA_CHECK(cudaMalloc(&d_act, n * m));
  silu_mul(d_y, d_y + m / 2, n, m / 2, m, d_act, nullptr);
  expect_close(download_bf16(d_act, n * m / 2), want_act, 1e-2f, 1e-3f, "silu_mul");
  cudaFree(d_x), cudaFree(d_w), cudaFree(d_y), cudaFree(d_act);
}

// Decode and prefill attention on an uneven-TP rank: Qwen2.5-7B's 28 Q / 4 KV
// heads at TP 3, rank 1 (Q heads 10..19 read KV heads 1 and 2). window > 0:
// a sliding-window layer; scale > 0: an explicit softmax scale (Gemma 3).
struct AttentionCase {
  int64_t head_dim, n_q_heads, q_head_begin, kv_head_begin, n_kv_heads, group_size;
  int64_t window = 0;
  float scale = 0.0f;
};

void run_attention_case(const AttentionCase& c, const std::vector<int64_t>& n_past,
                        const std::vector<int64_t>& n_new) {
  const int64_t hd = c.head_dim, block_size = 16, n_seqs = static_cast<int64_t>(n_past.size());
  int64_t max_ctx = 0, n_tokens = 0, max_new = 0;
  for (int64_t s = 0; s < n_seqs; ++s) {
    max_ctx = std::max(max_ctx, n_past[s] + n_new[s]);
    n_tokens += n_new[s];
    max_new = std::max(max_new, n_new[s]);
  }
  const int64_t blocks_per_seq = (max_ctx + block_size - 1) / block_size;
  const int64_t n_blocks = blocks_per_seq * n_seqs;
  const int64_t row = c.n_kv_heads * hd;
  // A shuffled block table per sequence, and the cache filled with bf16 values.
  std::vector<int32_t> tables(n_seqs * blocks_per_seq);
  for (size_t i = 0; i < tables.size(); ++i) tables[i] = static_cast<int32_t>((i * 7 + 3) % n_blocks);
  auto kc = random_bf16_values(n_blocks * block_size * row, 11), vc = random_bf16_values(n_blocks * block_size * row, 12);
  auto kb = bits(kc), vb = bits(vc);
  auto q = random_bf16_values(n_tokens * c.n_q_heads * hd, 13);

  std::vector<AttentionSeq> seqs(n_seqs);
  std::vector<int32_t> records;  // StepMetadata's packed records: token_begin, n_tokens, n_past, table_offset, n_table
  int64_t t0 = 0;
  for (int64_t s = 0; s < n_seqs; ++s) {
    seqs[s] = {t0, n_new[s], n_past[s], tables.data() + s * blocks_per_seq, blocks_per_seq};
    records.insert(records.end(), {static_cast<int32_t>(t0), static_cast<int32_t>(n_new[s]),
                                   static_cast<int32_t>(n_past[s]), static_cast<int32_t>(s * blocks_per_seq),
                                   static_cast<int32_t>(blocks_per_seq)});
    t0 += n_new[s];
  }
  KvLayerView view{kb.data(), vb.data(), DType::kBF16, n_blocks, block_size, c.n_kv_heads, hd};
  const AttentionHeads heads{c.n_q_heads, c.q_head_begin, c.kv_head_begin, c.group_size, c.scale, c.window};
  std::vector<float> want(n_tokens * c.n_q_heads * hd);
  ref::paged_attention(q.data(), view, seqs.data(), n_seqs, heads, want.data());

  DeviceKvLayer dev{reinterpret_cast<bf16*>(upload(kb)), reinterpret_cast<bf16*>(upload(vb)), n_blocks, block_size,
                    c.n_kv_heads, hd};
  const AttentionHeads& dh = heads;
  float* d_q = upload(q);
  int32_t* d_tables = upload(tables);
  int32_t* d_records = upload(records);
  const DeviceSeqs dseqs{d_records, d_tables, n_seqs};
  bf16* d_out = nullptr;
  SHARDLM_CUDA_CHECK(cudaMalloc(&d_out, want.size() * 2));
  const bool decode = max_new == 1;
  if (decode) {
    void* ws = nullptr;
    const size_t ws_bytes = decode_attention_workspace_bytes(n_seqs, dh, hd, max_ctx);
    if (ws_bytes) SHARDLM_CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
    paged_attention_decode(d_q, c.n_q_heads * hd, dev, dh, dseqs, max_ctx, ws, d_out, nullptr);
    cudaFree(ws);
  }
  bf16* d_out2 = nullptr;
  SHARDLM_CUDA_CHECK(cudaMalloc(&d_out2, want.size() * 2));
  paged_attention_prefill(d_q, c.n_q_heads * hd, dev, dh, dseqs, max_new, d_out2, nullptr);
  if (decode) expect_close(download_bf16(d_out, want.size()), want, 2e-2f, 1e-2f, "decode attention");
  expect_close(download_bf16(d_out2, want.size()), want, 2e-2f, 1e-2f, "prefill attention");
  cudaFree(dev.k), cudaFree(dev.v), cudaFree(d_q), cudaFree(d_tables), cudaFree(d_out), cudaFree(d_out2);
  cudaFree(d_records);
}

TEST(CudaOps, DecodeAttentionSplitKUnevenHeads) {
  REQUIRE_GPU();
  // Contexts below, at and far above one partition (512), plus a 1-token one.
  run_attention_case({128, 10, 10, 1, 2, 7}, {0, 511, 700, 2047}, {1, 1, 1, 1});
  run_attention_case({128, 32, 0, 0, 8, 4}, {37, 1500}, {1, 1});   // Qwen3-8B-shaped, TP 1
  run_attention_case({64, 3, 5, 2, 2, 2}, {100, 9}, {1, 1});       // head_dim 64, group cut at both edges
}

TEST(CudaOps, PrefillAndChunkedPrefillAttention) {
  REQUIRE_GPU();
  run_attention_case({128, 10, 10, 1, 2, 7}, {0, 0}, {1, 37});       // plain prefill, uneven lengths
  run_attention_case({128, 28, 0, 0, 4, 7}, {64, 300}, {20, 9});     // chunks after cached context
  run_attention_case({256, 4, 0, 0, 1, 4}, {5}, {40});
}

// Sliding windows: a window inside one partition, one spanning partitions
// (its first key mid-partition), one longer than the context (the whole
// past), and window 1 (only the query's own key). Decode and prefill.
TEST(CudaOps, SlidingWindowAttentionReadsOnlyTheLastWindowKeys) {
  REQUIRE_GPU();
  // Mistral v0.1-shaped (window 4096 scaled down). Decode: a window of one
  // partition over contexts up to 2048, then one of three partitions whose
  // first key falls mid-partition.
  run_attention_case({128, 8, 0, 0, 2, 4, 300}, {0, 299, 300, 2047}, {1, 1, 1, 1});
  run_attention_case({128, 8, 0, 0, 2, 4, 1100}, {2000, 1099, 5}, {1, 1, 1});
  run_attention_case({128, 4, 0, 0, 1, 4, 1}, {17, 0}, {1, 1});
  // Prefill and chunked prefill: windows shorter than, equal to and longer than a chunk, across key tiles.
  run_attention_case({128, 10, 10, 1, 2, 7, 40}, {0, 100}, {90, 33});
  run_attention_case({128, 8, 0, 0, 2, 4, 5}, {0, 64}, {37, 20});
  run_attention_case({128, 8, 0, 0, 2, 4, 4096}, {0, 300}, {50, 9});
  // Phi-3-mini: head_dim 96, window 2047.
  run_attention_case({96, 32, 0, 0, 32, 1, 2047}, {3000, 10}, {1, 1});
  run_attention_case({96, 8, 0, 0, 8, 1, 64}, {30, 0}, {50, 70});
}

// Gemma 3: head_dim 256, query_pre_attn_scalar's scale, sliding and global
// layers; decode past one partition and prefill chunks.
TEST(CudaOps, Gemma3HeadDim256WithScaleAndWindow) {
  REQUIRE_GPU();
  const float scale = 1.0f / std::sqrt(168.0f);  // query_pre_attn_scalar 168 (27B-style), not 1/sqrt(256)
  run_attention_case({256, 8, 0, 0, 4, 2, 0, scale}, {0, 700, 1500}, {1, 1, 1});      // global layer, decode
  run_attention_case({256, 8, 0, 0, 4, 2, 512, scale}, {0, 700, 1500}, {1, 1, 1});    // sliding layer, decode
  run_attention_case({256, 4, 0, 0, 1, 4, 0, scale}, {0, 48}, {40, 17});              // global layer, prefill
  run_attention_case({256, 4, 0, 0, 1, 4, 32, scale}, {0, 48}, {40, 17});             // sliding layer, prefill
  run_attention_case({256, 16, 0, 0, 1, 16, 0, 0.25f}, {600}, {1});                   // a 16-head group: over 48 KiB of shared memory
}

TEST(CudaOps, KvCacheWriteStoresEachTokenAtItsPositionsSlot) {
  REQUIRE_GPU();
  const int64_t hd = 64, kvh = 2, row = hd * kvh, bs = 4, n_blocks = 3;
  auto k = random_bf16_values(3 * row, 21), v = random_bf16_values(3 * row, 22);
  // Sequence 0: one token at position 5 (table {2, 0}: block 0, slot 1 -> slot index 1).
  // A padding record (no tokens). Sequence 2: two tokens at positions 2, 3 (table {1}: slots 6, 7).
  std::vector<int32_t> tables = {2, 0, 1};
  std::vector<int32_t> records = {0, 1, 5, 0, 2, /*padding*/ 1, 0, 0, 2, 0, 1, 2, 2, 2, 1};
  std::vector<uint16_t> zeros(n_blocks * bs * row, 0);
  DeviceKvLayer dev{reinterpret_cast<bf16*>(upload(zeros)), reinterpret_cast<bf16*>(upload(zeros)), n_blocks, bs, kvh, hd};
  float* d_k = upload(k);
  float* d_v = upload(v);
  int32_t* d_tables = upload(tables);
  int32_t* d_records = upload(records);
  kv_cache_write(dev, d_k, d_v, row, DeviceSeqs{d_records, d_tables, 3}, 3, nullptr);
  auto kc = download_bf16(dev.k, zeros.size());
  auto vc = download_bf16(dev.v, zeros.size());
  for (int64_t i = 0; i < row; ++i) {
    EXPECT_EQ(kc[1 * row + i], k[i]);
    EXPECT_EQ(kc[6 * row + i], k[row + i]);
    EXPECT_EQ(vc[7 * row + i], v[2 * row + i]);
  }
  float elsewhere = 0;
  for (int64_t s : {0, 2, 3, 4, 5, 8, 9, 10, 11})
    for (int64_t i = 0; i < row; ++i) elsewhere += std::fabs(kc[s * row + i]);
  EXPECT_EQ(elsewhere, 0.0f);
  cudaFree(dev.k), cudaFree(dev.v), cudaFree(d_k), cudaFree(d_v), cudaFree(d_tables), cudaFree(d_records);
}

TEST(CudaOps, EmbeddingGatherOfAVocabSlice) {
  REQUIRE_GPU();
  const int64_t rows = 10, dim = 96, begin = 100;
  auto table = random_bf16_values(rows * dim, 31);
  auto tb = bits(table);
  std::vector<int32_t> ids = {100, 109, 5, 104};
  auto* d_t = reinterpret_cast<bf16*>(upload(tb));
  int32_t* d_ids = upload(ids);
  float* d_out = nullptr;
  SHARDLM_CUDA_CHECK(cudaMalloc(&d_out, ids.size() * dim * 4));
  embedding_gather(d_t, rows, dim, begin, d_ids, 4, d_out, nullptr);
  auto out = download(d_out, ids.size() * dim);
  for (int64_t d = 0; d < dim; ++d) {
    EXPECT_EQ(out[d], table[d]);
    EXPECT_EQ(out[dim + d], table[9 * dim + d]);
    EXPECT_EQ(out[2 * dim + d], 0.0f);  // outside this rank's slice
    EXPECT_EQ(out[3 * dim + d], table[4 * dim + d]);
  }
  cudaFree(d_t), cudaFree(d_ids), cudaFree(d_out);
}

TEST(CudaOps, SamplingGreedyPenaltiesLogprobsAndTopK) {
  REQUIRE_GPU();
  const int64_t vocab = 151936, n_rows = 3;
  auto logits = random_bf16_values(n_rows * vocab, 41, 2.0f);
  logits[0 * vocab + 777] = 30.0f;   // row 0: greedy picks 777
  logits[1 * vocab + 5] = 30.0f;     // row 1: 5 is penalised below 6
  logits[1 * vocab + 6] = 29.0f;
  logits[2 * vocab + 42] = 40.0f;    // row 2: top_k 1 at temperature 1 can only draw 42
  std::vector<DeviceSamplingRow> rows(n_rows);
  rows[0].temperature = 0.0f;
  rows[0].n_logprobs = 3;
  rows[1].temperature = 0.0f;
  rows[1].frequency_penalty = 1.0f;
  rows[1].presence_penalty = 0.5f;
  rows[2].top_k = 1;
  rows[2].seed = 7;
  std::vector<int32_t> offsets = {0, 0, 1, 1}, tokens = {5}, counts = {1};
  std::vector<uint8_t> prompt = {0};
  float* d_logits = upload(logits);
  auto* d_rows = upload(rows);
  DevicePenalties pen{upload(offsets), upload(tokens), upload(counts), upload(prompt)};
  float *d_work = nullptr, *d_lp = nullptr, *d_top_lp = nullptr;
  int32_t *d_ids = nullptr, *d_top = nullptr;
  SHARDLM_CUDA_CHECK(cudaMalloc(&d_work, n_rows * vocab * 4));
  SHARDLM_CUDA_CHECK(cudaMalloc(&d_lp, n_rows * 4));
  SHARDLM_CUDA_CHECK(cudaMalloc(&d_ids, n_rows * 4));
  SHARDLM_CUDA_CHECK(cudaMalloc(&d_top, n_rows * kMaxDeviceLogprobs * 4));
  SHARDLM_CUDA_CHECK(cudaMalloc(&d_top_lp, n_rows * kMaxDeviceLogprobs * 4));
  sample(d_logits, n_rows, vocab, d_rows, pen, d_work, d_ids, d_lp, d_top, d_top_lp, nullptr);
  auto ids = download(d_ids, n_rows);
  auto lp = download(d_lp, n_rows);
  auto top = download(d_top, n_rows * kMaxDeviceLogprobs);
  EXPECT_EQ(ids[0], 777);
  EXPECT_EQ(ids[1], 6);
  EXPECT_EQ(ids[2], 42);
  // Raw logprob of row 0's pick, from the CPU.
  double m = -1e30, z = 0;
  for (int64_t i = 0; i < vocab; ++i) m = std::max<double>(m, logits[i]);
  for (int64_t i = 0; i < vocab; ++i) z += std::exp(logits[i] - m);
  EXPECT_NEAR(lp[0], 30.0 - (m + std::log(z)), 1e-3);
  EXPECT_EQ(top[0], 777);
  EXPECT_EQ(top[3], -1);  // only 3 asked
  cudaFree(d_logits), cudaFree(d_rows), cudaFree(d_work), cudaFree(d_lp), cudaFree(d_ids), cudaFree(d_top);
  cudaFree(d_top_lp);
}

}  // namespace
}  // namespace shardlm::backend::cuda
