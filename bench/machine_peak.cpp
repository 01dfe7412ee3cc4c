// machine_peak [--threads T] [--json]: this CPU's memory bandwidth (bench/bandwidth.h: streaming
// read and triad) and its f32 FMA peak, for the rooflines of bench/llama_cpp_compare.sh, measured
// in the same run as the engines they bound.
//
// FMA peak: each thread runs kChains independent fused multiply-add chains on registers, enough
// to cover the FMA latency on both FMA ports of a core, so the loop is bound by FMA throughput
// alone (2 flops per lane per FMA); 8-wide (AVX2) and, where the CPU has it, 16-wide (AVX-512).
// The peak is the larger. Best of several passes of tens of ms, since on a shared machine the
// best pass is one nobody interrupted. A width the build lacks reports 0.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "bandwidth.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace {

constexpr int kChains = 12;  // independent FMA chains per thread: > latency (4) x 2 ports

// The chains are named variables, not an array: GCC turns an array of
// accumulators into a loop through the stack, which measures stores.
#define SHARDLM_FMA_CHAINS(T, FMA, SET1, ADD, STORE, LANES)                                      \
  T c0 = SET1(1.00f), c1 = SET1(1.01f), c2 = SET1(1.02f), c3 = SET1(1.03f), c4 = SET1(1.04f);  \
  T c5 = SET1(1.05f), c6 = SET1(1.06f), c7 = SET1(1.07f), c8 = SET1(1.08f), c9 = SET1(1.09f);  \
  T c10 = SET1(1.10f), c11 = SET1(1.11f);                                                      \
  [[maybe_unused]] const T m = SET1(0.999999f), a = SET1(1e-7f);  /* unused by VDPBF16PS */      \
  for (long i = 0; i < iters; ++i) {                                                           \
    c0 = FMA(c0, m, a); c1 = FMA(c1, m, a); c2 = FMA(c2, m, a); c3 = FMA(c3, m, a);            \
    c4 = FMA(c4, m, a); c5 = FMA(c5, m, a); c6 = FMA(c6, m, a); c7 = FMA(c7, m, a);            \
    c8 = FMA(c8, m, a); c9 = FMA(c9, m, a); c10 = FMA(c10, m, a); c11 = FMA(c11, m, a);        \
  }                                                                                            \
  T s = ADD(ADD(ADD(c0, c1), ADD(c2, c3)), ADD(ADD(c4, c5), ADD(c6, c7)));                     \
  s = ADD(s, ADD(ADD(c8, c9), ADD(c10, c11)));                                                 \
  alignas(64) float lanes[LANES];                                                              \
  STORE(lanes, s);                                                                             \
  *sink = lanes[0];                                                                            \
  return 2.0 * LANES * kChains * static_cast<double>(iters);

#if defined(__AVX2__) && defined(__FMA__)
// flops of `iters` rounds of kChains 8-wide FMAs; the result goes to `sink` so nothing is dead.
double fma_pass_avx2(long iters, float* sink) {
  SHARDLM_FMA_CHAINS(__m256, _mm256_fmadd_ps, _mm256_set1_ps, _mm256_add_ps, _mm256_store_ps, 8)
}
#endif
#if defined(__AVX512F__)
// The same with 16-wide AVX-512 FMAs (this CPU's peak where it has them).
double fma_pass_avx512(long iters, float* sink) {
  SHARDLM_FMA_CHAINS(__m512, _mm512_fmadd_ps, _mm512_set1_ps, _mm512_add_ps, _mm512_store_ps, 16)
}
#endif

