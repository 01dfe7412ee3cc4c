// Optimised CPU ops: AVX2/FMA/F16C kernels (weights widened in registers)
// with OpenMP over output rows; portable loops when the ISA is absent.
#include "backend/cpu/ops.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "core/error.h"
#include "core/fast_exp_ops.h"

#include "backend/cpu/bf16_dot_gemm.h"
#include "backend/cpu/packed_gemm.h"
#include "backend/cpu/rows_gemm.h"
#include "backend/cpu/simd.h"

namespace shardlm::backend {

void set_num_threads(int n) {
  static const int default_threads = omp_get_max_threads();
  int threads = n > 0 ? n : default_threads;
  // A user's OMP_NUM_THREADS (its first number) caps every rank's share.
  if (const char* env = std::getenv("OMP_NUM_THREADS")) {
    char* end = nullptr;
    const long cap = std::strtol(env, &end, 10);
    if (end != env && cap > 0) threads = std::min<long>(threads, cap);
  }
  omp_set_num_threads(threads);
}

int num_threads() { return omp_get_max_threads(); }

namespace {
std::atomic<bool> g_batch_invariant{false};
}  // namespace

void set_batch_invariant(bool on) { g_batch_invariant.store(on, std::memory_order_relaxed); }
bool batch_invariant() { return g_batch_invariant.load(std::memory_order_relaxed); }

MatmulPath matmul_path(int64_t n, DType weight_dtype) {
  // Under batch invariance it keeps to its row-invariant kernel.
  if (weight_dtype == DType::kBF16 && default_dense_activations() == DenseActivations::kBf16)
    return MatmulPath::kBf16Dot;
  if (!batch_invariant() && packed_matmul_available(weight_dtype) && n >= packed_matmul_min_tokens(weight_dtype))
    return packed_uses_amx(weight_dtype) ? MatmulPath::kAmx : MatmulPath::kPacked;
  return MatmulPath::kRows;
}

const char* matmul_path_name(MatmulPath path) {
  switch (path) {
    case MatmulPath::kRows: return "rows";
    case MatmulPath::kPacked: return "packed";
    case MatmulPath::kAmx: return "amx";
    case MatmulPath::kBf16Dot: return "bf16dot";
  }
  return "rows";
}

namespace {

using namespace simd;

template <DType D>
inline float load1(const void* base, int64_t i) {
  return load_as_f32(base, D, static_cast<size_t>(i));
}

#ifdef SHARDLM_AVX2
template <DType D>
inline float dot(const float* q, const void* k, int64_t n) {
  Vec a0 = zerov(), a1 = zerov();
  int64_t i = 0;
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    a0 = fmav(loadx(q + i), loadv<D>(k, i), a0);
    a1 = fmav(loadx(q + i + kLanes), loadv<D>(k, i + kLanes), a1);
  }
  for (; i + kLanes <= n; i += kLanes) a0 = fmav(loadx(q + i), loadv<D>(k, i), a0);
  float s = hsum(a0) + hsum(a1);
  for (; i < n; ++i) s += q[i] * load1<D>(k, i);
  return s;
}

template <DType D>
inline void axpy(float a, const void* v, float* out, int64_t n) {
  const Vec av = setv(a);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) storex(out + i, fmav(av, loadv<D>(v, i), loadx(out + i)));
  for (; i < n; ++i) out[i] += a * load1<D>(v, i);
}
#else
template <DType D>
inline float dot(const float* q, const void* k, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += q[i] * load1<D>(k, i);
  return s;
}
template <DType D>
inline void axpy(float a, const void* v, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] += a * load1<D>(v, i);
}
#endif

