#include "backend/cpu/amx_gemm.h"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string_view>
#include <vector>

#include "backend/cpu/simd.h"
#include "core/error.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define SHARDLM_AMX 1
#endif

namespace shardlm::backend {

#ifdef SHARDLM_AMX
namespace {

constexpr int64_t kTileRows = 16;  // tokens per A/C tile
constexpr int64_t kTileK = 32;     // k per A/B tile (bf16)
constexpr int64_t kPanelCols = 32; // two B/C tiles of 16 output columns

// All eight tiles 16 rows × 64 bytes. Many tokens: C00 C01 C10 C11 (2 token
// blocks × 2 column blocks), A, B0, B1; few tokens: see few_tokens_blocks.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

void configure_tiles() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = kTileRows;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
}

// The B operand of a 16-column block in AMX's pair-interleaved layout, for
// all of k: panel[s][r][c] (k step s, row r, column c) is the 32-bit word
// holding W[j0 + c][32 s + 2 r .. + 1]. Columns past m and k past the end
// are zero. panel: [k_pad / 32][16][16] words.
void pack_b(const uint16_t* w, int64_t m, int64_t k, int64_t j0, int64_t k_pad, uint32_t* panel) {
  const int64_t cols = std::min<int64_t>(16, m - j0);
  for (int64_t s = 0; s < k_pad / kTileK; ++s) {
    const int64_t k0 = s * kTileK;
    uint32_t* dst = panel + s * 256;
    if (cols == 16 && k0 + kTileK <= k) {
      // bf16 pairs moved as 32-bit lanes by the f32 transpose (shuffles only:
      // the bits are never read as floats).
      __m512 v[16];
      for (int c = 0; c < 16; ++c) v[c] = _mm512_castsi512_ps(_mm512_loadu_si512(w + (j0 + c) * k + k0));
      simd::transpose(v);
      for (int r = 0; r < 16; ++r) _mm512_store_ps(reinterpret_cast<float*>(dst + simd::kTransposedColumn[r] * 16), v[r]);
    } else {
      for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 16; ++c) {
          const int64_t i = k0 + 2 * r;
          uint32_t lo = 0, hi = 0;
          if (c < cols && i < k) lo = w[(j0 + c) * k + i];
          if (c < cols && i + 1 < k) hi = w[(j0 + c) * k + i + 1];
          dst[r * 16 + c] = lo | (hi << 16);
        }
    }
  }
}

