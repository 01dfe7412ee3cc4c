// AVX-512 helpers shared by the quantized kernels (quant_ops.cpp's f32
// activations, quant_ops_int8.cpp's int8 ones). Internal to the backend layer.
#pragma once

#include <cstdint>

#include "core/dtype.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>

namespace shardlm::backend::quant_simd {

// The lowest `valid` of 16 lanes (all 16 from 16 on).
inline __mmask16 lanes_mask(int64_t valid) {
  return valid >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << valid) - 1u);
}

// 16 scales from a row of F16, BF16 or F32 (masked lanes read nothing).
inline __m512 load_scales(const void* base, DType dtype, int64_t index, __mmask16 m) {
  switch (dtype) {
    case DType::kF16:
      return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(base) + index));
    case DType::kBF16:
      return _mm512_castsi512_ps(_mm512_slli_epi32(
          _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(base) + index)), 16));
    default: return _mm512_maskz_loadu_ps(m, static_cast<const float*>(base) + index);
  }
}

}  // namespace shardlm::backend::quant_simd
#endif
