// Per-sequence block list and the operations that move it (allocate slots,
// match a cached prefix, register computed blocks, free) against a BlockPool.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kv/block_pool.h"

namespace shardlm {

struct BlockTable {
  std::vector<int32_t> blocks;       // [ceil(n_slots / block_size)]: block of positions [i*bs, (i+1)*bs)
  std::vector<BlockHash> hashes;     // [n full blocks hashed so far]: chained hash of block i
  int32_t n_registered = 0;          // leading blocks already offered to the prefix cache
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
// when the pool has too few free blocks.
bool allocate_slots(BlockPool& pool, BlockTable& table, int32_t n_total_slots,
                    const PrefixMatch* match = nullptr);

// Number of fresh blocks allocate_slots would take.
int32_t n_blocks_needed(const BlockPool& pool, const BlockTable& table, int32_t n_total_slots,
                        const PrefixMatch* match = nullptr);

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
// Releases every block (last block first, so a prefix's tail is evicted
// before its head) and clears the table.
void free_table(BlockPool& pool, BlockTable& table);

}  // namespace shardlm
