// The sampler's passes over one row of logits [vocab] (Qwen2.5: 151,936
// floats), vectorised: max, argmax, the exp weights with their mass, the
// log-partition sum, threshold scans and compaction, and the block sums of
// the inverse-CDF draw. One build per instruction set (sampling/isa/*.cpp,
// flags in src/sampling/CMakeLists.txt), chosen at run time from CPUID, so
// one binary takes AVX-512 on a Xeon or an EPYC Zen 4/5, AVX2 elsewhere, and
// a scalar path on anything else.
//
// Every path computes the SAME bits for the same row: the exp is one f32
// sequence of multiplies, FMAs and roundings (fast_exp below) that each
// path performs in the same order, and every floating-point sum is taken in
// one fixed order (16 lanes, combined by a fixed tree; see the functions).
// So a seeded request draws the same tokens on every machine and under
// every SHARDLM_ISA cap; tests/sampling/vocab_kernels_test.cpp checks it.
//
// The variable SHARDLM_ISA, which caps the backend's kernels
// (backend/cpu/cpu_isa.h), caps these too: avx512bf16 and avx512 choose
// the AVX-512 path, avx2 and scalar theirs. The sampling layer cannot
// include the backend, so the few lines of CPUID are repeated here.
#pragma once

#include <cstddef>
#include <cstdint>

namespace shardlm {

enum class VocabIsa { kScalar, kAvx2, kAvx512 };

const char* vocab_isa_name(VocabIsa isa);  // "scalar", "avx2", "avx512"

// Whether this CPU runs the path (core/cpu_isa.h's detected_cpu_isa()).
bool vocab_isa_supported(VocabIsa isa);

// core/cpu_isa.h's active_cpu_isa() (CPUID capped by SHARDLM_ISA, whose bad
// values it refuses), avx512bf16 taken as avx512: it adds nothing here.
VocabIsa active_vocab_isa();

// Lanes of every vectorised sum: element i of a 16-aligned body adds into
// lane i % 16; the lanes combine as lane j += lane j + 8, then j + 4, j + 2,
// j + 1 (so lane 0 holds the sum); the elements after the body then add one
// by one, in order. Each path reproduces exactly this order.
inline constexpr size_t kVocabLanes = 16;

// Buckets of the top_p selection (VocabKernels::bucket_mass): enough that
// the one filter_tokens sorts holds a few hundred tokens of a flat
// 151,936-token row.
inline constexpr size_t kMassBuckets = 4096;

struct ExpWeights {
  double mass = 0.0;      // sum of the weights, in the lane order above
  size_t n_positive = 0;  // weights > 0
};

// The kernels of one path. Pointers, not virtual calls: the table of the
// active path is found once and called per row.
struct VocabKernels {
  // y[i] = fast_exp(x[i]) (in place allowed).
  void (*exp)(const float* x, float* y, size_t n);
  // The largest non-NaN value, -inf if there is none (all NaN, or n = 0).
  float (*max)(const float* z, size_t n);
  // The first index i with z[i] == v (v not NaN), or n if none.
  size_t (*find_equal)(const float* z, size_t n, float v);
  // The first index i with z[i] > v (false for NaN), or n if none.
  size_t (*find_greater)(const float* z, size_t n, float v);
  // The sampler's weights: w[i] = fast_exp((z[i] - max_l) * inv_t), each
  // step rounded to f32; 0 for NaN z and for weights below min_w (min_w: the
  // least f32 weight kept, 0 keeps every non-NaN one). Their mass and count;
  // when block_sums is not null, also block_sums(w) (below) into it
  // [n / 16], from the registers, so a draw over w needs no pass of its own.
  ExpWeights (*weights)(const float* z, size_t n, float max_l, float inv_t, float min_w, float* w,
                        double* block_sums);
  // Sum of fast_exp(z[i] - max_l) over the non-NaN z, in double, in the lane
  // order above (NaN when max_l is infinite, as exp(inf - inf) is).
  double (*sum_exp)(const float* z, size_t n, float max_l);
  // Compaction of the kept tokens: i with w[i] > 0 that rank at or above
  // the boundary token b by logit (z[i] > z_b, or z[i] == z_b and i <= b;
  // z_b = -inf and b = -1 keep every positive weight). Writes their ids to
  // ids and their weights to w_out (which may be w: it writes index k <= i
  // after reading i); returns how many.
  size_t (*compact)(const float* w, const float* z, size_t n, float z_b, int32_t b, int32_t* ids, float* w_out);
  // top_p's mass by logit bucket. The bucket of logit l is
  // min((max_l - l) * scale, kMassBuckets - 1) truncated (f32 steps, so a
  // lower bucket holds only larger logits and ties share one). For each i
  // with w[i] >= min_w, in id order, mass[bucket(z[i])] += w[i] (mass:
  // [kMassBuckets], not cleared here). Returns the largest bucket seen, 0
  // if none.
  size_t (*bucket_mass)(const float* z, const float* w, size_t n, float min_w, float max_l, float scale, double* mass);
  // Writes the ids i with w[i] >= min_w in bucket k into ids, in increasing
  // order; returns how many.
  size_t (*collect_bucket)(const float* z, const float* w, size_t n, float min_w, float max_l, float scale, size_t k,
                           int32_t* ids);
  // sums[k] = the sum of w[16k .. 16k + 16) in double (the fixed tree of the
  // lanes above, over one block), for the n / 16 whole blocks.
  void (*block_sums)(const float* w, size_t n, double* sums);
};

const VocabKernels& vocab_kernels(VocabIsa isa);  // the path's table (whether or not the CPU runs it)
const VocabKernels& vocab_kernels();              // the active path's (active_vocab_isa())

// exp(x) in f32 the way every path computes it: Cody-Waite reduction
// x = n ln2 + r (n = rint(x log2e), r by two FMAs against ln2 split in f32),
// a degree-7 polynomial for exp(r) on [-ln2/2, ln2/2] by Horner with FMAs,
// and the scale 2^n applied as two exact powers of two (so results in the
// subnormal range round once, as a correctly rounded exp would, and large
// ones overflow to +inf). Error against exp in double: 0.894 ulp at most
// over the normal results and 0.843 ulp of 2^-149 over the subnormal ones,
// measured over all 2^32 inputs (the test checks <= 2 and <= 1 on every
// 127th input and prints its maximum). exp(0) = 1 exactly, exp(-inf) = 0,
// exp(+inf) = +inf, exp(NaN) = NaN, results below half the least subnormal
// (x < ~-103.97) are 0. Monotone only to within that error.
float fast_exp(float x);

}  // namespace shardlm
