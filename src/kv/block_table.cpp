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

bool allocate_slots(BlockPool& pool, BlockTable& table, int32_t n_total_slots, const PrefixMatch* match) {
  const bool adopt = match && !match->blocks.empty() && table.blocks.empty();
  int32_t n_new = n_blocks_needed(pool, table, n_total_slots, adopt ? match : nullptr);
  // Hit blocks sitting in the evictable list stop being free once referenced.
  int32_t n_revived = 0;
  if (adopt)
    for (int32_t b : match->blocks) n_revived += pool.ref_count(b) == 0 ? 1 : 0;
  if (n_new + n_revived > pool.n_free()) return false;
  if (adopt) {
    for (int32_t b : match->blocks) pool.ref(b);
    table.blocks = match->blocks;
    table.hashes = match->hashes;
    table.n_registered = static_cast<int32_t>(match->blocks.size());
  }
  for (int32_t i = 0; i < n_new; ++i) table.blocks.push_back(pool.allocate());
  return true;
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
  for (int32_t i = table.n_registered; i < n_full; ++i) {
    BlockHash parent = i == 0 ? root : table.hashes[i - 1];
    pool.register_cached(table.blocks[i], table.hashes[i], parent, tokens.subspan(size_t(i) * bs, bs));
  }
  table.n_registered = std::max(table.n_registered, n_full);
}

void truncate_table(BlockPool& pool, BlockTable& table, int32_t n_slots) {
  const int32_t keep = std::max(blocks_for(n_slots, pool.block_size()), table.n_registered);
  while (static_cast<int32_t>(table.blocks.size()) > keep) {
    pool.unref(table.blocks.back());
    table.blocks.pop_back();
  }
  if (static_cast<int32_t>(table.hashes.size()) > keep) table.hashes.resize(size_t(keep));
}

void free_table(BlockPool& pool, BlockTable& table) {
  for (auto it = table.blocks.rbegin(); it != table.blocks.rend(); ++it) pool.unref(*it);
  table = BlockTable{};
}

}  // namespace shardlm
