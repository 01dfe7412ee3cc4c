#include "kv/block_table.h"

#include <algorithm>

#include "core/error.h"

namespace shardlm {

PrefixMatch find_cached_prefix(const BlockPool& pool, std::span<const int32_t> tokens, BlockHash root) {
  PrefixMatch match;
  if (!pool.prefix_caching() || tokens.empty()) return match;
  const int32_t bs = pool.block_size();
  const int32_t n_full = static_cast<int32_t>((tokens.size() - 1) / bs);  // keep the last token uncached
  BlockHash parent = root;
  for (int32_t i = 0; i < n_full; ++i) {
    auto chunk = tokens.subspan(size_t(i) * bs, bs);
    BlockHash h = hash_block(parent, chunk);
    int32_t b = pool.find_cached(h, parent, chunk);
    if (b < 0) break;
    match.blocks.push_back(b);
    match.hashes.push_back(h);
    parent = h;
  }
  match.n_tokens = static_cast<int32_t>(match.blocks.size()) * bs;
  return match;
}

static int32_t blocks_for(int32_t n_slots, int32_t bs) { return (n_slots + bs - 1) / bs; }

int32_t n_blocks_needed(const BlockPool& pool, const BlockTable& table, int32_t n_total_slots,
                        const PrefixMatch* match) {
  int32_t have = static_cast<int32_t>(table.blocks.size());
  if (match && table.blocks.empty()) have = static_cast<int32_t>(match->blocks.size());
  return std::max(0, blocks_for(n_total_slots, pool.block_size()) - have);
}

// Adopted blocks wholly before n_first_kept are never read: not referenced.
static int32_t n_skipped(const BlockPool& pool, const PrefixMatch& match, int32_t n_first_kept) {
  return std::min(static_cast<int32_t>(match.blocks.size()), std::max(0, n_first_kept) / pool.block_size());
}

static bool adopts(const BlockTable& table, const PrefixMatch* match) {
  return match && !match->blocks.empty() && table.blocks.empty();
}

int32_t n_free_blocks_needed(const BlockPool& pool, const BlockTable& table, int32_t n_total_slots,
                             const PrefixMatch* match, int32_t n_first_kept) {
  const bool adopt = adopts(table, match);
  const int32_t n_new = n_blocks_needed(pool, table, n_total_slots, adopt ? match : nullptr);
  // Hit blocks sitting in the evictable list stop being free once referenced.
  int32_t n_revived = 0;
  if (adopt)
    for (size_t i = size_t(n_skipped(pool, *match, n_first_kept)); i < match->blocks.size(); ++i)
      n_revived += pool.ref_count(match->blocks[i]) == 0 ? 1 : 0;
  return n_new + n_revived;
}

bool allocate_slots(BlockPool& pool, BlockTable& table, int32_t n_total_slots, const PrefixMatch* match,
                    int32_t n_first_kept) {
  if (n_free_blocks_needed(pool, table, n_total_slots, match, n_first_kept) > pool.n_free()) return false;
  const bool adopt = adopts(table, match);
  const int32_t n_new = n_blocks_needed(pool, table, n_total_slots, adopt ? match : nullptr);
  if (adopt) {
    const int32_t n_skip = n_skipped(pool, *match, n_first_kept);
    table.blocks = match->blocks;
    for (int32_t i = 0; i < n_skip; ++i) table.blocks[size_t(i)] = kNoBlock;
    for (size_t i = size_t(n_skip); i < table.blocks.size(); ++i) pool.ref(table.blocks[i]);
    table.hashes = match->hashes;
    table.n_registered = static_cast<int32_t>(match->blocks.size());
    table.n_released = n_skip;
  }
  for (int32_t i = 0; i < n_new; ++i) table.blocks.push_back(pool.allocate());
  return true;
}

PrefixMatch find_window_prefix(const BlockPool& local_pool, const PrefixMatch& global,
                               std::span<const int32_t> tokens, int32_t window, BlockHash root) {
  const int32_t bs = local_pool.block_size();
  PrefixMatch local;
  if (!local_pool.prefix_caching()) return local;
  SHARDLM_CHECK(window > 0 && global.n_tokens % bs == 0 && size_t(global.n_tokens) <= tokens.size(),
                "window ", window, " hit ", global.n_tokens, " of ", tokens.size(), " tokens");
  // Longest first: M blocks qualify when blocks [first read / bs, M) are cached locally.
  for (int32_t m = static_cast<int32_t>(global.blocks.size()); m > 0; --m) {
    const int32_t first = first_position_read(m * bs, window) / bs;
    std::vector<int32_t> blocks(size_t(m), kNoBlock);
    bool all = true;
    for (int32_t i = first; i < m && all; ++i) {
      const BlockHash parent = i == 0 ? root : global.hashes[size_t(i) - 1];
      blocks[size_t(i)] = local_pool.find_cached(global.hashes[size_t(i)], parent, tokens.subspan(size_t(i) * bs, bs));
      all = blocks[size_t(i)] >= 0;
    }
    if (!all) continue;
    local.blocks = std::move(blocks);
    local.hashes.assign(global.hashes.begin(), global.hashes.begin() + m);
    local.n_tokens = m * bs;
    return local;
  }
  return local;
}

void register_computed(BlockPool& pool, BlockTable& table, std::span<const int32_t> tokens, int32_t n_computed,
                       BlockHash root) {
  const int32_t bs = pool.block_size();
  SHARDLM_CHECK(n_computed <= static_cast<int32_t>(tokens.size()) && n_computed <= table.n_slots(bs),
                "computed ", n_computed, " tokens ", tokens.size(), " slots ", table.n_slots(bs));
  const int32_t n_full = n_computed / bs;
  while (static_cast<int32_t>(table.hashes.size()) < n_full) {
    int32_t i = static_cast<int32_t>(table.hashes.size());
    BlockHash parent = i == 0 ? root : table.hashes[i - 1];
    table.hashes.push_back(hash_block(parent, tokens.subspan(size_t(i) * bs, bs)));
  }
  for (int32_t i = std::max(table.n_registered, table.n_released); i < n_full; ++i) {
    BlockHash parent = i == 0 ? root : table.hashes[i - 1];
    pool.register_cached(table.blocks[i], table.hashes[i], parent, tokens.subspan(size_t(i) * bs, bs));
  }
  table.n_registered = std::max(table.n_registered, n_full);
}

int32_t first_position_read(int32_t n_first_query, int32_t window) {
  return window > 0 ? std::max(0, n_first_query + 1 - window) : 0;
}

std::vector<int32_t> release_before(BlockPool& pool, BlockTable& table, int32_t n_first_kept) {
  std::vector<int32_t> released;
  const int32_t n_before = std::min(static_cast<int32_t>(table.blocks.size()), std::max(0, n_first_kept) / pool.block_size());
  for (int32_t i = table.n_released; i < n_before; ++i) {
    released.push_back(table.blocks[size_t(i)]);
    pool.unref(table.blocks[size_t(i)]);
    table.blocks[size_t(i)] = kNoBlock;
  }
  table.n_released = std::max(table.n_released, n_before);
  return released;
}

int64_t max_blocks_held(int64_t n_positions, int32_t block_size, int32_t window, int64_t max_chunk) {
  SHARDLM_CHECK(block_size > 0 && window >= 0 && max_chunk > 0, "block_size ", block_size, " window ", window,
                " max_chunk ", max_chunk);
  const int64_t whole = (std::max<int64_t>(0, n_positions) + block_size - 1) / block_size;
  if (window == 0) return whole;
  const int64_t span = int64_t(window) - 1 + std::min(max_chunk, std::max<int64_t>(1, n_positions));
  return std::min(whole, (span + block_size - 1) / block_size + 1);
}

void truncate_table(BlockPool& pool, BlockTable& table, int32_t n_slots) {
  const int32_t keep = std::max({blocks_for(n_slots, pool.block_size()), table.n_registered, table.n_released});
  while (static_cast<int32_t>(table.blocks.size()) > keep) {
    pool.unref(table.blocks.back());
    table.blocks.pop_back();
  }
  if (static_cast<int32_t>(table.hashes.size()) > keep) table.hashes.resize(size_t(keep));
}

void free_table(BlockPool& pool, BlockTable& table) {
  for (auto it = table.blocks.rbegin(); it != table.blocks.rend(); ++it)
    if (*it != kNoBlock) pool.unref(*it);
  table = BlockTable{};
}

}  // namespace shardlm
