#include "model/kv_cache.h"

#include "core/error.h"

namespace shardlm {

KvCache::KvCache(backend::Backend& b, int64_t n_layers, int64_t n_blocks, int64_t block_size, int64_t n_kv_heads,
                 int64_t head_dim, DType dtype)
    : n_layers_(n_layers), n_blocks_(n_blocks), block_size_(block_size), n_kv_heads_(n_kv_heads),
      head_dim_(head_dim), dtype_(dtype) {
  if (n_blocks < 1 || block_size < 1)
    fail(ErrorCode::kInvalidArgument, "KV cache: need at least one block of at least one token, got ", n_blocks,
         " blocks of ", block_size);
  const int64_t before = b.allocated_bytes();
  const TensorShape shape{n_blocks, block_size, n_kv_heads, head_dim};
  for (int64_t l = 0; l < n_layers; ++l) {
    k_.push_back(b.alloc(dtype, shape));
    v_.push_back(b.alloc(dtype, shape));
  }
  allocated_bytes_ = b.allocated_bytes() - before;

}

int64_t KvCache::block_bytes(int64_t n_layers, int64_t block_size, int64_t n_kv_heads, int64_t head_dim,
                             DType dtype) {
  return 2 * n_layers * block_size * n_kv_heads * head_dim * static_cast<int64_t>(dtype_size(dtype));
}


backend::KvLayerView KvCache::layer(int64_t i) {
  SHARDLM_CHECK(i >= 0 && i < n_layers_, "KV cache layer ", i, " of ", n_layers_);
  return {k_[static_cast<size_t>(i)].data(), v_[static_cast<size_t>(i)].data(), dtype_, n_blocks_, block_size_,
          n_kv_heads_, head_dim_};
}

}  // namespace shardlm