inline uint16_t to_bf16(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline float from_bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// 16 f32 → bf16, rounding to nearest even (the scalar to_bf16, lane-wise).
inline __m256i to_bf16x16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), odd);
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}
inline __m512 from_bf16x16(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

struct Shared {
  std::vector<uint16_t> hi, lo;  // [n_pad, k_pad]
};

// ---- Up to 16 tokens (batched decode): the weights as the A operand ----
// Packing W into B's pair-interleaved layout costs a transpose per 1 KiB of
// weights on every call, which is most of a 16-token step's time (perf:
// pack_b 43%, the tile products 28%). Here W is the A operand instead, read
// in place: an A tile is 16 output rows × 32 k, rows k × 2 bytes apart. The
// tokens are B, packed once per call, and C tiles hold [16 outputs][16
// tokens], transposed into y. Needs k % 32 == 0 (a tile row must not run
// into the next weight row).
constexpr int64_t kFewTokensMax = 16;
constexpr int kBlocksPerItem = 4;  // C tiles 0..3: 64 outputs per work item

// x_hi / x_lo of tokens [0, n) (zero rows up to 16) in B's layout:
// [k / 32][16 pair rows][16 tokens] words, word = x[t][32 s + 2 r .. + 1].
void pack_tokens(const float* x, int64_t n, int64_t k, uint32_t* b_hi, uint32_t* b_lo, int64_t s0, int64_t s1) {
  for (int64_t s = s0; s < s1; ++s) {
    __m512 hi[16], lo[16];
    for (int t = 0; t < 16; ++t) {
      __m256i h0 = _mm256_setzero_si256(), h1 = h0, l0 = h0, l1 = h0;
      if (t < n) {
        const __m512 v0 = _mm512_loadu_ps(x + t * k + s * kTileK), v1 = _mm512_loadu_ps(x + t * k + s * kTileK + 16);
        h0 = to_bf16x16(v0);
        h1 = to_bf16x16(v1);
        l0 = to_bf16x16(_mm512_sub_ps(v0, from_bf16x16(h0)));
        l1 = to_bf16x16(_mm512_sub_ps(v1, from_bf16x16(h1)));
      }
      // 32 bf16 of k = 16 words (pairs) per token.
      hi[t] = _mm512_castsi512_ps(_mm512_inserti64x4(_mm512_castsi256_si512(h0), h1, 1));
      lo[t] = _mm512_castsi512_ps(_mm512_inserti64x4(_mm512_castsi256_si512(l0), l1, 1));
    }
    simd::transpose(hi);
    simd::transpose(lo);
    for (int r = 0; r < 16; ++r) {
      _mm512_store_ps(reinterpret_cast<float*>(b_hi + s * 256 + simd::kTransposedColumn[r] * 16), hi[r]);
      _mm512_store_ps(reinterpret_cast<float*>(b_lo + s * 256 + simd::kTransposedColumn[r] * 16), lo[r]);
    }
  }
}

// C tile `c_tile` ([16 outputs from j0][16 tokens]) into y[t, j0 + j] for
// t < n, j < cols.
void store_transposed(const float* c_tile, int64_t n, int64_t m, int64_t j0, int64_t cols, float* y) {
  __m512 v[16];
  for (int r = 0; r < 16; ++r) v[r] = _mm512_load_ps(c_tile + r * 16);
  simd::transpose(v);
  const __mmask16 mask = cols >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << cols) - 1u);
  for (int c = 0; c < 16; ++c) {
    const int t = simd::kTransposedColumn[c];
    if (t < n) _mm512_mask_storeu_ps(y + t * m + j0, mask, v[c]);
  }
}

// NB blocks of 16 outputs: a[i] points at block i's first weight row.
// Tiles: C 0..3, A 4 and 7 (alternating, so a load need not wait for the
// previous block's products), B hi 5, B lo 6. No software prefetch: 8 tile
// steps ahead on each of the 64 row streams measured slower than none
// (bench/matmul_bench, 16 tokens: lm_head 50% against 81% of the read
// bandwidth, gate/up 73% against 93%, best of three).
template <int NB>
void few_tokens_blocks(const uint16_t* const* a, int64_t k, const uint32_t* b_hi, const uint32_t* b_lo) {
  const int64_t stride = k * 2;
  _tile_zero(0);
  if constexpr (NB > 1) _tile_zero(1);
  if constexpr (NB > 2) _tile_zero(2);
  if constexpr (NB > 3) _tile_zero(3);
  for (int64_t s = 0; s < k / kTileK; ++s) {
    _tile_loadd(5, b_hi + s * 256, 64);
    _tile_loadd(6, b_lo + s * 256, 64);
    _tile_loadd(4, a[0] + s * kTileK, stride);
    _tile_dpbf16ps(0, 4, 5);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NB > 1) {
      _tile_loadd(7, a[1] + s * kTileK, stride);
      _tile_dpbf16ps(1, 7, 5);
      _tile_dpbf16ps(1, 7, 6);
    }
    if constexpr (NB > 2) {
      _tile_loadd(4, a[2] + s * kTileK, stride);
      _tile_dpbf16ps(2, 4, 5);
      _tile_dpbf16ps(2, 4, 6);
    }
    if constexpr (NB > 3) {
      _tile_loadd(7, a[3] + s * kTileK, stride);
      _tile_dpbf16ps(3, 7, 5);
      _tile_dpbf16ps(3, 7, 6);
    }
  }
}

struct FewTokensShared {
  std::vector<uint32_t> b;  // b_hi then b_lo, 64-byte aligned inside
};

