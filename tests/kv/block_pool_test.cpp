#include <gtest/gtest.h>

#include <numeric>
#include <set>

#include "core/error.h"
#include "kv/block_pool.h"
#include "kv/block_table.h"

namespace shardlm {
namespace {

std::vector<int32_t> iota_tokens(int32_t n, int32_t start = 100) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), start);
  return t;
}

TEST(BlockPool, AllocateFreeRefCount) {
  BlockPool pool(4, 16);
  EXPECT_EQ(pool.n_free(), 4);
  std::set<int32_t> got;
  for (int i = 0; i < 4; ++i) got.insert(pool.allocate());
  EXPECT_EQ(got.size(), 4u);
  EXPECT_EQ(pool.n_free(), 0);
  EXPECT_DOUBLE_EQ(pool.usage(), 1.0);
  EXPECT_THROW(pool.allocate(), Error);
  int32_t b = *got.begin();
  pool.ref(b);
  EXPECT_EQ(pool.ref_count(b), 2);
  pool.unref(b);
  EXPECT_EQ(pool.n_free(), 0);
  pool.unref(b);
  EXPECT_EQ(pool.n_free(), 1);
  EXPECT_THROW(pool.unref(b), Error);  // double free is a bug, caught
  EXPECT_EQ(pool.allocate(), b);
  EXPECT_THROW(BlockPool(0, 16), Error);
}

TEST(BlockTable, AllocateSlotsAllOrNothing) {
  BlockPool pool(3, 4);
  BlockTable t;
  EXPECT_TRUE(allocate_slots(pool, t, 5));  // 2 blocks
  EXPECT_EQ(t.blocks.size(), 2u);
  EXPECT_TRUE(allocate_slots(pool, t, 8));  // still 2
  EXPECT_EQ(t.blocks.size(), 2u);
  BlockTable u;
  EXPECT_FALSE(allocate_slots(pool, u, 8));  // needs 2, 1 free
  EXPECT_TRUE(u.blocks.empty());
  EXPECT_EQ(pool.n_free(), 1);
  free_table(pool, t);
  EXPECT_EQ(pool.n_free(), 3);
  EXPECT_TRUE(t.blocks.empty());
}

TEST(PrefixCache, ReuseAcrossSequencesAndCountTokens) {
  BlockPool pool(8, 4);
  auto prompt = iota_tokens(10);  // 2 full blocks + 2 tokens
  BlockTable a;
  PrefixMatch m0 = find_cached_prefix(pool, prompt);
  EXPECT_EQ(m0.n_tokens, 0);
  ASSERT_TRUE(allocate_slots(pool, a, 10, &m0));
  register_computed(pool, a, prompt, 10);
  EXPECT_EQ(pool.n_cached(), 2);  // the partial block is not cached

  // Same prompt: both full blocks hit and are shared.
  PrefixMatch m1 = find_cached_prefix(pool, prompt);
  EXPECT_EQ(m1.n_tokens, 8);
  BlockTable b;
  ASSERT_TRUE(allocate_slots(pool, b, 10, &m1));
  pool.record_lookup(10, m1.n_tokens);
  EXPECT_EQ(b.blocks[0], a.blocks[0]);
  EXPECT_EQ(b.blocks[1], a.blocks[1]);
  EXPECT_NE(b.blocks[2], a.blocks[2]);
  EXPECT_EQ(pool.ref_count(a.blocks[0]), 2);
  EXPECT_EQ(pool.stats().n_hit_tokens, 8);
  EXPECT_EQ(pool.stats().n_query_tokens, 10);

  // A prompt of exactly 8 tokens keeps its last token uncached: 1 block hit.
  PrefixMatch m2 = find_cached_prefix(pool, std::span(prompt).first(8));
  EXPECT_EQ(m2.n_tokens, 4);
  // Different second block: only the first matches (chained hashes).
  auto other = prompt;
  other[5] = 7;
  EXPECT_EQ(find_cached_prefix(pool, other).n_tokens, 4);
  // Different first block: nothing, even though block 2 has the same tokens.
  other = prompt;
  other[0] = 7;
  EXPECT_EQ(find_cached_prefix(pool, other).n_tokens, 0);

  free_table(pool, a);
  free_table(pool, b);
  EXPECT_EQ(pool.n_free(), 8);
  EXPECT_EQ(pool.n_evictable(), 2);
  EXPECT_DOUBLE_EQ(pool.usage(), 0.0);
  // Still cached after every sequence let go.
  EXPECT_EQ(find_cached_prefix(pool, prompt).n_tokens, 8);
}

