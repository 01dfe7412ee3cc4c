// Optimised CPU ops: AVX2/FMA/F16C kernels (weights widened in registers)
// with OpenMP over output rows; portable loops when the ISA is absent.
#include "backend/ops.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "core/error.h"

#include "backend/packed_gemm.h"
#include "backend/simd.h"

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

using namespace simd;

template <DType D>
inline float load1(const void* base, int64_t i) {
  return load_as_f32(base, D, static_cast<size_t>(i));
}

constexpr int64_t kPrefetchBytes = 512;
// From this many tokens on, matmul widens each weight panel once for all of
// them (backend/packed_gemm.h) instead of once per 4-token tile.
constexpr int64_t kPackedMinTokens = 16;

// y[t, j] for RB weight rows from row j0 and TB tokens from t0: each weight
// vector is widened once and used for TB tokens.
template <DType D, int RB, int TB>
inline void matmul_tile(const float* x, int64_t k, const void* w, int64_t m, int64_t j0, int64_t t0, float* y) {
  const size_t wsize = dtype_size(D);
  const char* wrow[RB];
  for (int r = 0; r < RB; ++r) wrow[r] = static_cast<const char*>(w) + static_cast<size_t>(j0 + r) * k * wsize;
  const float* xrow[TB];
  for (int t = 0; t < TB; ++t) xrow[t] = x + (t0 + t) * k;
  float sums[RB][TB];
  int64_t i = 0;
#ifdef SHARDLM_AVX2
  Vec acc[RB][TB];
  for (int r = 0; r < RB; ++r)
    for (int t = 0; t < TB; ++t) acc[r][t] = zerov();
  for (; i + kLanes <= k; i += kLanes) {
    Vec xv[TB];
    for (int t = 0; t < TB; ++t) xv[t] = loadx(xrow[t] + i);
    for (int r = 0; r < RB; ++r) {
      // The hardware prefetcher stops at each 4 KiB page: ask for the line
      // kPrefetchBytes ahead of every row's stream so DRAM stays busy.
      prefetch(wrow[r] + i * static_cast<int64_t>(wsize) + kPrefetchBytes);
      const Vec wv = loadv<D>(wrow[r], i);
      for (int t = 0; t < TB; ++t) acc[r][t] = fmav(wv, xv[t], acc[r][t]);
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int t = 0; t < TB; ++t) sums[r][t] = hsum(acc[r][t]);
#else
  for (int r = 0; r < RB; ++r)
    for (int t = 0; t < TB; ++t) sums[r][t] = 0.0f;
#endif
  for (; i < k; ++i)
    for (int r = 0; r < RB; ++r) {
      const float wv = load1<D>(wrow[r], i);
      for (int t = 0; t < TB; ++t) sums[r][t] += wv * xrow[t][i];
    }
  for (int t = 0; t < TB; ++t)
    for (int r = 0; r < RB; ++r) y[(t0 + t) * m + j0 + r] = sums[r][t];
}

template <DType D, int RB>
inline void matmul_rows(const float* x, int64_t k, const void* w, int64_t m, int64_t j0, int64_t t0, int64_t t1,
                        float* y) {
  int64_t t = t0;
  for (; t + 4 <= t1; t += 4) matmul_tile<D, RB, 4>(x, k, w, m, j0, t, y);
  switch (t1 - t) {
    case 3: matmul_tile<D, RB, 3>(x, k, w, m, j0, t, y); break;
    case 2: matmul_tile<D, RB, 2>(x, k, w, m, j0, t, y); break;
    case 1: matmul_tile<D, RB, 1>(x, k, w, m, j0, t, y); break;
    default: break;
  }
}

template <DType D>
void matmul_typed(const float* x, int64_t n, const void* w, int64_t m, int64_t k, float* y) {
  constexpr int kRows = 4;
  constexpr int64_t kTokenBlock = 64;  // x block stays in L2 while W streams
  const int64_t n_row_blocks = (m + kRows - 1) / kRows;
#pragma omp parallel
  for (int64_t t0 = 0; t0 < n; t0 += kTokenBlock) {
    const int64_t t1 = std::min(n, t0 + kTokenBlock);
#pragma omp for schedule(static)
    for (int64_t rb = 0; rb < n_row_blocks; ++rb) {
      const int64_t j0 = rb * kRows;
      if (j0 + kRows <= m) {
        matmul_rows<D, kRows>(x, k, w, m, j0, t0, t1, y);
      } else {
        for (int64_t j = j0; j < m; ++j) matmul_rows<D, 1>(x, k, w, m, j, t0, t1, y);
      }
    }
  }
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

template <DType D>
void attention_typed(const float* q, const KvLayerView& c, const AttentionSeq* seqs, int64_t n_seqs,
                     const AttentionHeads& heads, float* out) {
  const int64_t hd = c.head_dim, nq = heads.n_q_heads, nkv = c.n_kv_heads, bs = c.block_size;
  const size_t esize = dtype_size(D);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // Work items: (chunk token, q head).
  std::vector<std::pair<int64_t, int64_t>> rows;  // (seq, t)
  for (int64_t s = 0; s < n_seqs; ++s)
    for (int64_t t = 0; t < seqs[s].n_tokens; ++t) rows.emplace_back(s, t);
  const int64_t n_rows = static_cast<int64_t>(rows.size());
#pragma omp parallel
  {
    std::vector<float> p;
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < n_rows * nq; ++item) {
      const int64_t h = item % nq;
      const AttentionSeq& s = seqs[rows[item / nq].first];
      const int64_t t = rows[item / nq].second;
      const int64_t batch_row = s.token_begin + t;
      const int64_t n_ctx = s.n_past + t + 1;
      const int64_t kvh = (heads.q_head_begin + h) / heads.group_size - heads.kv_head_begin;
      const float* qv = q + (batch_row * nq + h) * hd;
      p.resize(static_cast<size_t>(n_ctx));
      float mx = -INFINITY;
      for (int64_t j = 0; j < n_ctx; ++j) {
        const int64_t slot = static_cast<int64_t>(s.block_table[j / bs]) * bs + j % bs;
        const char* kp = static_cast<const char*>(c.k) + static_cast<size_t>((slot * nkv + kvh) * hd) * esize;
        p[j] = dot<D>(qv, kp, hd) * scale;
        mx = std::max(mx, p[j]);
      }
      float sum = 0.0f;
      for (int64_t j = 0; j < n_ctx; ++j) sum += (p[j] = std::exp(p[j] - mx));
      const float inv = 1.0f / sum;
      float* o = out + (batch_row * nq + h) * hd;
      std::fill(o, o + hd, 0.0f);
      for (int64_t j = 0; j < n_ctx; ++j) {
        const int64_t slot = static_cast<int64_t>(s.block_table[j / bs]) * bs + j % bs;
        const char* vp = static_cast<const char*>(c.v) + static_cast<size_t>((slot * nkv + kvh) * hd) * esize;
        axpy<D>(p[j] * inv, vp, o, hd);
      }
    }
  }
}

void check_seqs(const KvLayerView& c, const AttentionSeq* seqs, int64_t n_seqs) {
  for (int64_t s = 0; s < n_seqs; ++s) {
    const AttentionSeq& q = seqs[s];
    const int64_t need = (q.n_past + q.n_tokens + c.block_size - 1) / c.block_size;
    SHARDLM_CHECK(q.n_table >= need, "sequence ", s, ": block table has ", q.n_table, " entries, needs ", need);
    for (int64_t b = 0; b < need; ++b)
      SHARDLM_CHECK(q.block_table[b] >= 0 && q.block_table[b] < c.n_blocks, "sequence ", s, ": block ",
                    q.block_table[b], " outside the cache of ", c.n_blocks, " blocks");
  }
}

}  // namespace