#ifdef SHARDLM_SIMD_TRANSPOSE
// Scores of HN Q heads against 16-position blocks of K, without a horizontal
// sum per dot product: each block of K rows is transposed in registers
// (16 × 16 at a time) to kt[d][position], then every head's scores for the
// 16 positions build up in one vector: p[h][j] = scale · q_h · K_j.
// q[h]: the head's [hd] query; krow(j): K row of position j; p rows len apart.
template <DType D, int HN, class KRow>
void group_scores(const float* const* q, int64_t hd, int64_t j0, int64_t j1, const KRow& krow, float scale,
                  float* p, int64_t len) {
  alignas(64) float kt[256 * 16];  // hd <= 256
  for (int64_t jb = j0; jb < j1; jb += 16) {
    const int64_t cnt = std::min<int64_t>(16, j1 - jb);
    for (int64_t d0 = 0; d0 < hd; d0 += 16) {
      Vec v[16];
      for (int r = 0; r < 16; ++r) v[r] = r < cnt ? loadv<D>(krow(jb + r), d0) : zerov();
      transpose(v);
      for (int c = 0; c < 16; ++c) storex(kt + (d0 + kTransposedColumn[c]) * 16, v[c]);
    }
    Vec acc[HN];
    for (int h = 0; h < HN; ++h) acc[h] = zerov();
    for (int64_t d = 0; d < hd; ++d) {
      const Vec kd = loadx(kt + d * 16);
      for (int h = 0; h < HN; ++h) acc[h] = fmav(setv(q[h][d]), kd, acc[h]);
    }
    const __mmask16 keep = static_cast<__mmask16>((1u << cnt) - 1);
    for (int h = 0; h < HN; ++h)
      _mm512_mask_storeu_ps(p + h * len + (jb - j0), keep, _mm512_mul_ps(acc[h], setv(scale)));
  }
}

// o_h = Σ_j p[h][j] · V_j for HN heads with the outputs in registers (HV
// vectors each), so a V row is read once for the HN heads and no partial
// output goes through memory. o[h]: the head's [hd = 16 HV] output.
template <DType D, int HV, int HN, class VRow>
void group_values(const float* p, int64_t len, int64_t j0, const VRow& vrow, float* const* o) {
  Vec acc[HN][HV];
  for (int h = 0; h < HN; ++h)
    for (int i = 0; i < HV; ++i) acc[h][i] = zerov();
  for (int64_t j = 0; j < len; ++j) {
    const void* vp = vrow(j0 + j);
    Vec vv[HV];
    for (int i = 0; i < HV; ++i) vv[i] = loadv<D>(vp, 16 * i);
    for (int h = 0; h < HN; ++h) {
      const Vec w = setv(p[h * len + j]);
      for (int i = 0; i < HV; ++i) acc[h][i] = fmav(w, vv[i], acc[h][i]);
    }
  }
  for (int h = 0; h < HN; ++h)
    for (int i = 0; i < HV; ++i) storex(o[h] + 16 * i, acc[h][i]);
}

// Dispatch on the group's head count: scores 8 heads per pass; values as
// many heads as leave their outputs in registers (24 of 32 zmm).
template <DType D, class KRow>
void all_scores(const float* const* q, int64_t nh, int64_t hd, int64_t j0, int64_t j1, const KRow& krow, float scale,
                float* p, int64_t len) {
  for (int64_t h0 = 0; h0 < nh; h0 += 8) {
    const float* const* qh = q + h0;
    float* ph = p + h0 * len;
    switch (std::min<int64_t>(8, nh - h0)) {
      case 1: group_scores<D, 1>(qh, hd, j0, j1, krow, scale, ph, len); break;
      case 2: group_scores<D, 2>(qh, hd, j0, j1, krow, scale, ph, len); break;
      case 3: group_scores<D, 3>(qh, hd, j0, j1, krow, scale, ph, len); break;
      case 4: group_scores<D, 4>(qh, hd, j0, j1, krow, scale, ph, len); break;
      case 5: group_scores<D, 5>(qh, hd, j0, j1, krow, scale, ph, len); break;
      case 6: group_scores<D, 6>(qh, hd, j0, j1, krow, scale, ph, len); break;
      case 7: group_scores<D, 7>(qh, hd, j0, j1, krow, scale, ph, len); break;
      default: group_scores<D, 8>(qh, hd, j0, j1, krow, scale, ph, len); break;
    }
  }
}