void amx_matmul_few_tokens(const float* x, int64_t n, const uint16_t* w, int64_t m, int64_t k, float* y) {
  const int64_t steps = k / kTileK;
  static thread_local FewTokensShared shared_buf;  // the calling thread's, reached below through `sh`
  FewTokensShared& sh = shared_buf;
  sh.b.resize(static_cast<size_t>(2 * steps * 256) + 16);
  uint32_t* b_hi = reinterpret_cast<uint32_t*>((reinterpret_cast<uintptr_t>(sh.b.data()) + 63) & ~uintptr_t{63});
  uint32_t* b_lo = b_hi + steps * 256;
  const int64_t n_blocks = (m + 15) / 16, n_items = (n_blocks + kBlocksPerItem - 1) / kBlocksPerItem;
#pragma omp parallel
  {
    const int nt = omp_get_num_threads(), me = omp_get_thread_num();
    pack_tokens(x, n, k, b_hi, b_lo, steps * me / nt, steps * (me + 1) / nt);
    configure_tiles();
    // The last block when m % 16 != 0: its rows copied, zero-padded to 16.
    static thread_local std::vector<uint16_t> tail;
    alignas(64) float c_tile[16 * 16];
#pragma omp barrier
#pragma omp for schedule(dynamic, 1)  // threads of a shared VM run at unequal speed
    for (int64_t item = 0; item < n_items; ++item) {
      const int64_t b0 = item * kBlocksPerItem, nb = std::min<int64_t>(kBlocksPerItem, n_blocks - b0);
      const uint16_t* a[kBlocksPerItem];
      for (int64_t i = 0; i < nb; ++i) {
        const int64_t j0 = (b0 + i) * 16;
        if (j0 + 16 <= m) {
          a[i] = w + j0 * k;
        } else {
          tail.assign(static_cast<size_t>(16 * k), 0);
          std::memcpy(tail.data(), w + j0 * k, static_cast<size_t>((m - j0) * k) * sizeof(uint16_t));
          a[i] = tail.data();
        }
      }
      switch (nb) {
        case 1: few_tokens_blocks<1>(a, k, b_hi, b_lo); break;
        case 2: few_tokens_blocks<2>(a, k, b_hi, b_lo); break;
        case 3: few_tokens_blocks<3>(a, k, b_hi, b_lo); break;
        default: few_tokens_blocks<4>(a, k, b_hi, b_lo); break;
      }
      for (int64_t i = 0; i < nb; ++i) {
        switch (i) {
          case 0: _tile_stored(0, c_tile, 64); break;
          case 1: _tile_stored(1, c_tile, 64); break;
          case 2: _tile_stored(2, c_tile, 64); break;
          default: _tile_stored(3, c_tile, 64); break;
        }
        const int64_t j0 = (b0 + i) * 16;
        store_transposed(c_tile, n, m, j0, std::min<int64_t>(16, m - j0), y);
      }
    }
    _tile_release();
  }
}

}  // namespace

