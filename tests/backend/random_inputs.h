// Seeded inputs of the backend kernel tests: N(0, 1) activations, and
// weights of any dtype rounded from N(0, 1) (core/dtype.h store_from_f32);
// and the kernel ISAs they run on.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "core/cpu_isa.h"
#include "core/dtype.h"

namespace shardlm::backend::test_inputs {

inline std::vector<float> random_f32(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

// n elements of dtype, as raw bytes.
inline std::vector<uint8_t> random_weights(DType dtype, int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<uint8_t> buf(static_cast<size_t>(n) * dtype_size(dtype));
  for (int64_t i = 0; i < n; ++i) store_from_f32(buf.data(), dtype, static_cast<size_t>(i), dist(rng));
  return buf;
}

// The kernel ISAs up to `top`, lowest first: the paths a test compares on
// this machine (top: detected_cpu_isa(), or active_cpu_isa() to follow SHARDLM_ISA).
inline std::vector<CpuIsa> isas_up_to(CpuIsa top) {
  std::vector<CpuIsa> out;
  for (CpuIsa i : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16})
    if (static_cast<int>(i) <= static_cast<int>(top)) out.push_back(i);
  return out;
}

}  // namespace shardlm::backend::test_inputs
