#include "loader/quant_pack.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/error.h"

namespace shardlm {

namespace {

// v as stored in dtype and read back.
float round_to(DType dtype, float v) {
  uint8_t buf[4];
  store_from_f32(buf, dtype, 0, v);
  return load_as_f32(buf, dtype, 0);
}

template <typename T>
std::vector<uint8_t> as_bytes(const std::vector<T>& v) {
  std::vector<uint8_t> out(v.size() * sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

std::vector<uint8_t> floats_as(DType dtype, const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * dtype_size(dtype));
  for (size_t i = 0; i < v.size(); ++i) store_from_f32(out.data(), dtype, i, v[i]);
  return out;
}

const TensorSpec& find_part(const std::vector<TensorSpec>& parts, QuantPart p) {
  for (const TensorSpec& t : parts)
    if (t.part == p) return t;
  fail(ErrorCode::kInvalidArgument, "quantize_linear: no ", quant_part_name(p), " among the module's tensors");
}

// Rows of each group in the order they are grouped: identity, or GPTQ
// act-order (decreasing column sum of squares, ties by index).
std::vector<int64_t> row_order(const QuantConfig& q, const float* w, int64_t n_out, int64_t n_in) {
  std::vector<int64_t> order(static_cast<size_t>(n_in));
  std::iota(order.begin(), order.end(), 0);
  if (q.method == QuantMethod::kGptq && q.desc_act) {
    std::vector<double> energy(static_cast<size_t>(n_in), 0.0);
    for (int64_t n = 0; n < n_out; ++n)
      for (int64_t k = 0; k < n_in; ++k) energy[k] += static_cast<double>(w[n * n_in + k]) * w[n * n_in + k];
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return energy[a] > energy[b]; });
  }
  return order;
}

// AWQ / GPTQ: integer codes q [n_in, n_out], zeros and scales [n_groups, n_out], g_idx [n_in].
struct IntCodes {
  std::vector<int32_t> q, zeros, g_idx;
  std::vector<float> scales;
};

IntCodes quantize_int(const QuantConfig& cfg, const float* w, int64_t n_out, int64_t n_in) {
  const int maxq = (1 << cfg.bits) - 1;
  const int64_t g = cfg.group_rows(n_in);
  const int64_t n_groups = cfg.n_groups(n_in);
  const bool gptq = cfg.method == QuantMethod::kGptq;
  const int min_zero = gptq ? cfg.zero_offset : 0;  // "gptq" stores zero - 1: keep it >= 0
  const std::vector<int64_t> order = row_order(cfg, w, n_out, n_in);
  IntCodes c;
  c.q.assign(static_cast<size_t>(n_in * n_out), 0);
  c.zeros.assign(static_cast<size_t>(n_groups * n_out), 0);
  c.scales.assign(static_cast<size_t>(n_groups * n_out), 0.0f);
  c.g_idx.assign(static_cast<size_t>(n_in), 0);
  for (int64_t gi = 0; gi < n_groups; ++gi) {
    const int64_t r0 = gi * g, r1 = std::min(n_in, r0 + g);
    for (int64_t i = r0; i < r1; ++i) c.g_idx[order[i]] = static_cast<int32_t>(gi);
    for (int64_t n = 0; n < n_out; ++n) {
      float lo = INFINITY, hi = -INFINITY;
      for (int64_t i = r0; i < r1; ++i) {
        const float v = w[n * n_in + order[i]];
        lo = std::min(lo, v);
        hi = std::max(hi, v);
      }
      float scale;
      int zero;
      if (gptq && cfg.sym) {
        const float m = std::max(std::fabs(lo), std::fabs(hi));
        scale = round_to(cfg.scales_dtype, m > 0 ? 2.0f * m / maxq : 1.0f);
        zero = (maxq + 1) / 2;
      } else {
        if (gptq) {
          lo = std::min(lo, 0.0f);
          hi = std::max(hi, 0.0f);
        }
        scale = round_to(cfg.scales_dtype, std::max(hi - lo, 1e-5f) / maxq);
        zero = std::clamp(static_cast<int>(std::nearbyint(-lo / scale)), min_zero, maxq);
      }
      c.scales[gi * n_out + n] = scale;
      c.zeros[gi * n_out + n] = zero;
      for (int64_t i = r0; i < r1; ++i) {
        const int64_t k = order[i];
        const int v = static_cast<int>(std::nearbyint(w[n * n_in + k] / scale)) + zero;
        c.q[k * n_out + n] = std::clamp(v, 0, maxq);
      }
    }
  }
  return c;
}

}  // namespace

