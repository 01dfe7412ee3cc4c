// Scalar references: the plainest loops that meet each contract in ops.h.
#include <cmath>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/error.h"

namespace shardlm::backend::ref {

void matmul(const float* x, int64_t n, const MatrixView& w, const VectorView* bias, float* y) {
  const int64_t m = w.rows, k = w.cols;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < m; ++j) {
      double acc = 0.0;
      for (int64_t i = 0; i < k; ++i)
        acc += static_cast<double>(x[t * k + i]) * load_as_f32(w.data, w.dtype, static_cast<size_t>(j * k + i));
      if (bias) acc += load_as_f32(bias->data, bias->dtype, static_cast<size_t>(j));
      y[t * m + j] = static_cast<float>(acc);
    }
  }
}

void rms_norm(const float* x, int64_t n_rows, const VectorView& weight, float eps, float* out, float weight_offset) {
  const int64_t d = weight.n;
  for (int64_t r = 0; r < n_rows; ++r) {
    double ss = 0.0;
    for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(x[r * d + i]) * x[r * d + i];
    const float scale = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(d) + eps));
    for (int64_t i = 0; i < d; ++i)
      out[r * d + i] =
          x[r * d + i] * scale * (weight_offset + load_as_f32(weight.data, weight.dtype, static_cast<size_t>(i)));
  }
}

void rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const int32_t* positions,
          const float* inv_freq, int64_t rotary_dim, float mscale) {
  const int64_t half = (rotary_dim > 0 ? rotary_dim : head_dim) / 2;
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const float angle = static_cast<float>(positions[t]) * inv_freq[i];
        const float c = std::cos(angle) * mscale, s = std::sin(angle) * mscale;
        const float a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
      }
    }
  }
}

void silu_mul(const float* gate, const float* up, int64_t count, float* out) {
  for (int64_t i = 0; i < count; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void gelu_tanh_mul(const float* gate, const float* up, int64_t count, float* out) {
  for (int64_t i = 0; i < count; ++i) {
    const double g = gate[i];
    const double inner = std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g);
    out[i] = static_cast<float>(0.5 * g * (1.0 + std::tanh(inner)) * up[i]);
  }
}

void softmax(float* x, int64_t n_rows, int64_t dim) {
  for (int64_t r = 0; r < n_rows; ++r) {
    float* row = x + r * dim;
    float mx = -INFINITY;
    for (int64_t i = 0; i < dim; ++i) mx = std::max(mx, row[i]);
    double sum = 0.0;
    for (int64_t i = 0; i < dim; ++i) {
      row[i] = std::exp(row[i] - mx);
      sum += row[i];
    }
    for (int64_t i = 0; i < dim; ++i) row[i] = static_cast<float>(row[i] / sum);
  }
}

void paged_attention(const float* q, const KvLayerView& cache, const AttentionSeq* seqs, int64_t n_seqs,
                     const AttentionHeads& heads, float* out) {
  const int64_t hd = cache.head_dim, nq = heads.n_q_heads, nkv = cache.n_kv_heads, bs = cache.block_size;
  const double scale = heads.scale > 0.0f ? heads.scale : 1.0 / std::sqrt(static_cast<double>(hd));
  auto at = [&](const void* base, int64_t pos, const AttentionSeq& s, int64_t kvh, int64_t i) {
    const int64_t block = s.block_table[pos / bs];
    const size_t idx = static_cast<size_t>(((block * bs + pos % bs) * nkv + kvh) * hd + i);
    return static_cast<double>(load_as_f32(base, cache.dtype, idx));
  };
  for (int64_t si = 0; si < n_seqs; ++si) {
    const AttentionSeq& s = seqs[si];
    for (int64_t t = 0; t < s.n_tokens; ++t) {
      const int64_t row = s.token_begin + t;
      const int64_t n_ctx = s.n_past + t + 1;
      for (int64_t h = 0; h < nq; ++h) {
        const int64_t kvh = (heads.q_head_begin + h) / heads.group_size - heads.kv_head_begin;
        SHARDLM_CHECK(kvh >= 0 && kvh < nkv, "q head ", h, " maps to local kv head ", kvh);
        const float* qv = q + (row * nq + h) * hd;
        const int64_t first = heads.window > 0 ? std::max<int64_t>(0, n_ctx - heads.window) : 0;
        std::vector<double> p(static_cast<size_t>(n_ctx), 0.0);
        double mx = -INFINITY;
        for (int64_t j = first; j < n_ctx; ++j) {
          double dot = 0.0;
          for (int64_t i = 0; i < hd; ++i) dot += qv[i] * at(cache.k, j, s, kvh, i);
          p[j] = dot * scale;
          mx = std::max(mx, p[j]);
        }
        double sum = 0.0;
        for (int64_t j = first; j < n_ctx; ++j) sum += (p[j] = std::exp(p[j] - mx));
        float* o = out + (row * nq + h) * hd;
        for (int64_t i = 0; i < hd; ++i) {
          double acc = 0.0;
          for (int64_t j = first; j < n_ctx; ++j) acc += p[j] * at(cache.v, j, s, kvh, i);
          o[i] = static_cast<float>(acc / sum);
        }
      }
    }
  }
}

}  // namespace shardlm::backend::ref
