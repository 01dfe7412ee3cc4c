// CPU ops of the forward pass (their argument types shared with every
// device are in backend/op_args.h). Activations are f32; weights and biases stay
// in their checkpoint dtype (bf16/f16/f32) and are widened in registers, never
// in memory. Each op has a scalar reference (namespace ref, ops_ref.cpp) that
// the optimised version (ops.cpp: AVX2/FMA + OpenMP) is tested against.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/op_args.h"
#include "core/dtype.h"

namespace shardlm::backend {

// A row-major matrix in its stored dtype: [rows, cols]. Rows may be a view
// into a memory-mapped checkpoint (a row slice is still contiguous).
struct MatrixView {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
};

// A vector in its stored dtype: [n] (a norm weight or a bias).
struct VectorView {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t n = 0;
};

// y[n, m] = x[n, k] × W[m, k]ᵀ (+ bias[m]). W.cols must equal k. Threads over
// output rows, so a decode step (n = 1) streams W once with every core.
// Which kernel runs is matmul_path(n, W.dtype).
void matmul(const float* x, int64_t n, const MatrixView& w, const VectorView* bias, float* y);

// One matrix of matmul_many: y[n, w.rows] = x[n, k] × wᵀ (+ bias[w.rows]).
struct MatmulPart {
  MatrixView w;
  const VectorView* bias = nullptr;
  float* y = nullptr;
};
// matmul of the same x[n, k] against each part (q, k, v; gate, up), each
// part's y bit-identical to matmul(x, n, part.w, part.bias, part.y). Where
// every part takes MatmulPath::kRows with one weight dtype (and there are
// at most kRowsGemmMaxParts of them), their row blocks share one parallel
// region (backend/cpu/rows_gemm.h: rows_gemm_many); otherwise one matmul
// per part. The ys must not overlap x or each other.
void matmul_many(const float* x, int64_t n, const MatmulPart* parts, int64_t n_parts);

// The kernels a dense matmul can take:
//   kRows:   backend/cpu/rows_gemm.h, built per ISA and chosen by CPUID
//            (active_cpu_isa()): batch 1 and small batches; its reduction
//            order of an element is the same for every n;
//   kPacked: backend/cpu/packed_gemm.h's AVX-512/AVX2 GEMM (prefill, large batches);
//   kAmx:    the same GEMM on AMX tiles (bf16 on CPUs that have them).
//   kBf16Dot: backend/cpu/bf16_dot_gemm.h, bf16 weights under
//            DenseActivations::kBf16 only (every n): activations rounded to
//            bf16, AVX512_BF16 dot products; in batch-invariant mode on its
//            kernel whose order is the same for every n.
// The two GEMMs sum in another order than kRows, so with them a row's
// output depends (in the last bits) on how many rows share the call.
enum class MatmulPath { kRows, kPacked, kAmx, kBf16Dot };
MatmulPath matmul_path(int64_t n, DType weight_dtype);
const char* matmul_path_name(MatmulPath path);  // "rows", "packed", "amx", "bf16dot"

// How dense matmuls on bf16 weights take the activations (process-wide, as
// backend/quant_ops.h's QuantActivations for AWQ/GPTQ):
//   kF32  (the default) exact: x stays f32, weights are widened to f32;
//   kBf16 x rounded to bf16 once per matmul, then AVX512_BF16 dot products
//         with f32 sums (kBf16Dot): faster prefill, |Δy| <= 2^-8 Σ|x·w| plus
//         f32 summation error. f32 and f16 weights stay on the exact paths.
// kBf16 needs a CPU with AVX512_BF16 (bf16_dot_gemm_runs()): asked for
// elsewhere it is refused, never silently replaced by the exact path.
enum class DenseActivations { kF32, kBf16 };
const char* dense_activations_name(DenseActivations a);  // "f32", "bf16"
// Parses "f32" or "bf16"; false for anything else.
bool parse_dense_activations(const char* s, DenseActivations* out);
// The process's choice, read once from SHARDLM_DENSE_ACTIVATIONS (f32 when
// unset). Throws Error(kInvalidArgument) naming the variable for another
// value, Error(kUnsupported) for bf16 where the kernel cannot run.
DenseActivations default_dense_activations();
// Replaces the process's choice (the --dense-activations flag, tests).
// Throws Error(kUnsupported) for kBf16 where the kernel cannot run.
void set_default_dense_activations(DenseActivations activations);

// Batch invariance (process-wide; off by default): when on, every dense
// matmul takes kRows whatever n is, so a row's output is bit-identical
// computed alone or among any other rows (speculative verification, a
// request's tokens under any load). Quantized matmuls: backend/cpu/quant_ops.h.
void set_batch_invariant(bool on);
bool batch_invariant();

// out[r, :] = x[r, :] / sqrt(mean(x[r, :]²) + eps) × (weight_offset + weight);
// x, out: [n_rows, dim] (out may equal x). Used per token (hidden) and per head
// (q/k norms). weight_offset is 1 for Gemma, whose norms store w for (1 + w).
void rms_norm(const float* x, int64_t n_rows, const VectorView& weight, float eps, float* out,
              float weight_offset = 0.0f);

// Inverse frequencies for rotary embeddings: [head_dim / 2], HF semantics
// (rope_theta; "linear" divides by factor; "llama3" scales low frequencies by
// 1/factor and interpolates the band between the low and high freq factors;
// "longrope" divides frequency i by ext_factors[i], Phi-3's short factors).
// head_dim is the rotated width: the whole head, or its first
// partial_rotary_factor of it.
struct RopeConfig {
  int64_t head_dim = 0;
  double theta = 10000.0;
  enum class Scaling { kNone, kLinear, kLlama3, kLongRope } scaling = Scaling::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position = 8192;
  std::vector<double> ext_factors;  // longrope: [head_dim / 2]
};
void rope_inv_freq(const RopeConfig& config, float* inv_freq);

// Rotate-half (GPT-NeoX / HF Llama, Qwen) rotary embedding in place over the
// first rotary_dim of each head (0: all of it; the rest passes through), with
// cos and sin multiplied by mscale (LongRoPE's attention factor; 1 otherwise).
// x: [n_tokens, n_heads, head_dim]; positions: [n_tokens]; inv_freq: [rotary_dim / 2].
// LongRoPE: token t rotates with inv_freq_long instead where use_long[t] is
// non-zero (both [rotary_dim / 2] and [n_tokens]; nullptr: none does).
void rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const int32_t* positions,
          const float* inv_freq, int64_t rotary_dim = 0, float mscale = 1.0f, const float* inv_freq_long = nullptr,
          const uint8_t* use_long = nullptr);

