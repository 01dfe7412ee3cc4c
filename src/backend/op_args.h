// Argument types of the Backend ops, shared by every device: the public ops
// (backend/backend.h), the CPU kernels (backend/cpu/) and the CUDA kernels
// (backend/cuda/kernels.h) all take these, never a copy of them. Plain data
// only (no Tensor), so that nvcc's C++17 compiles it too. Shapes are in the
// comments.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>

#include "core/dtype.h"

namespace shardlm::backend {

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
  // releases the blocks leaving the window). Group 1 reaches a backend only
  // where supports(OpArgs::of(Op::kKvGroups)).
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
  float scale_for(int64_t head_dim) const {
    return scale > 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
  }
};

// How a Linear's weights are stored (backend/cpu/quant_ops.h has the formats).
enum class WeightScheme { kDense, kAwq, kGptq, kFp8 };
// "dense", "awq", "gptq", "fp8"
const char* weight_scheme_name(WeightScheme scheme);

// ---- what a backend can run: Backend::supports(OpArgs) ----
// The ops whose support differs between backends (every other op runs on
// every backend).
enum class Op {
  kMatmul,          // args: weight_dtype (dense) or scheme and bits (quantized)
  kPagedAttention,  // args: heads (their scale and window), head_dim, kv_dtype
  kSampleRows,      // sampling where the logits are (a GPU: only ids cross)
  kMoe,             // moe_route and moe_experts
  kKvGroups,        // kv_cache_write and paged_attention read KvLayerView::group's block tables
};
// "matmul", "paged_attention", "sample_rows", "moe", "kv_groups"
const char* op_name(Op op);

// One supports() question: the op and the arguments that decide it. Fields
// another op reads keep their defaults; build one with the helpers.
struct OpArgs {
  Op op = Op::kMatmul;
  DType weight_dtype = DType::kBF16;           // kMatmul, dense: the weight's stored dtype
  WeightScheme scheme = WeightScheme::kDense;  // kMatmul
  int bits = 0;                                // kMatmul, quantized: 4 or 8
  AttentionHeads heads;                        // kPagedAttention
  int64_t head_dim = 0;                        // kPagedAttention
  std::optional<DType> kv_dtype;               // kPagedAttention: the cache's dtype (unset: not asked)

  static OpArgs of(Op op) {
    OpArgs a;
    a.op = op;
    return a;
  }
  static OpArgs dense_matmul(DType weight_dtype) {
    OpArgs a = of(Op::kMatmul);
    a.weight_dtype = weight_dtype;
    return a;
  }
  static OpArgs quant_matmul(WeightScheme scheme, int bits) {
    OpArgs a = of(Op::kMatmul);
    a.scheme = scheme;
    a.bits = bits;
    return a;
  }
  static OpArgs attention(const AttentionHeads& heads, int64_t head_dim,
                          std::optional<DType> kv_dtype = std::nullopt) {
    OpArgs a = of(Op::kPagedAttention);
    a.heads = heads;
    a.head_dim = head_dim;
    a.kv_dtype = kv_dtype;
    return a;
  }
};

}  // namespace shardlm::backend

