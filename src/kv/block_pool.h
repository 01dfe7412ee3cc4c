// Paged KV-cache bookkeeping: a fixed pool of blocks (block_size token slots
// each), reference counts, and a prefix cache. The model owns the KV tensors;
// this file only decides which block ids hold which positions. Plain ints, no
// tensors, so every rule is testable without a model.
//
// Prefix caching (vLLM v1's scheme): once a block is full and its KV has been
// computed, it is keyed by hash(parent block hash, its token ids) and can be
// reused by any later sequence whose prompt starts with the same tokens. A
// cached block whose ref count drops to 0 is not erased: it stays in the index
// and is evicted (least recently used first) only when a fresh block is needed
// and no never-cached free block is left.
#pragma once

#include "core/defaults.h"

#include <cstdint>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace shardlm {

using BlockHash = uint64_t;

inline constexpr BlockHash kRootBlockHash = 0x5348'4152'444c'4d00ULL;  // parent hash of block 0

// XXH3-64 of (parent, tokens): chains, so a block's hash covers its whole prefix.
BlockHash hash_block(BlockHash parent, std::span<const int32_t> tokens);

// The parent hash of block 0 for a request's cache_salt: kRootBlockHash for
// none, else a hash of the salt, so that only requests with the same salt
// share cached blocks (and learn from cached_tokens that a prefix was seen).
BlockHash cache_root(std::string_view salt);
// The root of a chain whose blocks hold KV computed another way for the same
// tokens (LongRoPE's long factors): derived from `root`, and no block's hash.
BlockHash long_context_root(BlockHash root);

// Counters in tokens, as vLLM's prefix_cache_queries / prefix_cache_hits.
struct PrefixCacheStats {
  int64_t n_requests = 0;       // lookups recorded
  int64_t n_query_tokens = 0;   // prompt tokens looked up
  int64_t n_hit_tokens = 0;     // of those, found in the cache
  int64_t n_evictions = 0;      // cached blocks reclaimed for new content
};

class BlockPool {
 public:
  explicit BlockPool(int32_t n_blocks, int32_t block_size = kDefaultBlockSize,
                     bool enable_prefix_caching = true);

  int32_t n_blocks() const { return n_blocks_; }
  int32_t block_size() const { return block_size_; }
  bool prefix_caching() const { return enable_prefix_caching_; }

  // Blocks with ref count 0 (never-cached free + evictable cached).
  int32_t n_free() const { return static_cast<int32_t>(free_.size()) + n_evictable_; }
  int32_t n_used() const { return n_blocks_ - n_free(); }
  int32_t n_evictable() const { return n_evictable_; }
  int32_t n_cached() const { return static_cast<int32_t>(index_.size()); }
  // Fraction of blocks referenced by a sequence, in [0, 1] (vllm:kv_cache_usage_perc).
  double usage() const { return n_blocks_ == 0 ? 0.0 : double(n_used()) / double(n_blocks_); }

  // A fresh block with ref count 1, uncached. Takes a never-cached free block
  // first, else evicts the least recently used cached one. Throws kOutOfMemory
  // when every block is referenced; check n_free() first.
  int32_t allocate();
  void ref(int32_t block);    // one more sequence uses it (a cache hit); revives an evictable block
  void unref(int32_t block);  // at 0 a cached block becomes evictable (MRU end), others free
  int32_t ref_count(int32_t block) const;

  // The cached block for (hash, parent, tokens), or -1. Tokens and parent are
  // compared too, so a hash collision is a miss, never wrong KV.
  int32_t find_cached(BlockHash hash, BlockHash parent, std::span<const int32_t> tokens) const;
  // Key a full, computed, referenced block. No-op if that content is already
  // cached in another block (two sequences computed the same prefix at once).
  void register_cached(int32_t block, BlockHash hash, BlockHash parent,
                       std::span<const int32_t> tokens);
  bool is_cached(int32_t block) const { return meta_[block].cached; }

  void record_lookup(int64_t n_query_tokens, int64_t n_hit_tokens);
  const PrefixCacheStats& stats() const { return stats_; }

  // Drops every cached entry that nothing references (e.g. weights changed).
  void reset_prefix_cache();

 private:
  struct Meta {
    int32_t ref_count = 0;
    bool cached = false;
    BlockHash hash = 0;
    BlockHash parent = 0;
    std::vector<int32_t> tokens;  // [block_size] when cached
    int32_t lru_prev = -1;        // evictable list links (ref_count 0 and cached)
    int32_t lru_next = -1;
    bool in_lru = false;
  };
  void check_id(int32_t block, const char* what) const;
  void lru_push_back(int32_t block);
  void lru_remove(int32_t block);
  void uncache(int32_t block);

  int32_t n_blocks_;
  int32_t block_size_;
  bool enable_prefix_caching_;
  std::vector<Meta> meta_;                         // [n_blocks]
  std::vector<int32_t> free_;                      // never-cached blocks with ref 0 (stack)
  int32_t lru_head_ = -1;                          // least recently used evictable block
  int32_t lru_tail_ = -1;
  int32_t n_evictable_ = 0;
  std::unordered_map<BlockHash, int32_t> index_;   // hash -> block
  PrefixCacheStats stats_;
};

}  // namespace shardlm