std::map<QuantPart, std::vector<uint8_t>> quantize_linear(const QuantConfig& cfg, const float* w, int64_t n_out,
                                                          int64_t n_in, const std::vector<TensorSpec>& parts) {
  std::map<QuantPart, std::vector<uint8_t>> out;
  if (cfg.method == QuantMethod::kFp8) {
    const TensorSpec& scale_spec = find_part(parts, QuantPart::kScaleInv);
    const DType sdt = scale_spec.dtypes.front();
    int64_t bn = n_out, bk = n_in;  // per tensor
    if (!cfg.weight_block_size.empty()) {
      bn = cfg.weight_block_size[0];
      bk = cfg.weight_block_size[1];
    }
    const int64_t nb = (n_out + bn - 1) / bn, kb = (n_in + bk - 1) / bk;
    std::vector<float> scales(static_cast<size_t>(nb * kb));
    std::vector<uint8_t> q(static_cast<size_t>(n_out * n_in));
    for (int64_t bi = 0; bi < nb; ++bi) {
      for (int64_t bj = 0; bj < kb; ++bj) {
        float amax = 0.0f;
        for (int64_t n = bi * bn; n < std::min(n_out, (bi + 1) * bn); ++n)
          for (int64_t k = bj * bk; k < std::min(n_in, (bj + 1) * bk); ++k) amax = std::max(amax, std::fabs(w[n * n_in + k]));
        const float s = round_to(sdt, amax > 0 ? amax / 448.0f : 1.0f);
        scales[bi * kb + bj] = s;
        for (int64_t n = bi * bn; n < std::min(n_out, (bi + 1) * bn); ++n)
          for (int64_t k = bj * bk; k < std::min(n_in, (bj + 1) * bk); ++k)
            q[n * n_in + k] = f32_to_f8e4m3(w[n * n_in + k] / s);
      }
    }
    out[QuantPart::kFp8Weight] = std::move(q);
    out[QuantPart::kScaleInv] = floats_as(sdt, scales);
    return out;
  }
  SHARDLM_CHECK(cfg.method == QuantMethod::kAwq || cfg.method == QuantMethod::kGptq);
  const IntCodes c = quantize_int(cfg, w, n_out, n_in);
  const int bits = cfg.bits;
  const int pf = cfg.pack_factor();
  const uint32_t mask = (1u << bits) - 1u;
  const int64_t n_groups = cfg.n_groups(n_in);
  const int64_t words_out = n_out / pf;
  std::vector<uint32_t> qweight, qzeros(static_cast<size_t>(n_groups * words_out), 0u);
  if (cfg.method == QuantMethod::kAwq) {
    // [n_in, n_out / 8]: nibble i of word c holds channel 8c + kAwqPackOrder[i].
    qweight.assign(static_cast<size_t>(n_in * words_out), 0u);
    for (int64_t k = 0; k < n_in; ++k)
      for (int64_t wc = 0; wc < words_out; ++wc)
        for (int i = 0; i < pf; ++i)
          qweight[k * words_out + wc] |= (static_cast<uint32_t>(c.q[k * n_out + wc * pf + kAwqPackOrder[i]]) & mask)
                                         << (bits * i);
    for (int64_t gi = 0; gi < n_groups; ++gi)
      for (int64_t wc = 0; wc < words_out; ++wc)
        for (int i = 0; i < pf; ++i)
          qzeros[gi * words_out + wc] |= (static_cast<uint32_t>(c.zeros[gi * n_out + wc * pf + kAwqPackOrder[i]]) & mask)
                                         << (bits * i);
  } else {
    // [n_in / p, n_out]: bits [b*j, b*j+b) of word r hold row p*r + j.
    qweight.assign(static_cast<size_t>((n_in / pf) * n_out), 0u);
    for (int64_t r = 0; r < n_in / pf; ++r)
      for (int j = 0; j < pf; ++j)
        for (int64_t n = 0; n < n_out; ++n)
          qweight[r * n_out + n] |= (static_cast<uint32_t>(c.q[(r * pf + j) * n_out + n]) & mask) << (bits * j);
    // [n_groups, n_out / p], sequential along the output channels; zero - offset stored.
    for (int64_t gi = 0; gi < n_groups; ++gi)
      for (int64_t wc = 0; wc < words_out; ++wc)
        for (int j = 0; j < pf; ++j)
          qzeros[gi * words_out + wc] |=
              (static_cast<uint32_t>(c.zeros[gi * n_out + wc * pf + j] - cfg.zero_offset) & mask) << (bits * j);
    out[QuantPart::kGIdx] = as_bytes(c.g_idx);
  }
  out[QuantPart::kQWeight] = as_bytes(qweight);
  out[QuantPart::kQZeros] = as_bytes(qzeros);
  out[QuantPart::kScales] = floats_as(find_part(parts, QuantPart::kScales).dtypes.front(), c.scales);
  return out;
}