template <DType D, int HV, class VRow>
void all_values(const float* p, int64_t nh, int64_t len, int64_t j0, const VRow& vrow, float* const* o) {
  constexpr int kHeads = 24 / HV;
  for (int64_t h0 = 0; h0 < nh; h0 += kHeads) {
    const float* ph = p + h0 * len;
    float* const* oh = o + h0;
    switch (std::min<int64_t>(kHeads, nh - h0)) {
      case 1: group_values<D, HV, 1>(ph, len, j0, vrow, oh); break;
      case 2: group_values<D, HV, 2>(ph, len, j0, vrow, oh); break;
      case 3: group_values<D, HV, 3>(ph, len, j0, vrow, oh); break;
      case 4: group_values<D, HV, (kHeads >= 4 ? 4 : 3)>(ph, len, j0, vrow, oh); break;
      case 5: group_values<D, HV, (kHeads >= 5 ? 5 : 3)>(ph, len, j0, vrow, oh); break;
      default: group_values<D, HV, (kHeads >= 6 ? 6 : 3)>(ph, len, j0, vrow, oh); break;
    }
  }
}
#endif

// x[i] = fast_exp(x[i] - sub) (core/fast_exp_ops.h): whole vectors of the
// widest kind this file is built for, then the same operations one element
// at a time, so every element gets the same bits wherever it falls.
inline void exp_shifted_inplace(float* x, int64_t n, float sub) {
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 s = _mm512_set1_ps(sub);
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), s)));
#elif defined(__AVX2__) && defined(__FMA__)
  const __m256 s = _mm256_set1_ps(sub);
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), s)));
#endif
  for (; i < n; ++i) x[i] = fast_exp_scalar(x[i] - sub);
}

// One unit of attention work: the Q heads [h0, h1) that share local KV head
// kvh, for one batch row, over context positions [j0, j1).
struct AttentionItem {
  int64_t seq, t, kvh, h0, h1, j0, j1;
  int64_t partial;  // index of its partial result when the context is split, else -1
};

// Positions per split-K chunk: below this a chunk's merge costs more than the
// parallelism it buys.
constexpr int64_t kMinSplitPositions = 256;

