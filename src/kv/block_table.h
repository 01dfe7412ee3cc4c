// Per-sequence block list and the operations that move it (allocate slots,
// match a cached prefix, register computed blocks, free) against a BlockPool.
//
// Sliding window (every layer attends to its last `window` positions, itself
// included: Mistral v0.1, Phi-3-mini-4k): a query at position p reads keys
// [max(0, p + 1 - window), p]. Once the first position a sequence still has
// to compute is q, no later query reads a position before q + 1 - window, so
// the blocks that lie wholly before it are released (release_before) and
// their table entries become kNoBlock: holes that no kernel reads. Holes are
// always a prefix of the table (the window only moves forward); the table
// keeps its length, so block i still holds positions [i*bs, (i+1)*bs).
//
// Hybrid models (Gemma 3: local sliding-window layers interleaved with global
// ones) keep two tables per sequence over two pools: the global layers' table
// keeps every block, the local layers' table releases the blocks that leave
// the local window as above. Both cover the same positions and are hashed on
// the same chain, so a local block is cached under its global twin's hash;
// find_window_prefix finds the local blocks a prefix hit needs.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kv/block_pool.h"

namespace shardlm {

inline constexpr int32_t kNoBlock = -1;  // a table entry released after leaving the sliding window

struct BlockTable {
  std::vector<int32_t> blocks;       // [ceil(n_slots / block_size)]: block of positions [i*bs, (i+1)*bs),
                                     // kNoBlock for the leading n_released entries
  std::vector<BlockHash> hashes;     // [n full blocks hashed so far]: chained hash of block i
  int32_t n_registered = 0;          // leading blocks already offered to the prefix cache
  int32_t n_released = 0;            // leading entries released by release_before (kNoBlock)
  int32_t n_held() const { return static_cast<int32_t>(blocks.size()) - n_released; }
  int32_t n_slots(int32_t block_size) const { return static_cast<int32_t>(blocks.size()) * block_size; }
};

// A cached prefix found for a token sequence; nothing is referenced until
// allocate_slots takes it, so a failed allocation leaves no trace.
struct PrefixMatch {
  std::vector<int32_t> blocks;    // [n_hit_tokens / block_size]
  std::vector<BlockHash> hashes;  // same length
  int32_t n_tokens = 0;           // blocks.size() * block_size
};

// Longest run of cached full blocks that prefix `tokens`, leaving at least the
// last token uncached (its logits must be computed). Empty when caching is off.
// `root`: the parent hash of block 0 (cache_root of the request's salt).
PrefixMatch find_cached_prefix(const BlockPool& pool, std::span<const int32_t> tokens,
                               BlockHash root = kRootBlockHash);

// Grows `table` so it covers n_total_slots positions, first adopting `match`
// (only on an empty table). All-or-nothing: returns false and changes nothing
// when the pool has too few free blocks. `n_first_kept` (sliding window): the
// adopted blocks wholly before that position are not referenced; their
// entries start as holes (the cache hit still counts them).
bool allocate_slots(BlockPool& pool, BlockTable& table, int32_t n_total_slots,
                    const PrefixMatch* match = nullptr, int32_t n_first_kept = 0);

// Number of fresh blocks allocate_slots would take.
int32_t n_blocks_needed(const BlockPool& pool, const BlockTable& table, int32_t n_total_slots,
                        const PrefixMatch* match = nullptr);
// Blocks allocate_slots (same arguments) takes out of pool.n_free(): the fresh
// ones plus the adopted cached blocks it revives from the evictable list.
// allocate_slots succeeds exactly when this is <= pool.n_free(), so a caller
// can check two pools before touching either (all-or-nothing over both).
int32_t n_free_blocks_needed(const BlockPool& pool, const BlockTable& table, int32_t n_total_slots,
                             const PrefixMatch* match = nullptr, int32_t n_first_kept = 0);

// Hybrid models: the prefix hit both tables can take. `global` is the hit in
// the global layers' pool (find_cached_prefix over the same tokens and root).
// A hit of M tokens needs, in `local_pool`, the blocks of the positions its
// first query reads, [first_position_read(M, window), M), cached under the
// same hashes; the blocks before them are never read. Returns the local match
// for the longest M <= global.n_tokens (a whole number of blocks) whose
// window blocks are all cached: blocks [M / bs], kNoBlock for those before
// the window, hashes and n_tokens as the global match's first M / bs. The
// caller cuts the global match to the same n_tokens. M = 0 always qualifies.
PrefixMatch find_window_prefix(const BlockPool& local_pool, const PrefixMatch& global,
                               std::span<const int32_t> tokens, int32_t window, BlockHash root = kRootBlockHash);

// The first position a query at position `n_first_query` (or any later one)
// reads with a sliding window of `window` positions (0: none, so 0).
int32_t first_position_read(int32_t n_first_query, int32_t window);

// Sliding window: releases (unref: a cached block becomes evictable, others
// free) every held block whose positions all lie before n_first_kept, and
// marks its entry kNoBlock. Returns the blocks released, first to last.
std::vector<int32_t> release_before(BlockPool& pool, BlockTable& table, int32_t n_first_kept);

// The most blocks one sequence ever holds at once when it stores the KV of
// n_positions positions, computed in chunks of at most max_chunk positions
// (new tokens and drafts of one step), with a sliding window of `window`
// positions (0: none, so every position's block stays). The window bound:
// a step whose first query is q holds the blocks of positions
// [q + 1 - window, q + chunk), which span at most ceil((window - 1 + chunk) / bs) + 1 blocks.
int64_t max_blocks_held(int64_t n_positions, int32_t block_size, int32_t window, int64_t max_chunk);

// After the KV of tokens[0, n_computed) is written: hash every newly full
// block and offer it to the prefix cache.
void register_computed(BlockPool& pool, BlockTable& table, std::span<const int32_t> tokens,
                       int32_t n_computed, BlockHash root = kRootBlockHash);

// Speculative rollback: releases the trailing blocks beyond those covering
// n_slots positions (last first), never a block already registered in the
// prefix cache. The kept tail block may still hold KV past n_slots (rejected
// drafts); it is not full up to n_computed, so it is not registered until
// those slots are recomputed.
void truncate_table(BlockPool& pool, BlockTable& table, int32_t n_slots);
// Releases every held block (last block first, so a prefix's tail is evicted
// before its head; holes are skipped) and clears the table.
void free_table(BlockPool& pool, BlockTable& table);

}  // namespace shardlm
