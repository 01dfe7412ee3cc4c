// CPU ops of the forward pass. Activations are f32; weights and biases stay
// in their checkpoint dtype (bf16/f16/f32) and are widened in registers, never
// in memory. Each op has a scalar reference (namespace ref, ops_ref.cpp) that
// the optimised version (ops.cpp: AVX2/FMA + OpenMP) is tested against.
#pragma once

#include <cstdint>
#include <vector>

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

// The kernels a dense matmul can take:
//   kRows:   backend/rows_gemm.h, built per ISA and chosen by CPUID
//            (active_cpu_isa()): batch 1 and small batches; its reduction
//            order of an element is the same for every n;
//   kPacked: backend/packed_gemm.h's AVX-512/AVX2 GEMM (prefill, large batches);
//   kAmx:    the same GEMM on AMX tiles (bf16 on CPUs that have them).
// The two GEMMs sum in another order than kRows, so with them a row's
// output depends (in the last bits) on how many rows share the call.
enum class MatmulPath { kRows, kPacked, kAmx };
MatmulPath matmul_path(int64_t n, DType weight_dtype);
const char* matmul_path_name(MatmulPath path);  // "rows", "packed", "amx"

// Batch invariance (process-wide; off by default): when on, every dense
// matmul takes kRows whatever n is, so a row's output is bit-identical
// computed alone or among any other rows (speculative verification, a
// request's tokens under any load). Quantized matmuls: backend/quant_ops.h.
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

// One layer's paged KV cache, K and V each [n_blocks, block_size, n_kv_heads, head_dim]
// in dtype (f32, f16, bf16, or f8_e4m3 written with scale 1). n_kv_heads counts the heads this rank holds.
struct KvLayerView {
  void* k = nullptr;
  void* v = nullptr;
  DType dtype = DType::kBF16;
  int64_t n_blocks = 0;
  int64_t block_size = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  // Which block tables address it: 0 the sequences' (StepMetadata::seqs()),
  // 1 the local sliding-window layers' own pool (StepMetadata::seqs(1):
  // hybrid models such as Gemma 3, whose local layers keep a table that
  // releases the blocks leaving the window).
  int32_t group = 0;
};

// One sequence's chunk of a batch: tokens [token_begin, token_begin + n_tokens)
// of the batch sit at positions n_past .. n_past + n_tokens - 1; position p
// lives in block block_table[p / block_size], slot p % block_size. Entries
// wholly before the first position a kernel touches may be -1: blocks the
// scheduler released once they left a sliding window (kv/block_table.h).
struct AttentionSeq {
  int64_t token_begin = 0;
  int64_t n_tokens = 0;
  int64_t n_past = 0;
  const int32_t* block_table = nullptr;
  int64_t n_table = 0;  // entries of block_table; must cover n_past + n_tokens
};

// Which heads the rank computes. Local Q head i is global head q_head_begin + i;
// it reads global KV head (q_head_begin + i) / group_size, which is local KV
// head that minus kv_head_begin (with uneven TP a rank's Q heads [q0, q1) use
// KV heads [q0 / g, ceil(q1 / g))).
struct AttentionHeads {
  int64_t n_q_heads = 0;
  int64_t q_head_begin = 0;
  int64_t kv_head_begin = 0;
  int64_t group_size = 1;
  // Softmax scale of q·k: 0 means 1/sqrt(head_dim) (Gemma 3 sets
  // query_pre_attn_scalar^-0.5).
  float scale = 0.0f;
  // > 0: a query at position p attends to positions (p - window, p] only
  // (the `window` most recent keys, itself included: HF's sliding_window).
  int64_t window = 0;
  float scale_for(int64_t head_dim) const;
};

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