// GQA-aware paged attention: each item reads a cached K and V row once for
// all the Q heads of its group (not once per Q head). At batch 1 a long
// context is split into chunks (flash-decoding) so every thread has work;
// chunks keep (max, Σexp, Σexp·V) and are merged in a second pass.
template <DType D>
void attention_typed(const float* q, const KvLayerView& c, const AttentionSeq* seqs, int64_t n_seqs,
                     const AttentionHeads& heads, float* out) {
  const int64_t hd = c.head_dim, nq = heads.n_q_heads, nkv = c.n_kv_heads, bs = c.block_size, g = heads.group_size;
  const size_t esize = dtype_size(D);
  const float scale = heads.scale_for(hd);
  // Local KV heads that this rank's Q heads read, and each one's Q heads.
  const int64_t kv_first = heads.q_head_begin / g - heads.kv_head_begin;
  const int64_t kv_last = (heads.q_head_begin + nq - 1) / g - heads.kv_head_begin;
  // The calling thread's buffers, reused across steps (thread_local: each
  // rank's thread has its own); the parallel region reaches them through
  // `items` and `partials`, which are references to them.
  static thread_local std::vector<AttentionItem> item_buf;
  static thread_local std::vector<float> partial_buf;  // per split item: [heads][hd + 2]
  std::vector<AttentionItem>& items = item_buf;
  std::vector<float>& partials = partial_buf;
  items.clear();
  int64_t n_rows = 0;
  for (int64_t s = 0; s < n_seqs; ++s) n_rows += seqs[s].n_tokens;
  const int64_t n_groups = nq > 0 ? kv_last - kv_first + 1 : 0;
  const int64_t want_items = 2 * static_cast<int64_t>(omp_get_max_threads());
  int64_t n_partial = 0;
  for (int64_t s = 0; s < n_seqs; ++s)
    for (int64_t t = 0; t < seqs[s].n_tokens; ++t) {
      const int64_t n_ctx = seqs[s].n_past + t + 1;
      // Keys [first, n_ctx): the whole past, or the last `window` of it.
      const int64_t first = heads.window > 0 ? std::max<int64_t>(0, n_ctx - heads.window) : 0;
      const int64_t n_keys = n_ctx - first;
      int64_t chunks = 1;
      if (batch_invariant()) {
        // The split (and so the order of the sums) from the context alone,
        // never from how many rows share the step.
        chunks = std::clamp<int64_t>(n_keys / kMinSplitPositions, 1, std::max<int64_t>(1, want_items / n_groups));
      } else if (n_rows * n_groups < want_items) {
        chunks = std::clamp<int64_t>(n_keys / kMinSplitPositions, 1,
                                     (want_items + n_rows * n_groups - 1) / (n_rows * n_groups));
      }
      for (int64_t kvh = kv_first; kvh <= kv_last; ++kvh) {
        const int64_t global_kv = kvh + heads.kv_head_begin;
        const int64_t h0 = std::max<int64_t>(0, global_kv * g - heads.q_head_begin);
        const int64_t h1 = std::min<int64_t>(nq, (global_kv + 1) * g - heads.q_head_begin);
        for (int64_t ch = 0; ch < chunks; ++ch)
          items.push_back({s, t, kvh, h0, h1, first + n_keys * ch / chunks, first + n_keys * (ch + 1) / chunks,
                           chunks > 1 ? n_partial++ : -1});
      }
    }
  SHARDLM_CHECK(kv_last < nkv, "attention: Q heads [", heads.q_head_begin, ", ", heads.q_head_begin + nq,
                ") need local KV head ", kv_last, ", the cache holds ", nkv);
  const int64_t max_group = std::min<int64_t>(g, nq);
  const int64_t partial_stride = max_group * (hd + 2);
  partials.resize(static_cast<size_t>(n_partial * partial_stride));
  const int64_t n_items = static_cast<int64_t>(items.size());
#pragma omp parallel
  {
    static thread_local std::vector<float> p;  // [heads of the group][positions of the item]
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < n_items; ++it) {
      const AttentionItem& a = items[it];
      const AttentionSeq& s = seqs[a.seq];
      const int64_t row = s.token_begin + a.t, nh = a.h1 - a.h0, len = a.j1 - a.j0;
      p.resize(static_cast<size_t>(nh * len));
      float* dst_base = a.partial >= 0 ? partials.data() + a.partial * partial_stride : nullptr;
      float sums[64], maxes[64];  // per head of the group (groups are at most 64 heads here)
      SHARDLM_CHECK(nh <= 64, "attention: a KV group of ", nh, " Q heads exceeds 64");
      const float* q_heads[64];
      float* o_heads[64];
      for (int64_t h = 0; h < nh; ++h) {
        q_heads[h] = q + (row * nq + a.h0 + h) * hd;
        o_heads[h] = dst_base ? dst_base + h * (hd + 2) + 2 : out + (row * nq + a.h0 + h) * hd;
      }
      auto cache_row = [&](const void* base, int64_t j) {
        const int64_t slot = static_cast<int64_t>(s.block_table[j / bs]) * bs + j % bs;
        return static_cast<const char*>(base) + static_cast<size_t>((slot * nkv + a.kvh) * hd) * esize;
      };
      auto k_row = [&](int64_t j) { return cache_row(c.k, j); };
      auto v_row = [&](int64_t j) { return cache_row(c.v, j); };
#ifdef SHARDLM_SIMD_TRANSPOSE
      const bool fast = hd % 16 == 0 && hd <= 256;
      if (fast) {
        all_scores<D>(q_heads, nh, hd, a.j0, a.j1, k_row, scale, p.data(), len);
      } else
#endif
        for (int64_t j = a.j0; j < a.j1; ++j) {
          const char* kp = k_row(j);
          for (int64_t h = 0; h < nh; ++h) p[h * len + (j - a.j0)] = dot<D>(q_heads[h], kp, hd) * scale;
        }
      for (int64_t h = 0; h < nh; ++h) {
        float* ph = p.data() + h * len;
        float mx = -INFINITY;
        for (int64_t j = 0; j < len; ++j) mx = std::max(mx, ph[j]);
        exp_shifted_inplace(ph, len, mx);
        float sum = 0.0f;
        for (int64_t j = 0; j < len; ++j) sum += ph[j];  // in order: the sum depends on len alone
        maxes[h] = mx;
        sums[h] = sum;
      }
#ifdef SHARDLM_SIMD_TRANSPOSE
      if (hd == 64) {
        all_values<D, 4>(p.data(), nh, len, a.j0, v_row, o_heads);
      } else if (hd == 128) {
        all_values<D, 8>(p.data(), nh, len, a.j0, v_row, o_heads);
      } else
#endif
      {
        for (int64_t h = 0; h < nh; ++h) std::fill(o_heads[h], o_heads[h] + hd, 0.0f);
        for (int64_t j = a.j0; j < a.j1; ++j) {
          const char* vp = v_row(j);
          for (int64_t h = 0; h < nh; ++h) axpy<D>(p[h * len + (j - a.j0)], vp, o_heads[h], hd);
        }
      }
      for (int64_t h = 0; h < nh; ++h) {
        if (dst_base) {
          dst_base[h * (hd + 2)] = maxes[h];
          dst_base[h * (hd + 2) + 1] = sums[h];
        } else {
          float* o = out + (row * nq + a.h0 + h) * hd;
          const float inv = 1.0f / sums[h];
          for (int64_t i = 0; i < hd; ++i) o[i] *= inv;
        }
      }
    }
    // Merge split chunks: out = Σ_c e^(m_c - M)·o_c / Σ_c e^(m_c - M)·l_c.
    // A split row's chunks are consecutive items; the first of them merges.
#pragma omp for schedule(static)
    for (int64_t it = 0; it < n_items; ++it) {
      const AttentionItem& a = items[it];
      if (a.partial < 0 || (it > 0 && items[it - 1].partial >= 0 && items[it - 1].seq == a.seq &&
                            items[it - 1].t == a.t && items[it - 1].kvh == a.kvh))
        continue;
      int64_t last = it;
      while (last + 1 < n_items && items[last + 1].partial >= 0 && items[last + 1].seq == a.seq &&
             items[last + 1].t == a.t && items[last + 1].kvh == a.kvh)
        ++last;
      const int64_t row = seqs[a.seq].token_begin + a.t;
      for (int64_t h = 0; h < a.h1 - a.h0; ++h) {
        float mx = -INFINITY;
        for (int64_t c2 = it; c2 <= last; ++c2)
          mx = std::max(mx, partials[items[c2].partial * partial_stride + h * (hd + 2)]);
        float* o = out + (row * nq + a.h0 + h) * hd;
        std::fill(o, o + hd, 0.0f);
        float denom = 0.0f;
        for (int64_t c2 = it; c2 <= last; ++c2) {
          const float* part = partials.data() + items[c2].partial * partial_stride + h * (hd + 2);
          const float w = fast_exp_scalar(part[0] - mx);
          denom += w * part[1];
          for (int64_t i = 0; i < hd; ++i) o[i] += w * part[2 + i];
        }
        const float inv = 1.0f / denom;
        for (int64_t i = 0; i < hd; ++i) o[i] *= inv;
      }
    }
  }
}

