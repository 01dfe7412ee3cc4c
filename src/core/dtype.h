// Element types of checkpoints and caches. Weights stay in their checkpoint
// dtype in memory; kernels convert to f32 in registers.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace shardlm {

enum class DType { kF32, kF16, kBF16 };

size_t dtype_size(DType dtype);
// "F32", "F16", "BF16": the safetensors spelling.
const char* dtype_safetensors_name(DType dtype);
// "float32", "float16", "bfloat16": the config.json torch_dtype spelling.
const char* dtype_torch_name(DType dtype);
// Accepts safetensors, torch and short spellings (f32, bf16, fp16, float16, ...);
// returns false for anything else.
bool parse_dtype(std::string_view text, DType* out);

inline float bf16_to_f32(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Round to nearest even, as torch does; NaN stays NaN.
inline uint16_t f32_to_bf16(float value) {
  uint32_t u;
  std::memcpy(&u, &value, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float f16_to_f32(uint16_t bits);
uint16_t f32_to_f16(float value);

// Reads element i of a buffer of dtype as f32.
inline float load_as_f32(const void* data, DType dtype, size_t i) {
  switch (dtype) {
    case DType::kF32: return static_cast<const float*>(data)[i];
    case DType::kBF16: return bf16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case DType::kF16: return f16_to_f32(static_cast<const uint16_t*>(data)[i]);
  }
  return 0.0f;
}

inline void store_from_f32(void* data, DType dtype, size_t i, float value) {
  switch (dtype) {
    case DType::kF32: static_cast<float*>(data)[i] = value; break;
    case DType::kBF16: static_cast<uint16_t*>(data)[i] = f32_to_bf16(value); break;
    case DType::kF16: static_cast<uint16_t*>(data)[i] = f32_to_f16(value); break;
  }
}

}  // namespace shardlm
