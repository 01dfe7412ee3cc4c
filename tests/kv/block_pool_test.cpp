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


// Sliding window: a query at p reads [p + 1 - window, p].
TEST(SlidingWindow, FirstPositionRead) {
  EXPECT_EQ(first_position_read(0, 4), 0);
  EXPECT_EQ(first_position_read(3, 4), 0);
  EXPECT_EQ(first_position_read(4, 4), 1);
  EXPECT_EQ(first_position_read(10, 1), 10);
  EXPECT_EQ(first_position_read(10, 0), 0);  // no window: the whole past
}

TEST(SlidingWindow, ReleaseBeforeLeavesHolesAndKeepsCachedBlocksEvictable) {
  BlockPool pool(8, 4, /*enable_prefix_caching=*/true);
  BlockTable t;
  ASSERT_TRUE(allocate_slots(pool, t, 14));  // 4 blocks
  const std::vector<int32_t> tokens = iota_tokens(14);
  register_computed(pool, t, tokens, 12);  // blocks 0-2 full and cached
  const std::vector<int32_t> before = t.blocks;
  EXPECT_TRUE(release_before(pool, t, 3).empty());  // block 0 still holds position 3
  const std::vector<int32_t> out = release_before(pool, t, 8);  // 0-7 no longer read
  EXPECT_EQ(out, (std::vector<int32_t>{before[0], before[1]}));
  EXPECT_EQ(t.blocks, (std::vector<int32_t>{kNoBlock, kNoBlock, before[2], before[3]}));
  EXPECT_EQ(t.n_released, 2);
  EXPECT_EQ(t.n_held(), 2);
  EXPECT_EQ(pool.n_used(), 2);
  EXPECT_EQ(pool.n_evictable(), 2);  // cached: a later prompt with these tokens still hits them
  EXPECT_TRUE(release_before(pool, t, 5).empty());  // the window never moves back
  EXPECT_EQ(t.n_released, 2);
  // The prefix still hits from block 0, and truncate/free skip the holes.
  EXPECT_EQ(find_cached_prefix(pool, tokens).n_tokens, 12);
  truncate_table(pool, t, 0);
  EXPECT_EQ(t.blocks.size(), 3u);  // the registered blocks stay
  free_table(pool, t);
  EXPECT_EQ(pool.n_used(), 0);
  EXPECT_EQ(pool.n_free(), 8);
}

TEST(SlidingWindow, UncachedBlocksAreFreedAndRegisterSkipsHoles) {
  BlockPool pool(6, 4, /*enable_prefix_caching=*/false);
  BlockTable t;
  ASSERT_TRUE(allocate_slots(pool, t, 16));
  const std::vector<int32_t> tokens = iota_tokens(20);
  register_computed(pool, t, tokens, 9);
  EXPECT_EQ(release_before(pool, t, 9).size(), 2u);
  EXPECT_EQ(pool.n_free(), 4);
  EXPECT_EQ(pool.n_evictable(), 0);
  ASSERT_TRUE(allocate_slots(pool, t, 20));
  register_computed(pool, t, tokens, 20);  // would reach the holes' block ids if it did not skip them
  EXPECT_EQ(t.n_registered, 5);
  free_table(pool, t);
  EXPECT_EQ(pool.n_free(), 6);
}

TEST(SlidingWindow, AdoptedPrefixReferencesOnlyBlocksFromTheFirstKeptPosition) {
  BlockPool pool(8, 4, /*enable_prefix_caching=*/true);
  const std::vector<int32_t> tokens = iota_tokens(17);
  BlockTable a;
  ASSERT_TRUE(allocate_slots(pool, a, 17));
  register_computed(pool, a, tokens, 17);
  free_table(pool, a);  // 4 cached blocks, all evictable
  EXPECT_EQ(pool.n_used(), 0);
  PrefixMatch m = find_cached_prefix(pool, tokens);
  ASSERT_EQ(m.n_tokens, 16);
  BlockTable b;
  // The query at 16 with a window of 6 reads from 11: blocks 0 and 1 are not referenced.
  ASSERT_TRUE(allocate_slots(pool, b, 17, &m, first_position_read(16, 6)));
  EXPECT_EQ(b.blocks, (std::vector<int32_t>{kNoBlock, kNoBlock, m.blocks[2], m.blocks[3], b.blocks[4]}));
  EXPECT_EQ(b.n_released, 2);
  EXPECT_EQ(b.n_registered, 4);
  EXPECT_EQ(pool.ref_count(m.blocks[0]), 0);
  EXPECT_EQ(pool.ref_count(m.blocks[2]), 1);
  EXPECT_EQ(pool.n_used(), 3);
  free_table(pool, b);
  EXPECT_EQ(pool.n_used(), 0);
  // All-or-nothing counts only the revived blocks in the window: 1 revived + 1 fresh.
  BlockPool tight(4, 4, true);
  BlockTable c;
  ASSERT_TRUE(allocate_slots(tight, c, 13));
  register_computed(tight, c, tokens, 13);
  free_table(tight, c);
  PrefixMatch m2 = find_cached_prefix(tight, std::span<const int32_t>(tokens).first(13));
  ASSERT_EQ(m2.n_tokens, 12);
  BlockTable d;
  BlockTable hog;
  ASSERT_TRUE(allocate_slots(tight, hog, 4));  // takes the never-cached block
  EXPECT_FALSE(allocate_slots(tight, d, 13, &m2));  // without a window: 3 revived + 1 fresh > 3 free
  EXPECT_TRUE(d.blocks.empty());
  ASSERT_TRUE(allocate_slots(tight, d, 13, &m2, first_position_read(12, 5)));  // reads from 8: block 2 only
  EXPECT_EQ(d.n_held(), 2);
  EXPECT_EQ(tight.n_free(), 1);
}