// Checks the block entries of the positions a kernel touches: from
// first_position(q) (a write: n_past; attention: the first key the window
// reads) to n_past + n_tokens. Entries before it may be holes (-1): blocks
// the scheduler released once they left a sliding window.
template <typename FirstPosition>
void check_seqs(const KvLayerView& c, const AttentionSeq* seqs, int64_t n_seqs, FirstPosition first_position) {
  for (int64_t s = 0; s < n_seqs; ++s) {
    const AttentionSeq& q = seqs[s];
    const int64_t need = (q.n_past + q.n_tokens + c.block_size - 1) / c.block_size;
    SHARDLM_CHECK(q.n_table >= need, "sequence ", s, ": block table has ", q.n_table, " entries, needs ", need);
    for (int64_t b = first_position(q) / c.block_size; b < need; ++b)
      SHARDLM_CHECK(q.block_table[b] >= 0 && q.block_table[b] < c.n_blocks, "sequence ", s, ": block ",
                    q.block_table[b], " outside the cache of ", c.n_blocks, " blocks");
  }
}

}  // namespace

namespace {
// y[t, j] += bias[j] for t < n, j < m (after the product, as ref::matmul).
void add_bias(int64_t n, int64_t m, const VectorView* bias, float* y) {
  if (!bias) return;
  SHARDLM_CHECK(bias->n == m, "bias has ", bias->n, " elements, matrix ", m, " rows");
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < m; ++j) y[t * m + j] += load_as_f32(bias->data, bias->dtype, static_cast<size_t>(j));
}
}  // namespace

