// The CUDA backend's own kernels (kernels/*.cu), as host-callable launchers on
// a stream. Device pointers throughout; shapes in the comments. Contracts
// mirror the CPU ops in backend/cpu/ops.h, which are their oracle (the ops test in
// tests/backend/cuda/ compares each against backend::ref on a device):
//   - the residual stream and attention scores stay f32; GEMM inputs, the KV
//     cache and the attention output are bf16 (tensor-core operands);
//   - per-step metadata (positions, slot mapping, block tables, sequence
//     boundaries) is packed once per step on the host and copied in one go;
//   - the op arguments the CPU kernels take too (AttentionHeads: which heads,
//     their scale and window) are backend/op_args.h's, passed by value.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/op_args.h"

namespace shardlm::backend::cuda {

using bf16 = __nv_bfloat16;

// out[i, :] = table[ids[i] - vocab_begin, :] for ids inside this rank's slice
// [vocab_begin, vocab_begin + n_rows), zeros otherwise (the vocab-parallel
// slices are then summed with all_reduce). table: [n_rows, dim] bf16;
// ids: [n_tokens]; out: [n_tokens, dim] f32.
void embedding_gather(const bf16* table, int64_t n_rows, int64_t dim, int64_t vocab_begin, const int32_t* ids,
                      int64_t n_tokens, float* out, cudaStream_t stream);

// Fused residual add + RMSNorm over rows of [n_rows, dim]:
//   if delta: residual += delta;  out = residual / sqrt(mean(residual²) + eps) × (weight_offset + weight).
// residual: f32 (updated in place); delta: f32 or null; weight: [dim] bf16; out: bf16.
// weight_offset: 1 for Gemma's (1 + w) norms, else 0.
void rms_norm_residual(float* residual, const float* delta, int64_t n_rows, int64_t dim, const bf16* weight, float eps,
                       float weight_offset, bf16* out, cudaStream_t stream);
// Plain RMSNorm in f32, in place allowed (Qwen3's per-head q/k norm): x, out [n_rows, dim].
void rms_norm_f32(const float* x, int64_t n_rows, int64_t dim, const bf16* weight, float eps, float weight_offset,
                  float* out, cudaStream_t stream);

// Rotate-half RoPE in place. x: [n_tokens, n_heads, head_dim] f32 (row stride
// row_stride floats, so q and k inside one fused qkv row work); positions:
// [n_tokens]; inv_freq: [head_dim / 2] f32 from backend::rope_inv_freq, which
// is where every rope type the CPU supports (default, linear, llama3,
// longrope) lives. Only the first rotary_dim of each head rotate (partial
// rotary); cos and sin are multiplied by mscale.
void rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t row_stride, const int32_t* positions,
          const float* inv_freq, int64_t rotary_dim, float mscale, cudaStream_t stream);

// out[i] = silu(gate[i]) × up[i]. gate, up: [n_tokens, n_inter] f32 with row
// stride `stride` (gate and up may be halves of one GEMM output); out: [n_tokens, n_inter] bf16.
void silu_mul(const float* gate, const float* up, int64_t n_tokens, int64_t n_inter, int64_t stride, bf16* out,
              cudaStream_t stream);

// out[i] = gelu_tanh(gate[i]) × up[i] (GeGLU, PyTorch's tanh approximation); shapes as silu_mul.
void gelu_tanh_mul(const float* gate, const float* up, int64_t n_tokens, int64_t n_inter, int64_t stride, bf16* out,
                   cudaStream_t stream);

// y[i] += b[i % n] for i < n_rows × n (a bias after a GEMM). y: [n_rows, n] f32; b: [n] bf16.
void add_bias(float* y, const bf16* b, int64_t n_rows, int64_t n, cudaStream_t stream);

// One layer's paged cache on the device: K, V each [n_blocks, block_size, n_kv_heads, head_dim] bf16.
struct DeviceKvLayer {
  bf16* k = nullptr;
  bf16* v = nullptr;
  int64_t n_blocks = 0;
  int64_t block_size = 0;
  int64_t n_kv_heads = 0;  // heads this rank holds
  int64_t head_dim = 0;
};

// The step's sequences as backend::StepMetadata packs them and begin_step
// uploads them, in one buffer: records [n_seqs × 5] of (token_begin,
// n_tokens, n_past, table_offset, n_table), and the block tables they point
// into. A record with n_tokens = 0 is padding (a CUDA-graph bucket's spare row).
struct DeviceSeqs {
  const int32_t* records = nullptr;       // [n_seqs, StepMetadata::kSeqRecord]
  const int32_t* block_tables = nullptr;  // [sum of n_table]
  int64_t n_seqs = 0;
};
constexpr int kSeqRecord = 5;

