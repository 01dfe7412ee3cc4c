// Paged KV cache of one rank: for each decoder layer of the rank's stage, K
// and V as [n_blocks, block_size, n_kv_heads_on_rank, head_dim] in a chosen
// dtype (bf16 halves the bytes; f32 for exactness). Blocks are indexed by the
// block tables of ForwardBatch; the kv pool (src/kv) decides which are free.
//
// Hybrid models (Gemma 3): the layers marked local (sliding-window layers)
// may keep their K and V in a pool of their own, [n_local_blocks,
// block_size, n_kv_heads, head_dim], addressed by the local block tables
// (KvLayerView::group 1); the other layers use the n_blocks pool.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace shardlm {

class KvCache {
 public:
  KvCache() = default;
  // Allocates K and V of every layer from the rank's backend (zero-filled).
  KvCache(backend::Backend& b, int64_t n_layers, int64_t n_blocks, int64_t block_size, int64_t n_kv_heads,
          int64_t head_dim, DType dtype);
  // local[i]: layer i of this rank uses the local pool of n_local_blocks blocks (> 0).
  KvCache(backend::Backend& b, int64_t n_layers, int64_t n_blocks, int64_t block_size, int64_t n_kv_heads,
          int64_t head_dim, DType dtype, const std::vector<bool>& local, int64_t n_local_blocks);

  // Bytes one block takes over all layers of this rank (K and V).
  static int64_t block_bytes(int64_t n_layers, int64_t block_size, int64_t n_kv_heads, int64_t head_dim, DType dtype);

  int64_t n_layers() const { return n_layers_; }
  int64_t n_blocks() const { return n_blocks_; }
  int64_t n_local_blocks() const { return n_local_blocks_; }  // 0: no local pool
  int64_t n_local_layers() const;                              // layers of this rank in the local pool
  int64_t block_size() const { return block_size_; }
  int64_t n_kv_heads() const { return n_kv_heads_; }
  int64_t head_dim() const { return head_dim_; }
  DType dtype() const { return dtype_; }
  // K + V bytes as the backend's allocator obtained them (measured: its
  // allocated_bytes() before and after), which plan's block_bytes × n_blocks
  // must match.
  int64_t bytes() const { return allocated_bytes_; }
  // View of local layer i (0 = the first layer of this rank's stage).
  backend::KvLayerView layer(int64_t i);

 private:
  int64_t n_layers_ = 0, n_blocks_ = 0, block_size_ = 0, n_kv_heads_ = 0, head_dim_ = 0;
  int64_t n_local_blocks_ = 0;
  std::vector<bool> local_;  // [n_layers]: in the local pool
  DType dtype_ = DType::kBF16;
  int64_t allocated_bytes_ = 0;
  std::vector<Tensor> k_, v_;  // per layer: [n_blocks (n_local_blocks when local), block_size, n_kv_heads, head_dim]
};

}  // namespace shardlm
