// reduce16: sixteen horizontal sums of AVX-512 accumulators at once, by one
// fixed tree, shared by the exact rows GEMM (rows_gemm_impl.h, a TU built
// with -mavx512f) and the bf16 dot kernels (bf16_dot_gemm.cpp, which enable
// AVX-512 per function): both promise that an accumulator's sum does not
// depend on which others share the call, so both must sum the same way.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

namespace shardlm::backend::cpu_detail {

// The fixed tree over 16 lanes: s1[i] = a[i] + a[i+8], s2[i] = s1[i] + s1[i+4],
// s3[i] = s2[i] + s2[i+2], sum = s3[0] + s3[1]. v: [16] accumulators; lane o
// of the result holds the tree sum of v[o]. Every add pairs lanes of one
// accumulator, exactly as the tree says.
__attribute__((target("avx512f"))) inline __m512 reduce16(const __m512* v) {
  __m512 w[8], x[4], y[2];
  for (int p = 0; p < 8; ++p)
    w[p] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], 0x44),
                         _mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], 0xEE));
  for (int q = 0; q < 4; ++q)
    x[q] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * q], w[2 * q + 1], 0x88),
                         _mm512_shuffle_f32x4(w[2 * q], w[2 * q + 1], 0xDD));
  for (int h = 0; h < 2; ++h) {
    const __m512d a = _mm512_castps_pd(x[2 * h]), b = _mm512_castps_pd(x[2 * h + 1]);
    y[h] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  // Here result c·4 + g sits in lane 4g + c: back to accumulator order.
  const __m512 z = _mm512_add_ps(_mm512_shuffle_ps(y[0], y[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_ps(y[0], y[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
  return _mm512_permutexvar_ps(order, z);
}

}  // namespace shardlm::backend::cpu_detail
#endif