void matmul(const float* x, int64_t n, const MatrixView& w, const VectorView* bias, float* y) {
  const int64_t m = w.rows, k = w.cols;
  switch (matmul_path(n, w.dtype)) {
    case MatmulPath::kRows: rows_gemm(active_cpu_isa(), x, n, w.data, w.dtype, m, k, y); break;
    case MatmulPath::kPacked:
    case MatmulPath::kAmx: packed_matmul(x, n, w.data, w.dtype, m, k, y); break;
    case MatmulPath::kBf16Dot: bf16_dot_gemm(x, n, static_cast<const uint16_t*>(w.data), m, k, y); break;
  }
  add_bias(n, m, bias, y);
}

void matmul_many(const float* x, int64_t n, const MatmulPart* parts, int64_t n_parts) {
  bool grouped = n_parts > 1 && n_parts <= kRowsGemmMaxParts;
  for (int64_t p = 0; p < n_parts && grouped; ++p) {
    const MatrixView& w = parts[p].w;
    grouped = w.dtype == parts[0].w.dtype && w.cols == parts[0].w.cols && matmul_path(n, w.dtype) == MatmulPath::kRows;
  }
  if (!grouped) {
    for (int64_t p = 0; p < n_parts; ++p) matmul(x, n, parts[p].w, parts[p].bias, parts[p].y);
    return;
  }
  RowsGemmPart rows[kRowsGemmMaxParts];
  for (int64_t p = 0; p < n_parts; ++p) rows[p] = {parts[p].w.data, parts[p].w.rows, parts[p].y};
  rows_gemm_many(active_cpu_isa(), x, n, parts[0].w.cols, parts[0].w.dtype, rows, n_parts);
  for (int64_t p = 0; p < n_parts; ++p) add_bias(n, parts[p].w.rows, parts[p].bias, parts[p].y);
}

void rms_norm(const float* x, int64_t n_rows, const VectorView& weight, float eps, float* out, float weight_offset) {
  const int64_t d = weight.n;
  static thread_local std::vector<float> w_buf;  // the weight in f32, reused across calls
  w_buf.resize(static_cast<size_t>(d));
  float* w = w_buf.data();
  for (int64_t i = 0; i < d; ++i)
    w[i] = weight_offset + load_as_f32(weight.data, weight.dtype, static_cast<size_t>(i));
#pragma omp parallel for schedule(static) if (n_rows * d > 32768)
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * d;
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < d; ++i) ss += xr[i] * xr[i];
    const float scale = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
    float* o = out + r * d;
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) o[i] = xr[i] * scale * w[i];
  }
}

