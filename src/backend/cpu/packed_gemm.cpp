#include "backend/cpu/packed_gemm.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "backend/cpu/amx_gemm.h"
#include "backend/cpu/kernel_report.h"
#include "backend/cpu/simd.h"
#include "core/error.h"

namespace shardlm::backend {

#ifdef SHARDLM_SIMD
namespace {

using namespace simd;

constexpr int kNV = 2;                     // vectors of outputs per panel row
constexpr int64_t kNR = kNV * kLanes;      // outputs per panel: 32 (AVX-512), 16 (AVX2)
#if defined(__AVX512F__)
constexpr int kMR = 12;  // 24 accumulators + 2 weight vectors + 1 broadcast, of 32 zmm
constexpr const char* kPackedPath = "packed/avx512";  // built for the build's -march, not chosen by SHARDLM_ISA
#else
constexpr int kMR = 6;   // 12 accumulators + 2 + 1, of 16 ymm
constexpr const char* kPackedPath = "packed/avx2";
#endif
constexpr int64_t kKC = 256;  // k per panel: kKC × kNR f32 = 32 KiB (AVX-512), 16 KiB (AVX2)

// Where a panel's weights come from. A source gives W[j, i] as f32, kLanes
// at a time, says where a panel's k range must end, and may scale a panel's
// columns (one factor per output row, constant over that k range).
template <DType D>
struct DenseRows {
  static constexpr bool kScaled = false;
  const void* w;
  int64_t k;
  const char* row(int64_t j) const { return static_cast<const char*>(w) + static_cast<size_t>(j * k) * dtype_size(D); }
  Vec load(int64_t j, int64_t i) const { return loadv<D>(row(j), i); }
  float load1(int64_t j, int64_t i) const { return load_as_f32(row(j), D, static_cast<size_t>(i)); }
  int64_t chunk_end(int64_t k0) const { return std::min(k, k0 + kKC); }
  void column_scales(int64_t, int64_t, int64_t, float*) const {}
};

// FP8 E4M3 with block scales [ceil(n_out / block_n), scale_cols] (a rank's
// slice starts row_offset rows and col_offset columns into the checkpoint's
// blocks). Panels end on block edges along k, so within one a column's scale
// is one number, applied while packing: the GEMM itself is the f32 one.
struct Fp8Rows {
  static constexpr bool kScaled = true;
  const QuantMatrixView& w;
  const uint8_t* row(int64_t j) const { return w.weight + j * w.n_in; }
  Vec load(int64_t j, int64_t i) const { return load_fp8_over_256(row(j) + i); }
  float load1(int64_t j, int64_t i) const { return f8e4m3_to_f32(row(j)[i]) / kFp8F16Rebias; }
  int64_t chunk_end(int64_t k0) const {
    const int64_t block_end = ((k0 + w.col_offset) / w.block_k + 1) * w.block_k - w.col_offset;
    return std::min({w.n_in, k0 + kKC, block_end});
  }
  // scale[r] for rows j0..j0+rows-1 over the block holding column k0, × 2^8.
  void column_scales(int64_t j0, int64_t rows, int64_t k0, float* scale) const {
    const int64_t col_block = (k0 + w.col_offset) / w.block_k;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t index = ((j0 + r + w.row_offset) / w.block_n) * w.scale_cols + col_block;
      scale[r] = load_as_f32(w.scales, w.scales_dtype, static_cast<size_t>(index)) * kFp8F16Rebias;
    }
  }
};

// panel[i, r] = W[j0 + r, k0 + i] as f32 (scaled, for a scaled source), for
// i < kc and r < kNR; rows past m are zero, so the kernel never branches on
// the panel's edge.
template <class Src>
void pack_panel(const Src& src, int64_t m, int64_t j0, int64_t k0, int64_t kc, float* row_buf, float* panel) {
  const int64_t rows = std::min<int64_t>(kNR, m - j0);
  alignas(64) float scale[kNR];
  if constexpr (Src::kScaled) src.column_scales(j0, rows, k0, scale);
  int64_t i_done = 0;
#ifdef SHARDLM_SIMD_TRANSPOSE
  if (rows == kNR) {  // whole panel: 16 × 16 blocks transposed in registers
    for (; i_done + kLanes <= kc; i_done += kLanes)
      for (int64_t g = 0; g < kNR; g += kLanes) {
        Vec v[16];
        for (int r = 0; r < 16; ++r) v[r] = src.load(j0 + g + r, k0 + i_done);
        transpose(v);
        if constexpr (Src::kScaled)
          for (int c = 0; c < 16; ++c) v[c] = mulv(v[c], loadx(scale + g));
        for (int c = 0; c < 16; ++c) storex(panel + (i_done + kTransposedColumn[c]) * kNR + g, v[c]);
      }
  }
#endif
  for (int64_t r = 0; r < rows; ++r) {
    int64_t i = i_done;
    for (; i + kLanes <= kc; i += kLanes) storex(row_buf + i, src.load(j0 + r, k0 + i));
    for (; i < kc; ++i) row_buf[i] = src.load1(j0 + r, k0 + i);
    const float f = Src::kScaled ? scale[r] : 1.0f;
    for (i = i_done; i < kc; ++i) panel[i * kNR + r] = row_buf[i] * f;
  }
  for (int64_t r = rows; r < kNR; ++r)
    for (int64_t i = 0; i < kc; ++i) panel[i * kNR + r] = 0.0f;
}

// tile[t, :] (+)= Σ_i x[t, i] · panel[i, :] for MR tokens; x rows ldx apart,
// tile rows ldt apart. Sums run in i order, continuing from the stored tile
// when `accumulate`.
template <int MR>
void micro_kernel(const float* x, int64_t ldx, const float* panel, int64_t kc, bool accumulate, float* tile,
                  int64_t ldt) {
  Vec acc[MR][kNV];
  for (int t = 0; t < MR; ++t)
    for (int v = 0; v < kNV; ++v) acc[t][v] = accumulate ? loadx(tile + t * ldt + v * kLanes) : zerov();
  for (int64_t i = 0; i < kc; ++i) {
    const Vec w0 = loadx(panel + i * kNR), w1 = loadx(panel + i * kNR + kLanes);
    for (int t = 0; t < MR; ++t) {
      const Vec b = setv(x[t * ldx + i]);
      acc[t][0] = fmav(w0, b, acc[t][0]);
      acc[t][1] = fmav(w1, b, acc[t][1]);
    }
  }
  for (int t = 0; t < MR; ++t)
    for (int v = 0; v < kNV; ++v) storex(tile + t * ldt + v * kLanes, acc[t][v]);
}

using KernelFn = void (*)(const float*, int64_t, const float*, int64_t, bool, float*, int64_t);

template <int... MRs>
constexpr auto kernel_table(std::integer_sequence<int, MRs...>) {
  return std::array<KernelFn, sizeof...(MRs)>{&micro_kernel<MRs + 1>...};
}
constexpr auto kKernels = kernel_table(std::make_integer_sequence<int, kMR>{});

struct Scratch {
  std::vector<float> panel, row_buf, tile;
};

// One work item: output panel p (columns [p·kNR, +kNR)) for tokens [t0, t1).
template <class Src>
void run_item(const float* x, const Src& w, int64_t m, int64_t k, int64_t p, int64_t t0, int64_t t1, float* y,
              Scratch& s) {
  const int64_t j0 = p * kNR, cols = std::min<int64_t>(kNR, m - j0);
  const bool partial = cols < kNR;
  // A partial panel accumulates in a [t1 - t0, kNR] tile, copied out at the end.
  if (partial) s.tile.assign(static_cast<size_t>((t1 - t0) * kNR), 0.0f);
  float* out = partial ? s.tile.data() : y + t0 * m + j0;
  const int64_t ldo = partial ? kNR : m;
  for (int64_t k0 = 0, k1; k0 < k; k0 = k1) {
    k1 = w.chunk_end(k0);
    const int64_t kc = k1 - k0;
    pack_panel(w, m, j0, k0, kc, s.row_buf.data(), s.panel.data());
    // Register tiles of near-equal height (16 tokens: 8 + 8, not 12 + 4),
    // since a short tile does as many loads for fewer FMAs.
    const int64_t n_tiles = (t1 - t0 + kMR - 1) / kMR;
    for (int64_t tile = 0, t = t0; tile < n_tiles; ++tile) {
      const int64_t mr = (t1 - t + (n_tiles - tile) - 1) / (n_tiles - tile);
      kKernels[mr - 1](x + t * k + k0, k, s.panel.data(), kc, k0 > 0, out + (t - t0) * ldo, ldo);
      t += mr;
    }
  }
  if (partial)
    for (int64_t t = t0; t < t1; ++t)
      std::memcpy(y + t * m + j0, out + (t - t0) * kNR, static_cast<size_t>(cols) * sizeof(float));
}

template <class Src>
void packed_from(const Src& w, const float* x, int64_t n, int64_t m, int64_t k, float* y) {
  const int64_t n_panels = (m + kNR - 1) / kNR;
  // Few panels (a narrow TP shard): split tokens too, so every thread has work.
  const int threads = omp_get_max_threads();
  int64_t token_chunks = 1;
  if (n_panels < 4 * threads) token_chunks = std::min<int64_t>((4 * threads + n_panels - 1) / n_panels, (n + kMR - 1) / kMR);
  const int64_t chunk = ((n + token_chunks - 1) / token_chunks + kMR - 1) / kMR * kMR;
  token_chunks = (n + chunk - 1) / chunk;
  const int64_t n_items = n_panels * token_chunks;
#pragma omp parallel
  {
    static thread_local Scratch s;
    if (s.panel.size() < static_cast<size_t>(kKC * kNR)) {
      s.panel.resize(static_cast<size_t>(kKC * kNR));
      s.row_buf.resize(static_cast<size_t>(kKC));
    }
#pragma omp for schedule(dynamic, 1)  // threads of a shared VM run at unequal speed
    for (int64_t item = 0; item < n_items; ++item) {
      const int64_t p = item / token_chunks, c = item % token_chunks;
      const int64_t t0 = c * chunk, t1 = std::min(n, t0 + chunk);
      run_item(x, w, m, k, p, t0, t1, y, s);
    }
  }
}

template <DType D>
void packed_typed(const float* x, int64_t n, const void* w, int64_t m, int64_t k, float* y) {
  packed_from(DenseRows<D>{w, k}, x, n, m, k, y);
}

}  // namespace

