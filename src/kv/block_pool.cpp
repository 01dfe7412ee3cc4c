#include "kv/block_pool.h"

#include <algorithm>
#include <xxhash.h>

#include "core/error.h"

namespace shardlm {

BlockHash hash_block(BlockHash parent, std::span<const int32_t> tokens) {
  // The parent hash seeds the hash of this block's token ids.
  return XXH3_64bits_withSeed(tokens.data(), tokens.size_bytes(), parent);
}

BlockHash cache_root(std::string_view salt) {
  if (salt.empty()) return kRootBlockHash;
  // Seeded apart from every token chain: a salt's root is no block's hash.
  return XXH3_64bits_withSeed(salt.data(), salt.size(), ~kRootBlockHash);
}

BlockHash long_context_root(BlockHash root) {
  static constexpr char kTag[] = "longrope-long-factors";
  return XXH3_64bits_withSeed(kTag, sizeof(kTag) - 1, root ^ ~kRootBlockHash);
}

BlockPool::BlockPool(int32_t n_blocks, int32_t block_size, bool enable_prefix_caching)
    : n_blocks_(n_blocks), block_size_(block_size), enable_prefix_caching_(enable_prefix_caching) {
  if (n_blocks < 1)
    fail(ErrorCode::kInvalidArgument, "KV cache: n_blocks must be >= 1, got ", n_blocks,
         "; give the cache more memory or shorten --max-model-len");
  if (block_size < 1)
    fail(ErrorCode::kInvalidArgument, "KV cache: block_size must be >= 1, got ", block_size);
  meta_.resize(n_blocks);
  free_.reserve(n_blocks);
  // Stack: block 0 is handed out first.
  for (int32_t b = n_blocks - 1; b >= 0; --b) free_.push_back(b);
}

void BlockPool::check_id(int32_t block, const char* what) const {
  SHARDLM_CHECK(block >= 0 && block < n_blocks_, what, ": block id ", block, " outside [0, ", n_blocks_, ")");
}

void BlockPool::lru_push_back(int32_t b) {
  Meta& m = meta_[b];
  m.lru_prev = lru_tail_;
  m.lru_next = -1;
  if (lru_tail_ >= 0) meta_[lru_tail_].lru_next = b; else lru_head_ = b;
  lru_tail_ = b;
  m.in_lru = true;
  ++n_evictable_;
}

void BlockPool::lru_remove(int32_t b) {
  Meta& m = meta_[b];
  SHARDLM_CHECK(m.in_lru);
  if (m.lru_prev >= 0) meta_[m.lru_prev].lru_next = m.lru_next; else lru_head_ = m.lru_next;
  if (m.lru_next >= 0) meta_[m.lru_next].lru_prev = m.lru_prev; else lru_tail_ = m.lru_prev;
  m.lru_prev = m.lru_next = -1;
  m.in_lru = false;
  --n_evictable_;
}

void BlockPool::uncache(int32_t b) {
  Meta& m = meta_[b];
  if (!m.cached) return;
  auto it = index_.find(m.hash);
  if (it != index_.end() && it->second == b) index_.erase(it);
  m.cached = false;
  m.tokens.clear();
}

int32_t BlockPool::allocate() {
  int32_t b = -1;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else if (lru_head_ >= 0) {
    b = lru_head_;
    lru_remove(b);
    uncache(b);
    ++stats_.n_evictions;
  } else {
    fail(ErrorCode::kOutOfMemory, "KV cache: all ", n_blocks_, " blocks are in use");
  }
  SHARDLM_CHECK(meta_[b].ref_count == 0, "block ", b);
  meta_[b].ref_count = 1;
  return b;
}

void BlockPool::ref(int32_t b) {
  check_id(b, "ref");
  Meta& m = meta_[b];
  if (m.ref_count == 0) {
    SHARDLM_CHECK(m.cached, "ref of free uncached block ", b);
    lru_remove(b);
  }
  ++m.ref_count;
}

void BlockPool::unref(int32_t b) {
  check_id(b, "unref");
  Meta& m = meta_[b];
  SHARDLM_CHECK(m.ref_count > 0, "unref of free block ", b);
  if (--m.ref_count > 0) return;
  if (m.cached) lru_push_back(b); else free_.push_back(b);
}

int32_t BlockPool::ref_count(int32_t b) const {
  check_id(b, "ref_count");
  return meta_[b].ref_count;
}

int32_t BlockPool::find_cached(BlockHash hash, BlockHash parent, std::span<const int32_t> tokens) const {
  if (!enable_prefix_caching_) return -1;
  auto it = index_.find(hash);
  if (it == index_.end()) return -1;
  const Meta& m = meta_[it->second];
  if (m.parent != parent || !std::equal(tokens.begin(), tokens.end(), m.tokens.begin(), m.tokens.end()))
    return -1;  // hash collision
  return it->second;
}

void BlockPool::register_cached(int32_t b, BlockHash hash, BlockHash parent, std::span<const int32_t> tokens) {
  check_id(b, "register_cached");
  if (!enable_prefix_caching_) return;
  SHARDLM_CHECK(static_cast<int32_t>(tokens.size()) == block_size_, "only full blocks are cached");
  Meta& m = meta_[b];
  SHARDLM_CHECK(m.ref_count > 0, "register of free block ", b);
  if (m.cached || index_.count(hash)) return;
  m.cached = true;
  m.hash = hash;
  m.parent = parent;
  m.tokens.assign(tokens.begin(), tokens.end());
  index_.emplace(hash, b);
}

void BlockPool::record_lookup(int64_t n_query_tokens, int64_t n_hit_tokens) {
  ++stats_.n_requests;
  stats_.n_query_tokens += n_query_tokens;
  stats_.n_hit_tokens += n_hit_tokens;
}

void BlockPool::reset_prefix_cache() {
  while (lru_head_ >= 0) {
    int32_t b = lru_head_;
    lru_remove(b);
    uncache(b);
    free_.push_back(b);
  }
}

}  // namespace shardlm