void rope_inv_freq(const RopeConfig& c, float* inv_freq) {
  const int64_t half = c.head_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    // HF: 1 / theta^(arange(0, dim, 2) / dim), computed in f32.
    float f = static_cast<float>(1.0 / std::pow(c.theta, static_cast<double>(2 * i) / static_cast<double>(c.head_dim)));
    if (c.scaling == RopeConfig::Scaling::kLinear) {
      f = static_cast<float>(f / c.factor);
    } else if (c.scaling == RopeConfig::Scaling::kLongRope) {
      f = static_cast<float>(f / c.ext_factors.at(static_cast<size_t>(i)));
    } else if (c.scaling == RopeConfig::Scaling::kLlama3) {
      const double old_len = static_cast<double>(c.original_max_position);
      const double low_wavelen = old_len / c.low_freq_factor;
      const double high_wavelen = old_len / c.high_freq_factor;
      const double wavelen = 2.0 * M_PI / f;
      if (wavelen > low_wavelen) {
        f = static_cast<float>(f / c.factor);
      } else if (wavelen >= high_wavelen) {  // medium band: interpolate
        const double smooth = (old_len / wavelen - c.low_freq_factor) / (c.high_freq_factor - c.low_freq_factor);
        f = static_cast<float>((1.0 - smooth) * f / c.factor + smooth * f);
      }
    }
    inv_freq[i] = f;
  }
}

void rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const int32_t* positions,
          const float* inv_freq, int64_t rotary_dim, float mscale, const float* inv_freq_long,
          const uint8_t* use_long) {
  const int64_t half = (rotary_dim > 0 ? rotary_dim : head_dim) / 2;
#pragma omp parallel if (n_tokens > 1)
  {
    static thread_local std::vector<float> cs, sn;  // per thread, reused across calls
    cs.resize(static_cast<size_t>(half));
    sn.resize(static_cast<size_t>(half));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < n_tokens; ++t) {
      const float* freq = use_long != nullptr && use_long[t] != 0 ? inv_freq_long : inv_freq;
      for (int64_t i = 0; i < half; ++i) {
        const float angle = static_cast<float>(positions[t]) * freq[i];
        cs[i] = std::cos(angle) * mscale;
        sn[i] = std::sin(angle) * mscale;
      }
      for (int64_t h = 0; h < n_heads; ++h) {
        float* v = x + (t * n_heads + h) * head_dim;
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const float a = v[i], b = v[i + half];
          v[i] = a * cs[i] - b * sn[i];
          v[i + half] = b * cs[i] + a * sn[i];
        }
      }
    }
  }
}

// out = g / (1 + fast_exp(-g)) * u: vectors of the widest kind this file is
// built for and then the same operations one element at a time (the same
// bits either way), in blocks that the threads split when there are many.
void silu_mul(const float* gate, const float* up, int64_t count, float* out) {
  constexpr int64_t kBlock = 4096;
  const int64_t n_blocks = (count + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (count > 65536)
  for (int64_t b = 0; b < n_blocks; ++b) {
    int64_t i = b * kBlock;
    const int64_t end = std::min(count, i + kBlock);
#if defined(__AVX512F__)
    const __m512i sign = _mm512_set1_epi32(static_cast<int32_t>(0x80000000u));
    for (; i + 16 <= end; i += 16) {
      const __m512 g = _mm512_loadu_ps(gate + i);
      const __m512 e = exp16(_mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(g), sign)));
      _mm512_storeu_ps(out + i,
                       _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), _mm512_loadu_ps(up + i)));
    }
#elif defined(__AVX2__) && defined(__FMA__)
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (; i + 8 <= end; i += 8) {
      const __m256 g = _mm256_loadu_ps(gate + i);
      const __m256 e = exp8(_mm256_xor_ps(g, sign));
      _mm256_storeu_ps(out + i,
                       _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), _mm256_loadu_ps(up + i)));
    }
#endif
    for (; i < end; ++i) {
      const float g = gate[i];
      out[i] = g / (1.0f + fast_exp_scalar(-g)) * up[i];
    }
  }
}