namespace {

const QuantPartView& need(const std::map<QuantPart, QuantPartView>& parts, QuantPart p,
                          const std::vector<int64_t>& shape) {
  auto it = parts.find(p);
  if (it == parts.end()) fail(ErrorCode::kInvalidArgument, "dequantize_linear: the ", quant_part_name(p), " tensor is missing");
  if (!shape.empty() && it->second.shape != shape)
    fail(ErrorCode::kInvalidArgument, "dequantize_linear: ", quant_part_name(p), " has shape ",
         shape_string(it->second.shape), ", expected ", shape_string(shape));
  return it->second;
}

uint32_t word(const QuantPartView& v, int64_t i) {
  uint32_t u;
  std::memcpy(&u, static_cast<const uint8_t*>(v.data) + 4 * i, 4);
  return u;
}

}  // namespace

std::vector<float> dequantize_linear(const QuantConfig& cfg, const std::map<QuantPart, QuantPartView>& parts,
                                     int64_t n_out, int64_t n_in) {
  std::vector<float> w(static_cast<size_t>(n_out * n_in));
  if (cfg.method == QuantMethod::kFp8) {
    const QuantPartView& q = need(parts, QuantPart::kFp8Weight, {n_out, n_in});
    const QuantPartView& s = need(parts, QuantPart::kScaleInv, {});
    int64_t bn = n_out, bk = n_in, kb = 1;
    bool per_channel = false;
    if (!cfg.weight_block_size.empty()) {
      bn = cfg.weight_block_size[0];
      bk = cfg.weight_block_size[1];
      kb = (n_in + bk - 1) / bk;
    } else if (!s.shape.empty() && s.shape[0] == n_out && n_out > 1) {
      per_channel = true;
    }
    for (int64_t n = 0; n < n_out; ++n)
      for (int64_t k = 0; k < n_in; ++k) {
        const int64_t si = per_channel ? n : (n / bn) * kb + k / bk;
        w[n * n_in + k] = f8e4m3_to_f32(static_cast<const uint8_t*>(q.data)[n * n_in + k]) *
                          load_as_f32(s.data, s.dtype, static_cast<size_t>(si));
      }
    return w;
  }
  const int bits = cfg.bits, pf = cfg.pack_factor();
  const uint32_t mask = (1u << bits) - 1u;
  const int64_t n_groups = cfg.n_groups(n_in), words_out = n_out / pf;
  const QuantPartView& s = need(parts, QuantPart::kScales, {n_groups, n_out});
  const QuantPartView& z = need(parts, QuantPart::kQZeros, {n_groups, words_out});
  if (cfg.method == QuantMethod::kAwq) {
    const QuantPartView& q = need(parts, QuantPart::kQWeight, {n_in, words_out});
    const int64_t g = cfg.group_rows(n_in);
    for (int64_t k = 0; k < n_in; ++k)
      for (int64_t wc = 0; wc < words_out; ++wc)
        for (int i = 0; i < pf; ++i) {
          const int64_t n = wc * pf + kAwqPackOrder[i];
          const int64_t gi = k / g;
          const int qv = static_cast<int>((word(q, k * words_out + wc) >> (bits * i)) & mask);
          const int zv = static_cast<int>((word(z, gi * words_out + wc) >> (bits * i)) & mask);
          w[n * n_in + k] = static_cast<float>(qv - zv) * load_as_f32(s.data, s.dtype, static_cast<size_t>(gi * n_out + n));
        }
    return w;
  }
  const QuantPartView& q = need(parts, QuantPart::kQWeight, {n_in / pf, n_out});
  const QuantPartView& gidx = need(parts, QuantPart::kGIdx, {n_in});
  for (int64_t k = 0; k < n_in; ++k) {
    const int32_t gi = static_cast<int32_t>(word(gidx, k));
    if (gi < 0 || gi >= n_groups)
      fail(ErrorCode::kInvalidArgument, "dequantize_linear: g_idx[", k, "] = ", gi, " is outside the ", n_groups, " groups");
    for (int64_t n = 0; n < n_out; ++n) {
      const int qv = static_cast<int>((word(q, (k / pf) * n_out + n) >> (bits * (k % pf))) & mask);
      const int zv = static_cast<int>((word(z, gi * words_out + n / pf) >> (bits * (n % pf))) & mask) + cfg.zero_offset;
      w[n * n_in + k] = static_cast<float>(qv - zv) * load_as_f32(s.data, s.dtype, static_cast<size_t>(gi * n_out + n));
    }
  }
  return w;
}

}  // namespace shardlm