bool packed_fp8_available(const QuantMatrixView& w) {
  // A kLanes load must not straddle a scale block along k.
  return w.block_k % kLanes == 0 && w.col_offset % kLanes == 0;
}

void packed_matmul_fp8(const float* x, int64_t n, const QuantMatrixView& w, float* y) {
  SHARDLM_CHECK(w.scheme == WeightScheme::kFp8 && packed_fp8_available(w), "packed_matmul_fp8: block_k ", w.block_k,
                ", col_offset ", w.col_offset);
  count_kernel(kPackedPath, "fp8", n, w.n_out, w.n_in);
  packed_from(Fp8Rows{w}, x, n, w.n_out, w.n_in, y);
}

bool packed_matmul_available(DType weight_dtype) {
  return weight_dtype == DType::kF32 || weight_dtype == DType::kBF16 || weight_dtype == DType::kF16;
}

bool packed_uses_amx(DType weight_dtype) { return weight_dtype == DType::kBF16 && amx_available(); }

// Without AMX the rows kernel (backend/cpu/rows_gemm.h) is faster up to 24 rows:
// on a Zen 5 EPYC, 2 threads, Qwen2.5-0.5B shapes, it took 0.59-0.95x the
// packed GEMM's time at 16 and 24 rows, 0.89-1.10x at 32 (bench/matmul_bench's inv/def).
int64_t packed_matmul_min_tokens(DType weight_dtype) { return packed_uses_amx(weight_dtype) ? 8 : 32; }

