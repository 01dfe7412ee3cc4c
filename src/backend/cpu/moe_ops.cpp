#include "backend/cpu/moe_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace shardlm::backend {

namespace {

// One token's routing: softmax over n_experts logits, the top_k by logit.
void route_row(const float* logits, int64_t n_experts, int64_t top_k, bool renormalize, int32_t* ids, float* weights) {
  float max = logits[0];
  for (int64_t e = 1; e < n_experts; ++e) max = std::max(max, logits[e]);
  double sum = 0.0;
  for (int64_t e = 0; e < n_experts; ++e) sum += std::exp(static_cast<double>(logits[e] - max));
  // Selection by repeated maximum (top_k is 2 or 8): the lowest id wins ties.
  for (int64_t j = 0; j < top_k; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < n_experts; ++e) {
      bool taken = false;
      for (int64_t i = 0; i < j; ++i) taken = taken || ids[i] == e;
      if (!taken && (best < 0 || logits[e] > logits[best])) best = e;
    }
    ids[j] = static_cast<int32_t>(best);
    weights[j] = static_cast<float>(std::exp(static_cast<double>(logits[best] - max)) / sum);
  }
  if (renormalize) {
    double s = 0.0;
    for (int64_t j = 0; j < top_k; ++j) s += weights[j];
    for (int64_t j = 0; j < top_k; ++j) weights[j] = static_cast<float>(weights[j] / s);
  }
}

void check_route_args(int64_t n_experts, int64_t top_k) {
  SHARDLM_CHECK(n_experts >= 1 && top_k >= 1 && top_k <= n_experts, "moe_route: top ", top_k, " of ", n_experts,
                " experts");
}

}  // namespace

void moe_route(const float* logits, int64_t n, int64_t n_experts, int64_t top_k, bool renormalize, int32_t* ids,
               float* weights) {
  check_route_args(n_experts, top_k);
  for (int64_t t = 0; t < n; ++t)
    route_row(logits + t * n_experts, n_experts, top_k, renormalize, ids + t * top_k, weights + t * top_k);
}

