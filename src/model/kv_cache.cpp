#include "model/kv_cache.h"

#include "core/error.h"

namespace shardlm {

KvCache::KvCache(backend::Backend& b, int64_t n_layers, int64_t n_blocks, int64_t block_size, int64_t n_kv_heads,
                 int64_t head_dim, DType dtype)
    : KvCache(b, n_layers, n_blocks, block_size, n_kv_heads, head_dim, dtype, {}, 0) {}

KvCache::KvCache(backend::Backend& b, int64_t n_layers, int64_t n_blocks, int64_t block_size, int64_t n_kv_heads,
                 int64_t head_dim, DType dtype, const std::vector<bool>& local, int64_t n_local_blocks)
    : n_layers_(n_layers), n_blocks_(n_blocks), block_size_(block_size), n_kv_heads_(n_kv_heads),
      head_dim_(head_dim), n_local_blocks_(n_local_blocks), local_(local), dtype_(dtype) {
  if (n_blocks < 1 || block_size < 1)
    fail(ErrorCode::kInvalidArgument, "KV cache: need at least one block of at least one token, got ", n_blocks,
         " blocks of ", block_size);
  if (local_.empty()) local_.assign(static_cast<size_t>(n_layers), false);
  SHARDLM_CHECK(static_cast<int64_t>(local_.size()) == n_layers, "KV cache: ", local_.size(), " layer flags for ",
                n_layers, " layers");
  if (n_local_layers() > 0 && n_local_blocks < 1)
    fail(ErrorCode::kInvalidArgument, "KV cache: the local layers' pool needs at least one block, got ",
         n_local_blocks);
  if (n_local_layers() == 0) n_local_blocks_ = n_local_blocks;  // a stage without local layers keeps the count
  const int64_t before = b.allocated_bytes();
  for (int64_t l = 0; l < n_layers; ++l) {
    const TensorShape shape{local_[static_cast<size_t>(l)] ? n_local_blocks : n_blocks, block_size, n_kv_heads,
                            head_dim};
    k_.push_back(b.alloc(dtype, shape));
    v_.push_back(b.alloc(dtype, shape));
  }
  allocated_bytes_ = b.allocated_bytes() - before;

}

int64_t KvCache::block_bytes(int64_t n_layers, int64_t block_size, int64_t n_kv_heads, int64_t head_dim,
                             DType dtype) {
  return 2 * n_layers * block_size * n_kv_heads * head_dim * static_cast<int64_t>(dtype_size(dtype));
}


int64_t KvCache::n_local_layers() const {
  int64_t n = 0;
  for (bool l : local_) n += l ? 1 : 0;
  return n;
}

backend::KvLayerView KvCache::layer(int64_t i) {
  SHARDLM_CHECK(i >= 0 && i < n_layers_, "KV cache layer ", i, " of ", n_layers_);
  const bool local = local_[static_cast<size_t>(i)];
  return {k_[static_cast<size_t>(i)].data(), v_[static_cast<size_t>(i)].data(), dtype_,
          local ? n_local_blocks_ : n_blocks_, block_size_, n_kv_heads_, head_dim_, local ? 1 : 0};
}

}  // namespace shardlm
