// Element types of checkpoints and caches. Weights stay in their checkpoint
// dtype in memory; kernels convert to f32 in registers.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace shardlm {

// kF32/kF16/kBF16 are compute dtypes (activations, unquantized weights, KV
// cache). The others are storage dtypes of quantized checkpoints:
//   kF8E4M3  float8_e4m3fn (FP8 weights, FP8 KV cache): 1 sign, 4 exponent
//            (bias 7), 3 mantissa bits; no infinities; 0x7f/0xff are NaN; max 448
//   kI32     packed int4/int8 words (AWQ/GPTQ qweight, qzeros) and GPTQ g_idx
//   kI8, kU8 plain 8-bit integers
enum class DType { kF32, kF16, kBF16, kF8E4M3, kI32, kI8, kU8 };

size_t dtype_size(DType dtype);
// "F32", "F16", "BF16", "F8_E4M3", "I32", "I8", "U8": the safetensors spelling.
const char* dtype_safetensors_name(DType dtype);
// "float32", "float16", "bfloat16", "float8_e4m3fn", "int32", "int8", "uint8":
// the torch spelling.
const char* dtype_torch_name(DType dtype);
// Compute dtypes only: accepts safetensors, torch and short spellings (f32,
// bf16, fp16, float16, ...); returns false for anything else, including the
// storage dtypes (a weight or torch_dtype cannot be "int32").
bool parse_dtype(std::string_view text, DType* out);
// Exactly a safetensors dtype name shardlm reads ("BF16", "F8_E4M3", "I32", ...).
bool parse_safetensors_dtype(std::string_view name, DType* out);
// The safetensors names parse_safetensors_dtype accepts, "F32, F16, ...".
const char* supported_safetensors_dtypes();
// f32, f16, bf16 (values a kernel can read as floats without a scheme).
bool is_compute_dtype(DType dtype);

// float8_e4m3fn -> f32, exact.
float f8e4m3_to_f32(uint8_t bits);
// f32 -> float8_e4m3fn, round to nearest even, saturating to +-448 (as
// torch's .to(torch.float8_e4m3fn) after clamping, which is what FP8
// checkpoints are made with); NaN stays NaN.
uint8_t f32_to_f8e4m3(float value);

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

// Reads element i of a buffer of dtype as f32 (integers: their value).
inline float load_as_f32(const void* data, DType dtype, size_t i) {
  switch (dtype) {
    case DType::kF32: return static_cast<const float*>(data)[i];
    case DType::kBF16: return bf16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case DType::kF16: return f16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case DType::kF8E4M3: return f8e4m3_to_f32(static_cast<const uint8_t*>(data)[i]);
    case DType::kI32: return static_cast<float>(static_cast<const int32_t*>(data)[i]);
    case DType::kI8: return static_cast<float>(static_cast<const int8_t*>(data)[i]);
    case DType::kU8: return static_cast<float>(static_cast<const uint8_t*>(data)[i]);
  }
  return 0.0f;
}

inline void store_from_f32(void* data, DType dtype, size_t i, float value) {
  switch (dtype) {
    case DType::kF32: static_cast<float*>(data)[i] = value; break;
    case DType::kBF16: static_cast<uint16_t*>(data)[i] = f32_to_bf16(value); break;
    case DType::kF16: static_cast<uint16_t*>(data)[i] = f32_to_f16(value); break;
    case DType::kF8E4M3: static_cast<uint8_t*>(data)[i] = f32_to_f8e4m3(value); break;
    // Integer storage is written bit-exactly by its packer, never from floats.
    case DType::kI32: static_cast<int32_t*>(data)[i] = static_cast<int32_t>(value); break;
    case DType::kI8: static_cast<int8_t*>(data)[i] = static_cast<int8_t>(value); break;
    case DType::kU8: static_cast<uint8_t*>(data)[i] = static_cast<uint8_t>(value); break;
  }
}

}  // namespace shardlm