TEST(PrefixCache, EvictsLeastRecentlyUsedOnlyWhenNeeded) {
  BlockPool pool(4, 2);
  auto p1 = std::vector<int32_t>{1, 2, 3, 4, 9};  // blocks [1,2] [3,4]
  auto p2 = std::vector<int32_t>{5, 6, 7, 8, 9};  // blocks [5,6] [7,8]
  BlockTable a, b;
  ASSERT_TRUE(allocate_slots(pool, a, 4));
  register_computed(pool, a, p1, 4);
  free_table(pool, a);  // p1 blocks evictable, older
  ASSERT_TRUE(allocate_slots(pool, b, 4));  // uses the 2 never-cached blocks: nothing evicted
  EXPECT_EQ(pool.stats().n_evictions, 0);
  register_computed(pool, b, p2, 4);
  free_table(pool, b);
  EXPECT_EQ(find_cached_prefix(pool, p1).n_tokens, 4);
  EXPECT_EQ(find_cached_prefix(pool, p2).n_tokens, 4);

  // Touch p1 (hit then release): p2 becomes the LRU prefix.
  PrefixMatch m = find_cached_prefix(pool, p1);
  BlockTable c;
  ASSERT_TRUE(allocate_slots(pool, c, 4, &m));
  free_table(pool, c);

  BlockTable d;
  ASSERT_TRUE(allocate_slots(pool, d, 2));  // one fresh block: evicts p2's tail block first
  EXPECT_EQ(pool.stats().n_evictions, 1);
  EXPECT_EQ(find_cached_prefix(pool, p1).n_tokens, 4);
  EXPECT_EQ(find_cached_prefix(pool, p2).n_tokens, 2);
  ASSERT_TRUE(allocate_slots(pool, d, 4));
  EXPECT_EQ(find_cached_prefix(pool, p2).n_tokens, 0);
  EXPECT_EQ(find_cached_prefix(pool, p1).n_tokens, 4);
}

TEST(PrefixCache, HitOnEvictableBlockCountsAgainstFreeBlocks) {
  BlockPool pool(2, 2);
  std::vector<int32_t> p{1, 2, 3};
  BlockTable a;
  ASSERT_TRUE(allocate_slots(pool, a, 2));
  register_computed(pool, a, p, 2);
  free_table(pool, a);
  BlockTable other;
  ASSERT_TRUE(allocate_slots(pool, other, 1));  // takes the only never-cached block
  PrefixMatch m = find_cached_prefix(pool, p);
  ASSERT_EQ(m.n_tokens, 2);
  BlockTable b;
  // Needs the revived hit block + 1 fresh: only 1 free. Must fail cleanly.
  EXPECT_FALSE(allocate_slots(pool, b, 3, &m));
  EXPECT_EQ(pool.n_evictable(), 1);
  free_table(pool, other);
  EXPECT_TRUE(allocate_slots(pool, b, 3, &m));
  EXPECT_EQ(b.blocks[0], m.blocks[0]);
}

TEST(PrefixCache, DisabledNeverHits) {
  BlockPool pool(4, 2, /*enable_prefix_caching=*/false);
  std::vector<int32_t> p{1, 2, 3};
  BlockTable a;
  ASSERT_TRUE(allocate_slots(pool, a, 3));
  register_computed(pool, a, p, 3);
  EXPECT_EQ(find_cached_prefix(pool, p).n_tokens, 0);
  free_table(pool, a);
  EXPECT_EQ(pool.n_evictable(), 0);
}

TEST(PrefixCache, SameTokensAtAnotherPositionDoNotHit) {
  BlockPool pool(8, 2);
  std::vector<int32_t> x{1, 2, 3, 4, 9};  // cached blocks [1,2] [3,4]
  BlockTable a;
  ASSERT_TRUE(allocate_slots(pool, a, 4));
  register_computed(pool, a, x, 4);
  // [1,2] [1,2]: the second block's tokens are cached, but at position 0 only.
  std::vector<int32_t> y{1, 2, 1, 2, 9};
  EXPECT_EQ(find_cached_prefix(pool, y).n_tokens, 2);
}

TEST(PrefixCache, HashChainsParent) {
  std::vector<int32_t> t{1, 2};
  EXPECT_NE(hash_block(kRootBlockHash, t), hash_block(hash_block(kRootBlockHash, t), t));
  EXPECT_EQ(hash_block(7, t), hash_block(7, t));
}

// Speculative rollback: trailing blocks past n_slots go back to the pool,
// registered (cached) ones never.
TEST(BlockTable, TruncateFreesTheTailButNoRegisteredBlock) {
  BlockPool pool(8, 4, /*enable_prefix_caching=*/true);
  BlockTable t;
  ASSERT_TRUE(allocate_slots(pool, t, 14));  // 4 blocks
  std::vector<int32_t> tokens(14);
  for (int32_t i = 0; i < 14; ++i) tokens[size_t(i)] = i;
  register_computed(pool, t, tokens, 9);     // blocks 0, 1 full and registered
  truncate_table(pool, t, 10);               // positions 0..9 stay: 3 blocks
  EXPECT_EQ(t.blocks.size(), 3u);
  EXPECT_EQ(pool.n_used(), 3);
  truncate_table(pool, t, 1);                // never below the 2 registered blocks
  EXPECT_EQ(t.blocks.size(), 2u);
  EXPECT_EQ(t.n_registered, 2);
  free_table(pool, t);
  EXPECT_EQ(pool.n_used(), 0);
}

}  // namespace
}  // namespace shardlm