void matmul(const float* x, int64_t n, const MatrixView& w, const VectorView* bias, float* y) {
  const int64_t m = w.rows, k = w.cols;
  if (n >= kPackedMinTokens && packed_matmul_available(w.dtype)) {
    packed_matmul(x, n, w.data, w.dtype, m, k, y);
  } else switch (w.dtype) {
    case DType::kF32: matmul_typed<DType::kF32>(x, n, w.data, m, k, y); break;
    case DType::kBF16: matmul_typed<DType::kBF16>(x, n, w.data, m, k, y); break;
    case DType::kF16: matmul_typed<DType::kF16>(x, n, w.data, m, k, y); break;
    default:
      fail(ErrorCode::kUnsupported, "matmul: no kernel for ", dtype_safetensors_name(w.dtype),
           " weights without a quantization scheme");
  }
  if (bias) {
    SHARDLM_CHECK(bias->n == m, "bias has ", bias->n, " elements, matrix ", m, " rows");
    std::vector<float> b(static_cast<size_t>(m));
    for (int64_t j = 0; j < m; ++j) b[j] = load_as_f32(bias->data, bias->dtype, static_cast<size_t>(j));
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < m; ++j) y[t * m + j] += b[j];
  }
}

void rms_norm(const float* x, int64_t n_rows, const VectorView& weight, float eps, float* out) {
  const int64_t d = weight.n;
  std::vector<float> w(static_cast<size_t>(d));
  for (int64_t i = 0; i < d; ++i) w[i] = load_as_f32(weight.data, weight.dtype, static_cast<size_t>(i));
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
          const float* inv_freq) {
  const int64_t half = head_dim / 2;
#pragma omp parallel if (n_tokens > 1)
  {
    std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < n_tokens; ++t) {
      for (int64_t i = 0; i < half; ++i) {
        const float angle = static_cast<float>(positions[t]) * inv_freq[i];
        cs[i] = std::cos(angle);
        sn[i] = std::sin(angle);
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

void silu_mul(const float* gate, const float* up, int64_t count, float* out) {
#pragma omp parallel for simd schedule(static) if (count > 65536)
  for (int64_t i = 0; i < count; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void softmax(float* x, int64_t n_rows, int64_t dim) {
#pragma omp parallel for schedule(static) if (n_rows * dim > 65536)
  for (int64_t r = 0; r < n_rows; ++r) {
    float* row = x + r * dim;
    float mx = -INFINITY;
    for (int64_t i = 0; i < dim; ++i) mx = std::max(mx, row[i]);
    float sum = 0.0f;
    for (int64_t i = 0; i < dim; ++i) sum += (row[i] = std::exp(row[i] - mx));
    const float inv = 1.0f / sum;
    for (int64_t i = 0; i < dim; ++i) row[i] *= inv;
  }
}

void add_inplace(float* y, const float* x, int64_t count) {
#pragma omp parallel for simd schedule(static) if (count > 65536)
  for (int64_t i = 0; i < count; ++i) y[i] += x[i];
}

void kv_cache_write(const KvLayerView& c, const AttentionSeq* seqs, int64_t n_seqs, const float* k, const float* v) {
  check_seqs(c, seqs, n_seqs);
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
  check_seqs(cache, seqs, n_seqs);
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