// Writes each new token's key and value at its position's slot (block
// table[pos / block_size], offset pos % block_size). k, v: [n_tokens,
// n_kv_heads, head_dim] f32 with row stride row_stride floats.
void kv_cache_write(const DeviceKvLayer& cache, const float* k, const float* v, int64_t row_stride,
                    const DeviceSeqs& seqs, int64_t n_tokens, cudaStream_t stream);

// The head sizes the attention kernels are built for (a warp holds a head
// dimension in registers: multiples of 32, at most 256).
inline bool attention_head_dim_supported(int64_t head_dim) {
  return head_dim == 64 || head_dim == 96 || head_dim == 128 || head_dim == 256;
}
constexpr const char* kAttentionHeadDims = "64, 96, 128 or 256";

// Decode attention (one new token per sequence), split-K / flash-decoding:
// each thread block takes one (sequence, local KV head, context partition of
// kDecodePartition tokens) and serves every local Q head of that KV head's
// GQA group from one read of K and V; a second kernel merges the partitions.
// Sequence s's query is row token_begin of q: [n_tokens, n_q_heads, head_dim]
// f32 (row stride q_stride floats); its context is n_past + 1 cached tokens
// (the new one written first), of which it reads the last heads.window when
// the layer has a sliding window (the partitions cut only that span); scores
// are scaled by heads.scale_for(head_dim). out: [n_tokens, n_q_heads, head_dim] bf16.
// max_context bounds every context (it fixes the partition count, so a CUDA
// graph captured with it serves any step up to it). workspace:
// decode_attention_workspace_bytes(...) bytes, or null when it is 0 (one partition).
constexpr int kDecodePartition = 512;
// Local Q heads per KV head a decode block serves (each keeps its own
// accumulator per output dimension); more is refused, naming the count.
constexpr int kMaxAttentionGroup = 16;
// Partitions per sequence: ceil(min(max_context, window or max_context) / kDecodePartition).
int64_t decode_attention_partitions(int64_t max_context, int64_t window);
size_t decode_attention_workspace_bytes(int64_t n_seqs, const AttentionHeads& heads, int64_t head_dim,
                                        int64_t max_context);
void paged_attention_decode(const float* q, int64_t q_stride, const DeviceKvLayer& cache, const AttentionHeads& heads,
                            const DeviceSeqs& seqs, int64_t max_context, void* workspace, bf16* out,
                            cudaStream_t stream);

// Prefill / chunked prefill attention, tiled and causal: sequence s's tokens
// [token_begin, token_begin + n_tokens) of the batch sit at positions
// n_past ..; each query attends to every cached position <= its own (the
// chunk must already be in the cache), or to the last heads.window of them
// on a sliding-window layer, scaled by heads.scale_for(head_dim). Thread blocks take (tile of
// kPrefillQueryTile queries, Q head, sequence) and stream K/V tiles through
// shared memory with an online softmax. q: [n_tokens, n_q_heads, head_dim] f32
// (row stride q_stride); out: [n_tokens, n_q_heads, head_dim] bf16.
constexpr int kPrefillQueryTile = 8;
void paged_attention_prefill(const float* q, int64_t q_stride, const DeviceKvLayer& cache, const AttentionHeads& heads,
                             const DeviceSeqs& seqs, int64_t max_tokens_per_seq, bf16* out, cudaStream_t stream);

// y[i] += x[i] for i < count, both f32 (the residual add of the Backend interface).
void add_f32(float* y, const float* x, int64_t count, cudaStream_t stream);
// x[i] *= s for i < count.
void scale_f32(float* x, int64_t count, float s, cudaStream_t stream);
// x = cap * tanh(x / cap) in place (Gemma's final logit soft-capping).
void softcap_f32(float* x, int64_t count, float cap, cudaStream_t stream);

// out[i, :] = x[rows[i], :] for i < n_rows; x: [*, dim] f32, rows: [n_rows]
// (device indices, e.g. StepMetadata's logit rows), out: [n_rows, dim] f32.
void gather_rows_f32(const float* x, int64_t dim, const int32_t* rows, int64_t n_rows, float* out, cudaStream_t stream);

// f32 ⇄ bf16 conversion (round to nearest even), count elements.
void f32_to_bf16(const float* in, int64_t count, bf16* out, cudaStream_t stream);
void bf16_to_f32(const bf16* in, int64_t count, float* out, cudaStream_t stream);

}  // namespace shardlm::backend::cuda
