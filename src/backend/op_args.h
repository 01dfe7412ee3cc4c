// Argument types of the Backend ops, shared by every device: the public ops
// (backend/backend.h), the CPU kernels (backend/cpu/) and the CUDA kernels
// (backend/cuda/kernels.h) all take these, never a copy of them. Plain data
// only (no Tensor), so that nvcc's C++17 compiles it too. Shapes are in the
// comments.
#pragma once

#include <cmath>
#include <cstdint>

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
};

// One sequence's chunk of a batch: tokens [token_begin, token_begin + n_tokens)
// of the batch sit at positions n_past .. n_past + n_tokens - 1; position p
// lives in block block_table[p / block_size], slot p % block_size.
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

}  // namespace shardlm::backend