void gelu_tanh_mul(const float* gate, const float* up, int64_t count, float* out) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
#pragma omp parallel for simd schedule(static) if (count > 65536)
  for (int64_t i = 0; i < count; ++i) {
    const float g = gate[i];
    out[i] = 0.5f * g * (1.0f + std::tanh(kSqrt2OverPi * (g + 0.044715f * g * g * g))) * up[i];
  }
}

void scale_inplace(float* x, int64_t count, float s) {
#pragma omp parallel for simd schedule(static) if (count > 65536)
  for (int64_t i = 0; i < count; ++i) x[i] *= s;
}

void softmax(float* x, int64_t n_rows, int64_t dim) {
#pragma omp parallel for schedule(static) if (n_rows * dim > 65536)
  for (int64_t r = 0; r < n_rows; ++r) {
    float* row = x + r * dim;
    float mx = -INFINITY;
    for (int64_t i = 0; i < dim; ++i) mx = std::max(mx, row[i]);
    exp_shifted_inplace(row, dim, mx);
    float sum = 0.0f;
    for (int64_t i = 0; i < dim; ++i) sum += row[i];
    const float inv = 1.0f / sum;
    for (int64_t i = 0; i < dim; ++i) row[i] *= inv;
  }
}

void add_inplace(float* y, const float* x, int64_t count) {
#pragma omp parallel for simd schedule(static) if (count > 65536)
  for (int64_t i = 0; i < count; ++i) y[i] += x[i];
}

void kv_cache_write(const KvLayerView& c, const AttentionSeq* seqs, int64_t n_seqs, const float* k, const float* v) {
  check_seqs(c, seqs, n_seqs, [](const AttentionSeq& q) { return q.n_past; });
  const int64_t row_elems = c.n_kv_heads * c.head_dim;
  for (int64_t s = 0; s < n_seqs; ++s) {
    const AttentionSeq& q = seqs[s];
    for (int64_t t = 0; t < q.n_tokens; ++t) {
      const int64_t pos = q.n_past + t;
      const int64_t slot = static_cast<int64_t>(q.block_table[pos / c.block_size]) * c.block_size + pos % c.block_size;
      const float* ks = k + (q.token_begin + t) * row_elems;
      const float* vs = v + (q.token_begin + t) * row_elems;
      const size_t base = static_cast<size_t>(slot * row_elems);
      for (int64_t i = 0; i < row_elems; ++i) {
        store_from_f32(c.k, c.dtype, base + i, ks[i]);
        store_from_f32(c.v, c.dtype, base + i, vs[i]);
      }
    }
  }
}

void paged_attention(const float* q, const KvLayerView& cache, const AttentionSeq* seqs, int64_t n_seqs,
                     const AttentionHeads& heads, float* out) {
  check_seqs(cache, seqs, n_seqs, [&](const AttentionSeq& q) {
    return heads.window > 0 ? std::max<int64_t>(0, q.n_past + 1 - heads.window) : int64_t{0};
  });
  switch (cache.dtype) {
    case DType::kF32: attention_typed<DType::kF32>(q, cache, seqs, n_seqs, heads, out); break;
    case DType::kBF16: attention_typed<DType::kBF16>(q, cache, seqs, n_seqs, heads, out); break;
    case DType::kF16: attention_typed<DType::kF16>(q, cache, seqs, n_seqs, heads, out); break;
    // FP8 E4M3 (--kv-cache-dtype fp8): written by kv_cache_write with scale 1 (vLLM's default
    // k_scale/v_scale without calibration), saturating at ±448; widened in registers here.
    case DType::kF8E4M3: attention_typed<DType::kF8E4M3>(q, cache, seqs, n_seqs, heads, out); break;
    default:
      fail(ErrorCode::kUnsupported, "paged_attention: no kernel for a ", dtype_safetensors_name(cache.dtype),
           " KV cache");
  }
}

}  // namespace shardlm::backend