void packed_matmul(const float* x, int64_t n, const void* w, DType weight_dtype, int64_t m, int64_t k, float* y) {
  if (weight_dtype == DType::kBF16 && amx_available()) {
    count_kernel("packed/amx", "bf16", n, m, k);
    return amx_matmul_bf16(x, n, static_cast<const uint16_t*>(w), m, k, y);
  }
  count_kernel(kPackedPath, kernel_weights_name(weight_dtype), n, m, k);
  switch (weight_dtype) {
    case DType::kF32: packed_typed<DType::kF32>(x, n, w, m, k, y); break;
    case DType::kBF16: packed_typed<DType::kBF16>(x, n, w, m, k, y); break;
    case DType::kF16: packed_typed<DType::kF16>(x, n, w, m, k, y); break;
    default:
      fail(ErrorCode::kUnsupported, "packed_matmul: no kernel for ", dtype_safetensors_name(weight_dtype), " weights");
  }
}

#else  // no SIMD: backend::matmul keeps its portable loops

bool packed_matmul_available(DType) { return false; }
bool packed_uses_amx(DType) { return false; }
int64_t packed_matmul_min_tokens(DType) { return INT64_MAX; }
bool packed_fp8_available(const QuantMatrixView&) { return false; }
void packed_matmul_fp8(const float*, int64_t, const QuantMatrixView&, float*) {
  fail(ErrorCode::kUnsupported, "packed_matmul_fp8: this build has no SIMD kernels");
}
void packed_matmul(const float*, int64_t, const void*, DType weight_dtype, int64_t, int64_t, float*) {
  fail(ErrorCode::kUnsupported, "packed_matmul: this build has no SIMD kernels (", dtype_safetensors_name(weight_dtype),
       ")");
}

#endif

}  // namespace shardlm::backend