TEST(SlidingWindow, MaxBlocksHeld) {
  EXPECT_EQ(max_blocks_held(100, 4, 0, 16), 25);   // no window: every position's block
  EXPECT_EQ(max_blocks_held(100, 4, 8, 16), 7);    // ceil((8 - 1 + 16) / 4) + 1
  EXPECT_EQ(max_blocks_held(10, 4, 8, 16), 3);     // never more than the whole sequence
  EXPECT_EQ(max_blocks_held(4096, 16, 4096, 2048), 256);
  EXPECT_EQ(max_blocks_held(32768, 16, 4096, 2048), 385);  // Mistral v0.1: ceil(6143 / 16) + 1
  EXPECT_EQ(max_blocks_held(0, 16, 4096, 2048), 0);
}

// Hybrid models: a prefix hit needs, in the local layers' pool, the blocks
// of its first query's window, cached under the global chain's hashes.
TEST(HybridKv, FindWindowPrefixCutsTheHitToTheLocalBlocksCached) {
  const std::vector<int32_t> tokens = iota_tokens(21);
  BlockPool global(16, 4);
  BlockTable g;
  ASSERT_TRUE(allocate_slots(global, g, 21));
  register_computed(global, g, tokens, 21);
  const PrefixMatch hit = find_cached_prefix(global, tokens);
  ASSERT_EQ(hit.n_tokens, 20);
  // Only blocks 1 and 2 (positions 4 .. 11) are cached in the local pool, unreferenced.
  BlockPool local(16, 4);
  int32_t lb[5] = {-1, -1, -1, -1, -1};
  for (int32_t i : {1, 2}) {
    lb[i] = local.allocate();
    local.register_cached(lb[i], g.hashes[size_t(i)], g.hashes[size_t(i) - 1],
                          std::span<const int32_t>(tokens).subspan(size_t(i) * 4, 4));
    local.unref(lb[i]);
  }
  // Window 6: 20 reads from 15 (block 3: missing), 16 from 11 (3 missing), 12 from 7 (blocks 1, 2).
  PrefixMatch m = find_window_prefix(local, hit, tokens, 6);
  EXPECT_EQ(m.n_tokens, 12);
  EXPECT_EQ(m.blocks, (std::vector<int32_t>{kNoBlock, lb[1], lb[2]}));
  EXPECT_EQ(m.hashes, std::vector<BlockHash>(hit.hashes.begin(), hit.hashes.begin() + 3));
  // Window 2: 12 reads from 11, block 2 only.
  m = find_window_prefix(local, hit, tokens, 2);
  EXPECT_EQ(m.blocks, (std::vector<int32_t>{kNoBlock, kNoBlock, lb[2]}));
  // Window 13: every hit length reads block 0, which is not cached.
  m = find_window_prefix(local, hit, tokens, 13);
  EXPECT_EQ(m.n_tokens, 0);
  EXPECT_TRUE(m.blocks.empty());

  // Adopting the window-6 match for 16 slots: blocks 1, 2 revived, one fresh.
  m = find_window_prefix(local, hit, tokens, 6);
  BlockTable l;
  const int32_t kept = first_position_read(m.n_tokens, 6);  // 7
  EXPECT_EQ(n_free_blocks_needed(local, l, 16, &m, kept), 3);
  EXPECT_EQ(n_blocks_needed(local, l, 16, &m), 1);
  const int32_t n_free = local.n_free();
  ASSERT_TRUE(allocate_slots(local, l, 16, &m, kept));
  EXPECT_EQ(local.n_free(), n_free - 3);
  EXPECT_EQ(l.blocks[0], kNoBlock);
  EXPECT_EQ(l.n_released, 1);
  EXPECT_EQ(local.ref_count(lb[1]), 1);
  EXPECT_EQ(local.ref_count(lb[2]), 1);
  // allocate_slots fails exactly when n_free_blocks_needed exceeds the free blocks.
  BlockPool tiny(2, 4);
  BlockTable t;
  EXPECT_EQ(n_free_blocks_needed(tiny, t, 9), 3);
  EXPECT_FALSE(allocate_slots(tiny, t, 9));
  EXPECT_EQ(tiny.n_free(), 2);
  EXPECT_TRUE(allocate_slots(tiny, t, 8));
}

}  // namespace
}  // namespace shardlm