// The same chains of AVX512_BF16 VDPBF16PS (32 bf16 products, 64 flops, per
// instruction), the instruction of --dense-activations bf16
// (backend/cpu/bf16_dot_gemm.h): beside the f32 FMA peak it says whether bf16
// dot products can beat f32 FMAs on this CPU at all. The kernels carry their
// own target attribute, as this function does, so it is measured in any build.
#if defined(__x86_64__) && (defined(__clang__) ? __clang_major__ >= 9 : __GNUC__ >= 10)
#define SHARDLM_PEAK_BF16 1
__attribute__((target("avx512f,avx512bf16"))) double bf16_dot_pass(long iters, float* sink) {
  // c += 1.0 · 2^-24 per pair (bf16 0x3F80, 0x3380); m and a are the f32 chains' and go unused.
  const __m512bh one = (__m512bh)_mm512_set1_epi16(0x3F80), tiny = (__m512bh)_mm512_set1_epi16(0x3380);
#define SHARDLM_BF16_DP(c, m, a) _mm512_dpbf16_ps((c), one, tiny)
  SHARDLM_FMA_CHAINS(__m512, SHARDLM_BF16_DP, _mm512_set1_ps, _mm512_add_ps, _mm512_store_ps, 32)
#undef SHARDLM_BF16_DP
}
#endif

// Best GFLOP/s of `passes` timed passes over `threads` threads (one chain
// set per thread); width 32: VDPBF16PS (0 where the CPU lacks AVX512_BF16).
double fma_peak_gflops(int threads, int passes, int width) {
  double (*pass)(long, float*) = nullptr;
#ifdef SHARDLM_PEAK_BF16
  __builtin_cpu_init();
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (width == 32 && __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax & (1u << 5))) pass = bf16_dot_pass;
#endif
#if defined(__AVX2__) && defined(__FMA__)
  if (width == 8) pass = fma_pass_avx2;
#endif
#if defined(__AVX512F__)
  if (width == 16) pass = fma_pass_avx512;
#endif
  if (!pass) return 0.0;
  const long iters = 2'000'000;  // ~48 Mflop per thread per pass: tens of ms
  double best = 0.0;
  float sinks[256] = {};
  for (int p = 0; p < passes + 1; ++p) {  // the first pass warms up (clocks, threads)
    double flops = 0.0;
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : flops)
    { flops += pass(iters, &sinks[omp_get_thread_num() % 256]); }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (p > 0) best = std::max(best, flops / s / 1e9);
  }
  volatile float keep = sinks[0];
  (void)keep;
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = omp_get_max_threads();
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
      threads = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else {
      std::fprintf(stderr, "usage: machine_peak [--threads T] [--json]\n");
      return 2;
    }
  }
  omp_set_num_threads(threads);
  const shardlm::bench::Bandwidth bw = shardlm::bench::measure_bandwidth();
  const double avx2 = fma_peak_gflops(threads, 8, 8);
  const double avx512 = fma_peak_gflops(threads, 8, 16);
  const double avx2_1t = fma_peak_gflops(1, 8, 8);
  const double bf16 = fma_peak_gflops(threads, 8, 32);
  const double peak = std::max(avx2, avx512);
  if (json) {
    std::printf("{\"threads\": %d, \"read_GBps\": %.3f, \"triad_GBps\": %.3f, \"fma_gflops\": %.2f, "
                "\"fma_gflops_avx2\": %.2f, \"fma_gflops_avx512\": %.2f, \"fma_gflops_avx2_1t\": %.2f, "
                "\"bf16_dot_gflops\": %.2f}\n",
                threads, bw.read / 1e9, bw.triad / 1e9, peak, avx2, avx512, avx2_1t, bf16);
  } else {
    std::printf("threads %d: read %.2f GB/s, triad %.2f GB/s; f32 FMA peak %.1f GFLOP/s (AVX2 %.1f, AVX-512 %.1f; "
                "AVX2 on 1 thread %.1f); AVX512_BF16 VDPBF16PS peak %.1f GFLOP/s (0: not on this CPU)\n",
                threads, bw.read / 1e9, bw.triad / 1e9, peak, avx2, avx512, avx2_1t, bf16);
  }
  return 0;
}
