#include "core/dtype.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

namespace shardlm {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kF8E4M3: return 1;
    case DType::kI32: return 4;
    case DType::kI8: return 1;
    case DType::kU8: return 1;
  }
  return 0;
}

const char* dtype_safetensors_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kF8E4M3: return "F8_E4M3";
    case DType::kI32: return "I32";
    case DType::kI8: return "I8";
    case DType::kU8: return "U8";
  }
  return "?";
}

const char* dtype_torch_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "float32";
    case DType::kF16: return "float16";
    case DType::kBF16: return "bfloat16";
    case DType::kF8E4M3: return "float8_e4m3fn";
    case DType::kI32: return "int32";
    case DType::kI8: return "int8";
    case DType::kU8: return "uint8";
  }
  return "?";
}

bool parse_dtype(std::string_view text, DType* out) {
  std::string s(text);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s == "f32" || s == "fp32" || s == "float32" || s == "float") {
    *out = DType::kF32;
  } else if (s == "f16" || s == "fp16" || s == "float16" || s == "half") {
    *out = DType::kF16;
  } else if (s == "bf16" || s == "bfloat16") {
    *out = DType::kBF16;
  } else {
    return false;
  }
  return true;
}

bool parse_safetensors_dtype(std::string_view name, DType* out) {
  constexpr DType kAll[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3, DType::kI32, DType::kI8, DType::kU8};
  for (DType d : kAll) {
    if (name == dtype_safetensors_name(d)) {
      *out = d;
      return true;
    }
  }
  return false;
}

const char* supported_safetensors_dtypes() { return "F32, F16, BF16, F8_E4M3, I32, I8, U8"; }

bool is_compute_dtype(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
}

float f8e4m3_to_f32(uint8_t bits) {
  const float sign = (bits & 0x80u) ? -1.0f : 1.0f;
  const int exp = (bits >> 3) & 0xf;
  const int mant = bits & 0x7;
  if (exp == 0xf && mant == 0x7) return std::numeric_limits<float>::quiet_NaN();
  if (exp == 0) return sign * std::ldexp(static_cast<float>(mant), -9);  // subnormal: mant/8 * 2^-6
  return sign * std::ldexp(1.0f + static_cast<float>(mant) / 8.0f, exp - 7);
}

uint8_t f32_to_f8e4m3(float value) {
  if (std::isnan(value)) return 0x7f;
  const uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
  float a = std::fabs(value);
  if (a >= 448.0f) return sign | 0x7e;  // saturate to the largest finite
  // Values step by 2^(e-3) within binade e (e >= -6); below 2^-6 the step is 2^-9.
  int e;
  std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1): binade exponent e - 1
  int binade = std::max(e - 1, -6);
  const float step = std::ldexp(1.0f, binade - 3);
  const float q = std::nearbyint(a / step);  // round half to even (default rounding mode)
  float r = q * step;
  if (r >= 448.0f) return sign | 0x7e;
  if (r == 0.0f) return sign;
  int re;
  std::frexp(r, &re);
  const int eb = re - 1;  // exponent of the rounded value (may have carried)
  if (eb < -6) return sign | static_cast<uint8_t>(std::lround(r / std::ldexp(1.0f, -9)));  // subnormal
  const int mant = static_cast<int>(std::lround((r / std::ldexp(1.0f, eb) - 1.0f) * 8.0f));
  return sign | static_cast<uint8_t>(((eb + 7) << 3) | mant);
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ff;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t f32_to_f16(float value) {
  uint32_t x;
  std::memcpy(&x, &value, sizeof x);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (abs < 0x38800000u) {  // subnormal or zero in f16
    float magnitude;
    std::memcpy(&magnitude, &abs, sizeof magnitude);
    // 2^-24 is the smallest f16 subnormal; round to nearest even via rint.
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(magnitude * 16777216.0f)));
  }
  uint32_t mant = abs & 0x7fffffu;
  uint32_t exp = (abs >> 23) - 127 + 15;
  uint32_t h = (exp << 10) | (mant >> 13);
  uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // may carry into exponent: correct
  return static_cast<uint16_t>(sign | h);
}

}  // namespace shardlm
