// Memory-bandwidth probes for the benchmarks' rooflines (bench/ only).
//
// Both stream contiguous per-thread chunks with explicit 256-bit loads (no
// gathers, whatever the compiler's vectoriser would make of an OpenMP simd
// reduction). Arrays are far larger than any last-level cache (this VM
// reports a 300 MiB L3), and each timed pass covers one 16 MiB segment, the
// segments taken in turn, so every pass reads from DRAM what the previous
// passes have evicted. A pass is a few milliseconds: on a shared machine the
// best pass is one that no other process interrupted. One sweep over all
// segments warms up (pages faulted in), then the best of eight more is kept.
//   read:  sum of a buffer                 bytes = n * 4
//   triad: a[i] = b[i] + s * c[i]          bytes = 3 * n * 4 (STREAM's count;
//          the write-allocate read of a is not counted, as STREAM does not)
#pragma once

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <memory>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace shardlm::bench {

struct Bandwidth {
  double read = 0.0;   // bytes/s
  double triad = 0.0;  // bytes/s
};

namespace detail {

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<float, FreeDeleter>;

inline Buffer alloc_floats(size_t n) {
  const size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
  return Buffer(static_cast<float*>(std::aligned_alloc(64, bytes)));
}

// [begin, end) of thread `t` of `nt` over n floats, in whole 32-float blocks.
inline void chunk(size_t n, int t, int nt, size_t* begin, size_t* end) {
  const size_t blocks = n / 32, per = blocks / nt, extra = blocks % nt;
  const size_t b0 = t * per + std::min<size_t>(t, extra);
  *begin = b0 * 32;
  *end = (b0 + per + (static_cast<size_t>(t) < extra ? 1 : 0)) * 32;
}

inline float read_chunk(const float* p, size_t begin, size_t end) {
#if defined(__AVX2__)
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = begin; i < end; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
  }
  __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, s);
  float total = 0.0f;
  for (float v : lanes) total += v;
  return total;
#else
  float a[4] = {0, 0, 0, 0};
  for (size_t i = begin; i < end; i += 4)
    for (int l = 0; l < 4; ++l) a[l] += p[i + l];
  return a[0] + a[1] + a[2] + a[3];
#endif
}

inline void triad_chunk(float* a, const float* b, const float* c, float s, size_t begin, size_t end) {
#if defined(__AVX2__)
  const __m256 sv = _mm256_set1_ps(s);
  for (size_t i = begin; i < end; i += 8)
    _mm256_store_ps(a + i, _mm256_fmadd_ps(sv, _mm256_load_ps(c + i), _mm256_load_ps(b + i)));
#else
  for (size_t i = begin; i < end; ++i) a[i] = b[i] + s * c[i];
#endif
}

// Best seconds of one pass over a segment: `passes` calls of pass(segment)
// over n_seg segments in turn, after one untimed sweep over all of them.
template <class F>
double best_seconds(size_t n_seg, size_t passes, F&& pass) {
  for (size_t g = 0; g < n_seg; ++g) pass(g);
  double best = 1e30;
  for (size_t r = 0; r < passes; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    pass(r % n_seg);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace detail

// Read bandwidth over a buffer of `bytes`, triad over three arrays of
// bytes / 3 (all OpenMP threads), in 16 MiB segments.
inline Bandwidth measure_bandwidth(size_t bytes = size_t{1} << 30) {
  constexpr size_t kSegment = (size_t{16} << 20) / sizeof(float);  // floats per segment
  const size_t n_read = std::max<size_t>(1, bytes / sizeof(float) / kSegment) * kSegment;
  const size_t n_triad = std::max<size_t>(1, n_read / 3 / kSegment) * kSegment;
  Bandwidth out;
  volatile float sink = 0.0f;
  {
    detail::Buffer b = detail::alloc_floats(n_read);
    if (!b) return out;
    float* pb = b.get();
#pragma omp parallel
    {
      size_t i0, i1;
      detail::chunk(n_read, omp_get_thread_num(), omp_get_num_threads(), &i0, &i1);
      for (size_t i = i0; i < i1; ++i) pb[i] = static_cast<float>(i & 1023);
    }
    const size_t n_seg = n_read / kSegment;
    const double s = detail::best_seconds(n_seg, 8 * n_seg, [&](size_t g) {
      float total = 0.0f;
      const float* seg = pb + g * kSegment;
#pragma omp parallel reduction(+ : total)
      {
        size_t i0, i1;
        detail::chunk(kSegment, omp_get_thread_num(), omp_get_num_threads(), &i0, &i1);
        total += detail::read_chunk(seg, i0, i1);
      }
      sink = sink + total;
    });
    out.read = static_cast<double>(kSegment * sizeof(float)) / s;
  }
  detail::Buffer a = detail::alloc_floats(n_triad), b = detail::alloc_floats(n_triad),
                 c = detail::alloc_floats(n_triad);
  if (!a || !b || !c) return out;
  float *pa = a.get(), *pb = b.get(), *pc = c.get();
#pragma omp parallel
  {
    size_t i0, i1;
    detail::chunk(n_triad, omp_get_thread_num(), omp_get_num_threads(), &i0, &i1);
    for (size_t i = i0; i < i1; ++i) {
      pa[i] = 0.0f;
      pb[i] = static_cast<float>(i & 1023);
      pc[i] = 1.0f;
    }
  }
  const size_t n_seg = n_triad / kSegment;
  const double s = detail::best_seconds(n_seg, 8 * n_seg, [&](size_t g) {
    const size_t off = g * kSegment;
#pragma omp parallel
    {
      size_t i0, i1;
      detail::chunk(kSegment, omp_get_thread_num(), omp_get_num_threads(), &i0, &i1);
      detail::triad_chunk(pa + off, pb + off, pc + off, 0.5f, i0, i1);
    }
    sink = sink + pa[off];
  });
  out.triad = static_cast<double>(3 * kSegment * sizeof(float)) / s;
  return out;
}

}  // namespace shardlm::bench
