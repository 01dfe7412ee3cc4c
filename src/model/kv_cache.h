// Paged KV cache of one rank: for each decoder layer of the rank's stage, K
// and V as [n_blocks, block_size, n_kv_heads_on_rank, head_dim] in a chosen
// dtype (bf16 halves the bytes; f32 for exactness). Blocks are indexed by the
// block tables of ForwardBatch; the kv pool (src/kv) decides which are free.
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

  // Bytes one block takes over all layers of this rank (K and V).
  static int64_t block_bytes(int64_t n_layers, int64_t block_size, int64_t n_kv_heads, int64_t head_dim, DType dtype);

  int64_t n_layers() const { return n_layers_; }
  int64_t n_blocks() const { return n_blocks_; }
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
  DType dtype_ = DType::kBF16;
  int64_t allocated_bytes_ = 0;
  std::vector<Tensor> k_, v_;  // per layer: [n_blocks, block_size, n_kv_heads, head_dim]
};

}  // namespace shardlm
