#include "backend/packed_gemm.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "backend/amx_gemm.h"
#include "backend/simd.h"
#include "core/error.h"

namespace shardlm::backend {

#ifdef SHARDLM_SIMD
namespace {

using namespace simd;

constexpr int kNV = 2;                     // vectors of outputs per panel row
constexpr int64_t kNR = kNV * kLanes;      // outputs per panel: 32 (AVX-512), 16 (AVX2)
#if defined(__AVX512F__)
constexpr int kMR = 12;  // 24 accumulators + 2 weight vectors + 1 broadcast, of 32 zmm
#else
constexpr int kMR = 6;   // 12 accumulators + 2 + 1, of 16 ymm
#endif
constexpr int64_t kKC = 256;  // k per panel: kKC × kNR f32 = 32 KiB (AVX-512), 16 KiB (AVX2)

// panel[i, r] = W[j0 + r, k0 + i] as f32, for i < kc and r < kNR; rows past
// m are zero, so the kernel never branches on the panel's edge.
template <DType D>
void pack_panel(const void* w, int64_t m, int64_t k, int64_t j0, int64_t k0, int64_t kc, float* row_buf,
                float* panel) {
  const size_t es = dtype_size(D);
  const int64_t rows = std::min<int64_t>(kNR, m - j0);
  auto row_ptr = [&](int64_t r) {
    return static_cast<const char*>(w) + static_cast<size_t>((j0 + r) * k + k0) * es;
  };
  int64_t i_done = 0;
#ifdef SHARDLM_SIMD_TRANSPOSE
  if (rows == kNR) {  // whole panel: 16 × 16 blocks transposed in registers
    for (; i_done + kLanes <= kc; i_done += kLanes)
      for (int64_t g = 0; g < kNR; g += kLanes) {
        Vec v[16];
        for (int r = 0; r < 16; ++r) v[r] = loadv<D>(row_ptr(g + r), i_done);
        transpose(v);
        for (int c = 0; c < 16; ++c) storex(panel + (i_done + kTransposedColumn[c]) * kNR + g, v[c]);
      }
  }
#endif
  for (int64_t r = 0; r < rows; ++r) {
    const char* src = row_ptr(r);
    int64_t i = i_done;
    for (; i + kLanes <= kc; i += kLanes) storex(row_buf + i, loadv<D>(src, i));
    for (; i < kc; ++i) row_buf[i] = load_as_f32(src, D, static_cast<size_t>(i));
    for (i = i_done; i < kc; ++i) panel[i * kNR + r] = row_buf[i];
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
template <DType D>
void run_item(const float* x, const void* w, int64_t m, int64_t k, int64_t p, int64_t t0, int64_t t1, float* y,
              Scratch& s) {
  const int64_t j0 = p * kNR, cols = std::min<int64_t>(kNR, m - j0);
  const bool partial = cols < kNR;
  // A partial panel accumulates in a [t1 - t0, kNR] tile, copied out at the end.
  if (partial) s.tile.assign(static_cast<size_t>((t1 - t0) * kNR), 0.0f);
  float* out = partial ? s.tile.data() : y + t0 * m + j0;
  const int64_t ldo = partial ? kNR : m;
  for (int64_t k0 = 0; k0 < k; k0 += kKC) {
    const int64_t kc = std::min(kKC, k - k0);
    pack_panel<D>(w, m, k, j0, k0, kc, s.row_buf.data(), s.panel.data());
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

template <DType D>
void packed_typed(const float* x, int64_t n, const void* w, int64_t m, int64_t k, float* y) {
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
#pragma omp for schedule(static)
    for (int64_t item = 0; item < n_items; ++item) {
      const int64_t p = item / token_chunks, c = item % token_chunks;
      const int64_t t0 = c * chunk, t1 = std::min(n, t0 + chunk);
      run_item<D>(x, w, m, k, p, t0, t1, y, s);
    }
  }
}

}  // namespace

bool packed_matmul_available(DType weight_dtype) {
  return weight_dtype == DType::kF32 || weight_dtype == DType::kBF16 || weight_dtype == DType::kF16;
}

int64_t packed_matmul_min_tokens(DType weight_dtype) {
  return weight_dtype == DType::kBF16 && amx_available() ? 8 : 16;
}

void packed_matmul(const float* x, int64_t n, const void* w, DType weight_dtype, int64_t m, int64_t k, float* y) {
  if (weight_dtype == DType::kBF16 && amx_available())
    return amx_matmul_bf16(x, n, static_cast<const uint16_t*>(w), m, k, y);
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
int64_t packed_matmul_min_tokens(DType) { return INT64_MAX; }
void packed_matmul(const float*, int64_t, const void*, DType weight_dtype, int64_t, int64_t, float*) {
  fail(ErrorCode::kUnsupported, "packed_matmul: this build has no SIMD kernels (", dtype_safetensors_name(weight_dtype),
       ")");
}

#endif

}  // namespace shardlm::backend
