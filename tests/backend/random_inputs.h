// Seeded inputs of the backend kernel tests: N(0, 1) activations, and
// weights of any dtype rounded from N(0, 1) (core/dtype.h store_from_f32).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

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

}  // namespace shardlm::backend::test_inputs