void moe_experts(const float* x, int64_t n, int64_t hidden, const int32_t* ids, const float* weights, int64_t top_k,
                 const ExpertMatrices* experts, int64_t expert_begin, int64_t n_local, float* out, MoeScratch& s) {
  std::memset(out, 0, static_cast<size_t>(n * hidden) * sizeof(float));
  if (n_local == 0 || n == 0) return;
  // Counting sort of the (token, slot) pairs by local expert.
  s.counts.assign(static_cast<size_t>(n_local + 1), 0);
  for (int64_t i = 0; i < n * top_k; ++i) {
    const int64_t e = ids[i] - expert_begin;
    if (e >= 0 && e < n_local) ++s.counts[static_cast<size_t>(e)];
  }
  s.offsets.assign(static_cast<size_t>(n_local + 1), 0);
  for (int64_t e = 0; e < n_local; ++e) s.offsets[e + 1] = s.offsets[e] + s.counts[e];
  const int64_t rows = s.offsets[n_local];
  if (rows == 0) return;
  s.token.resize(static_cast<size_t>(rows));
  s.route_weight.resize(static_cast<size_t>(rows));
  std::fill(s.counts.begin(), s.counts.end(), 0);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < top_k; ++j) {
      const int64_t e = ids[t * top_k + j] - expert_begin;
      if (e < 0 || e >= n_local) continue;
      const int64_t r = s.offsets[e] + s.counts[e]++;
      s.token[r] = static_cast<int32_t>(t);
      s.route_weight[r] = weights[t * top_k + j];
    }
  // Per active expert: gather its rows (at most n: a token picks an expert
  // once), run gate/up/down as GEMMs over them, scatter-add with the routing
  // weights. Buffers hold one expert's rows, so they stay [n, ·] whatever top_k.
  int64_t max_inter = 0, max_rows = 0;
  for (int64_t e = 0; e < n_local; ++e) {
    max_inter = std::max(max_inter, experts[e].gate.rows);
    max_rows = std::max<int64_t>(max_rows, s.offsets[e + 1] - s.offsets[e]);
  }
  if (s.xs.size() < static_cast<size_t>(max_rows * hidden)) {
    s.xs.resize(static_cast<size_t>(max_rows * hidden));
    s.ys.resize(static_cast<size_t>(max_rows * hidden));
  }
  if (s.gate.size() < static_cast<size_t>(max_rows * max_inter)) {
    s.gate.resize(static_cast<size_t>(max_rows * max_inter));
    s.up.resize(static_cast<size_t>(max_rows * max_inter));
  }
  for (int64_t e = 0; e < n_local; ++e) {
    const int64_t r0 = s.offsets[e], cnt = s.offsets[e + 1] - r0;
    if (cnt == 0) continue;
    const ExpertMatrices& m = experts[e];
    SHARDLM_CHECK(m.gate.cols == hidden && m.up.rows == m.gate.rows && m.up.cols == hidden && m.down.rows == hidden &&
                      m.down.cols == m.gate.rows,
                  "moe_experts: expert ", expert_begin + e, " shapes do not agree");
    const int64_t inter = m.gate.rows;
    for (int64_t r = 0; r < cnt; ++r)
      std::memcpy(s.xs.data() + r * hidden, x + static_cast<int64_t>(s.token[r0 + r]) * hidden,
                  static_cast<size_t>(hidden) * sizeof(float));
    // gate and up read the same rows: one parallel region for both (matmul_many).
    const MatmulPart gate_up[] = {{m.gate, nullptr, s.gate.data()}, {m.up, nullptr, s.up.data()}};
    matmul_many(s.xs.data(), cnt, gate_up, 2);
    silu_mul(s.gate.data(), s.up.data(), cnt * inter, s.gate.data());
    matmul(s.gate.data(), cnt, m.down, nullptr, s.ys.data());
    for (int64_t r = 0; r < cnt; ++r) {
      float* o = out + static_cast<int64_t>(s.token[r0 + r]) * hidden;
      const float* y = s.ys.data() + r * hidden;
      const float w = s.route_weight[r0 + r];
      for (int64_t i = 0; i < hidden; ++i) o[i] += w * y[i];
    }
  }
}

namespace ref {

// Routing has one implementation: it is scalar already, and the tests check it
// against hand-computed choices and against the Python reference's routing.
void moe_route(const float* logits, int64_t n, int64_t n_experts, int64_t top_k, bool renormalize, int32_t* ids,
               float* weights) {
  backend::moe_route(logits, n, n_experts, top_k, renormalize, ids, weights);
}

void moe_experts(const float* x, int64_t n, int64_t hidden, const int32_t* ids, const float* weights, int64_t top_k,
                 const ExpertMatrices* experts, int64_t expert_begin, int64_t n_local, float* out) {
  std::vector<float> g, u, y(static_cast<size_t>(hidden));
  for (int64_t t = 0; t < n; ++t) {
    float* o = out + t * hidden;
    for (int64_t i = 0; i < hidden; ++i) o[i] = 0.0f;
    for (int64_t j = 0; j < top_k; ++j) {
      const int64_t e = ids[t * top_k + j] - expert_begin;
      if (e < 0 || e >= n_local) continue;
      const ExpertMatrices& m = experts[e];
      g.resize(static_cast<size_t>(m.gate.rows));
      u.resize(static_cast<size_t>(m.gate.rows));
      ref::matmul(x + t * hidden, 1, m.gate, nullptr, g.data());
      ref::matmul(x + t * hidden, 1, m.up, nullptr, u.data());
      ref::silu_mul(g.data(), u.data(), m.gate.rows, g.data());
      ref::matmul(g.data(), 1, m.down, nullptr, y.data());
      for (int64_t i = 0; i < hidden; ++i) o[i] += weights[t * top_k + j] * y[i];
    }
  }
}

}  // namespace ref

}  // namespace shardlm::backend