bool amx_available() {
  static const bool ok = [] {
    if (const char* env = std::getenv("SHARDLM_AMX"); env && std::string_view(env) == "off") return false;
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
}

void amx_matmul_bf16(const float* x, int64_t n, const uint16_t* w, int64_t m, int64_t k, float* y) {
  SHARDLM_CHECK(amx_available(), "amx_matmul_bf16 without AMX");
  if (n <= kFewTokensMax && k % kTileK == 0) return amx_matmul_few_tokens(x, n, w, m, k, y);
  const int64_t k_pad = (k + kTileK - 1) / kTileK * kTileK;
  const int64_t n_pad = (n + kTileRows - 1) / kTileRows * kTileRows;
  static thread_local Shared shared_buf;  // the calling thread's; reached below through `sh`
  Shared& sh = shared_buf;
  sh.hi.resize(static_cast<size_t>(n_pad * k_pad));
  sh.lo.resize(sh.hi.size());
  uint16_t* xh = sh.hi.data();
  uint16_t* xl = sh.lo.data();
  const int64_t n_panels = (m + kPanelCols - 1) / kPanelCols;
  const int64_t n_blocks = (n_pad + 2 * kTileRows - 1) / (2 * kTileRows);  // 32-token blocks (the last may be 16)
#pragma omp parallel
  {
    // x = x_hi + x_lo in bf16, rows and k padded with zeros.
#pragma omp for schedule(static)
    for (int64_t t = 0; t < n_pad; ++t) {
      uint16_t* h = xh + t * k_pad;
      uint16_t* l = xl + t * k_pad;
      int64_t i = 0;
      if (t < n)
        for (; i + 16 <= k; i += 16) {
          const __m512 v = _mm512_loadu_ps(x + t * k + i);
          const __m256i vh = to_bf16x16(v);
          const __m512 rest = _mm512_sub_ps(v, from_bf16x16(vh));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(h + i), vh);
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(l + i), to_bf16x16(rest));
        }
      for (; i < k_pad; ++i) {
        const float v = t < n && i < k ? x[t * k + i] : 0.0f;
        h[i] = to_bf16(v);
        l[i] = to_bf16(v - from_bf16(h[i]));
      }
    }
    configure_tiles();
    static thread_local std::vector<uint32_t> panel;  // two column blocks: [2][k_pad / 32][16][16]
    panel.resize(static_cast<size_t>(2 * k_pad / kTileK * 256) + 16);
    uint32_t* b0 = reinterpret_cast<uint32_t*>((reinterpret_cast<uintptr_t>(panel.data()) + 63) & ~uintptr_t{63});
    uint32_t* b1 = b0 + k_pad / kTileK * 256;
    alignas(64) float c_tile[kTileRows * 16];
#pragma omp for schedule(dynamic, 1)  // threads of a shared VM run at unequal speed
    for (int64_t p = 0; p < n_panels; ++p) {
      const int64_t j0 = p * kPanelCols;
      pack_b(w, m, k, j0, k_pad, b0);
      pack_b(w, m, k, j0 + 16, k_pad, b1);
      for (int64_t blk = 0; blk < n_blocks; ++blk) {
        const int64_t t0 = blk * 2 * kTileRows;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        const int64_t stride = k_pad * 2;  // bytes between x rows
        const bool two_blocks = t0 + kTileRows < n_pad;
        for (int64_t s = 0; s < k_pad / kTileK; ++s) {
          _tile_loadd(5, b0 + s * 256, 64);
          _tile_loadd(6, b1 + s * 256, 64);
          for (const uint16_t* part : {xh, xl}) {
            _tile_loadd(4, part + t0 * k_pad + s * kTileK, stride);
            _tile_dpbf16ps(0, 4, 5);
            _tile_dpbf16ps(1, 4, 6);
            if (two_blocks) {
              _tile_loadd(4, part + (t0 + kTileRows) * k_pad + s * kTileK, stride);
              _tile_dpbf16ps(2, 4, 5);
              _tile_dpbf16ps(3, 4, 6);
            }
          }
        }
        // C tiles out: rows past n and columns past m are dropped.
        for (int tile = 0; tile < 4; ++tile) {
          const int64_t r0 = t0 + (tile / 2) * kTileRows, c0 = j0 + (tile % 2) * 16;
          if (r0 >= n || c0 >= m) continue;
          switch (tile) {
            case 0: _tile_stored(0, c_tile, 64); break;
            case 1: _tile_stored(1, c_tile, 64); break;
            case 2: _tile_stored(2, c_tile, 64); break;
            default: _tile_stored(3, c_tile, 64); break;
          }
          const int64_t rows = std::min<int64_t>(kTileRows, n - r0), cols = std::min<int64_t>(16, m - c0);
          for (int64_t r = 0; r < rows; ++r)
            std::memcpy(y + (r0 + r) * m + c0, c_tile + r * 16, static_cast<size_t>(cols) * sizeof(float));
        }
      }
    }
    _tile_release();
  }
}

#else  // no AMX in this build

bool amx_available() { return false; }
void amx_matmul_bf16(const float*, int64_t, const uint16_t*, int64_t, int64_t, float*) {
  fail(ErrorCode::kUnsupported, "amx_matmul_bf16: this build has no AMX kernel");
}

#endif

}  // namespace shardlm::backend