// out[i] = silu(gate[i]) × up[i] for i < count (out may equal gate or up).
void silu_mul(const float* gate, const float* up, int64_t count, float* out);
// out[i] = gelu_tanh(gate[i]) × up[i] (GeGLU with PyTorch's tanh
// approximation: 0.5·g·(1 + tanh(√(2/π)·(g + 0.044715·g³)))); out may alias.
void gelu_tanh_mul(const float* gate, const float* up, int64_t count, float* out);

// x[i] *= s for i < count.
void scale_inplace(float* x, int64_t count, float s);

// In place over each row of x: [n_rows, dim].
void softmax(float* x, int64_t n_rows, int64_t dim);

// y[i] += x[i]
void add_inplace(float* y, const float* x, int64_t count);

// KvLayerView, AttentionSeq, AttentionHeads: backend/op_args.h.

// Stores the chunks' new keys and values into the cache.
// k, v: [n_tokens, cache.n_kv_heads, head_dim] f32.
void kv_cache_write(const KvLayerView& cache, const AttentionSeq* seqs, int64_t n_seqs, const float* k,
                    const float* v);

// Causal attention of each chunk's tokens over its n_past cached tokens and
// itself (the chunk must already be written with kv_cache_write), scaled by
// heads.scale_for(head_dim) and limited to heads.window keys when set, in f32. q: [n_tokens, n_q_heads, head_dim];
// out: [n_tokens, n_q_heads, head_dim].
void paged_attention(const float* q, const KvLayerView& cache, const AttentionSeq* seqs, int64_t n_seqs,
                     const AttentionHeads& heads, float* out);

// Scalar references with the same contracts (single-threaded, plain loops).
namespace ref {
void matmul(const float* x, int64_t n, const MatrixView& w, const VectorView* bias, float* y);
void rms_norm(const float* x, int64_t n_rows, const VectorView& weight, float eps, float* out,
              float weight_offset = 0.0f);
void rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const int32_t* positions,
          const float* inv_freq, int64_t rotary_dim = 0, float mscale = 1.0f);
void silu_mul(const float* gate, const float* up, int64_t count, float* out);
void gelu_tanh_mul(const float* gate, const float* up, int64_t count, float* out);
void softmax(float* x, int64_t n_rows, int64_t dim);
void paged_attention(const float* q, const KvLayerView& cache, const AttentionSeq* seqs, int64_t n_seqs,
                     const AttentionHeads& heads, float* out);
}  // namespace ref

// Threads the optimised ops use (OpenMP); a tensor-parallel rank running as a
// thread sets its share of the cores. n <= 0 restores the default. When
// OMP_NUM_THREADS is set, its (first) value caps n.
void set_num_threads(int n);
int num_threads();

}  // namespace shardlm::backend
