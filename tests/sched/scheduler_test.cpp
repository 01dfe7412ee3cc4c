#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <map>
#include <numeric>
#include <set>

#include "core/error.h"
#include "sched/scheduler.h"

namespace shardlm {
namespace {

std::vector<int32_t> prompt_of(int32_t n, int32_t start) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), start);
  return t;
}

// Drives a Scheduler like the engine does, with a simulated paged KV store:
// each step writes the chunk's token ids into the slots its block table names,
// and the "model" output for a sequence is a function of the token ids it reads
// back from those slots. Wrong block bookkeeping (a stale prefix hit, a block
// written by two sequences, a preempted sequence recomputed wrongly) changes
// the outputs. Also checks every plan's invariants.
class Driver {
 public:
  explicit Driver(const SchedulerConfig& c)
      : sched(c), kv(size_t(c.n_blocks) * c.block_size, -1), local_kv(size_t(c.n_local_blocks) * c.block_size, -1) {}

  void add(SeqId id, std::vector<int32_t> prompt, int32_t max_new, SeqId after = -1,
           BlockHash root = kRootBlockHash, bool prompt_logits = false) {
    sched.add(id, prompt, max_new, after, root, prompt_logits);
    max_new_[id] = max_new;
  }

  // Returns the plan after committing it.
  StepPlan step() {
    launch(/*keep_empty=*/true);
    return land();
  }

  // Schedules a plan and "runs" it at once (writes its KV slots, computes its
  // samples) the way a pipeline stage does, in schedule order; land()
  // commits the oldest one. Returns false for an empty plan (then not kept
  // unless keep_empty).
  bool launch(bool keep_empty = false) {
    StepPlan plan = sched.schedule();
    const auto& c = sched.config();
    EXPECT_LE(plan.n_scheduled_tokens, c.max_num_batched_tokens);
    EXPECT_LE(int32_t(plan.seqs.size()), c.max_num_seqs);
    std::map<int32_t, SeqId> writer;  // block -> sequence writing into it this step
    std::map<int32_t, SeqId> local_writer;  // the same in the local layers' pool
    int32_t sum = 0;
    for (const auto& s : plan.seqs) {
      sum += s.n_tokens;
      EXPECT_EQ(int32_t(s.token_ids.size()), s.n_tokens);
      EXPECT_GE(int32_t(s.block_table.size()) * c.block_size, s.n_past + s.n_tokens);
      for (int32_t p = s.n_past; p < s.n_past + s.n_tokens; ++p) {
        int32_t b = s.block_table[p / c.block_size];
        auto [it, fresh] = writer.emplace(b, s.seq_id);
        EXPECT_TRUE(fresh || it->second == s.seq_id) << "block " << b << " written by two sequences";
        EXPECT_EQ(sched.pool().is_cached(b), false) << "writing into a cached block " << b;
      }
      // Hybrid: the local table covers the same positions, and the same rules hold in its pool.
      if (const BlockPool* lp = sched.local_pool()) {
        EXPECT_EQ(s.local_block_table.size(), s.block_table.size()) << "seq " << s.seq_id;
        for (int32_t p = s.n_past; p < s.n_past + s.n_tokens; ++p) {
          int32_t b = s.local_block_table[p / c.block_size];
          EXPECT_NE(b, kNoBlock) << "seq " << s.seq_id << " writes position " << p << " into a released local block";
          if (b == kNoBlock) continue;
          auto [it, fresh] = local_writer.emplace(b, s.seq_id);
          EXPECT_TRUE(fresh || it->second == s.seq_id) << "local block " << b << " written by two sequences";
          EXPECT_EQ(lp->is_cached(b), false) << "writing into a cached local block " << b;
        }
      } else {
        EXPECT_TRUE(s.local_block_table.empty());
      }
    }
    EXPECT_EQ(sum, plan.n_scheduled_tokens);
    for (int32_t b : plan.freed_blocks) EXPECT_NE(b, kNoBlock) << "a preemption reports a hole as freed";
    n_preempted_with_holes += std::count_if(plan.preempted.begin(), plan.preempted.end(), [&](SeqId id) {
      return slid_.count(id) != 0;
    });
    for (const auto& s : plan.seqs)
      if (!s.block_table.empty() && s.block_table[0] == kNoBlock) slid_.insert(s.seq_id);
    // Blocks referenced by several sequences must be read-only for all of them.
    std::map<int32_t, int> n_users;
    for (const auto& s : plan.seqs)
      for (int32_t b : s.block_table) ++n_users[b];
    for (const auto& [b, n] : n_users)
      if (n > 1) {
        EXPECT_FALSE(writer.count(b)) << "shared block " << b << " is written";
      }
    // Nothing in flight is scheduled again, and no block an in-flight plan
    // uses is handed to another sequence to write.
    for (const auto& f : in_flight_)
      for (const auto& fs : f.plan.seqs) {
        for (const auto& s : plan.seqs) EXPECT_NE(s.seq_id, fs.seq_id) << "sequence scheduled twice in flight";
        for (int32_t b : fs.block_table) {
          auto w = writer.find(b);
          EXPECT_TRUE(w == writer.end() || w->second == fs.seq_id) << "block " << b << " of an in-flight plan reused";
        }
        for (int32_t b : fs.local_block_table) {
          auto w = local_writer.find(b);
          EXPECT_TRUE(b == kNoBlock || w == local_writer.end() || w->second == fs.seq_id)
              << "local block " << b << " of an in-flight plan reused";
        }
      }

    std::vector<int32_t> sampled(plan.seqs.size(), -1);
    for (size_t k = 0; k < plan.seqs.size(); ++k) {
      const auto& s = plan.seqs[k];
      for (int32_t i = 0; i < s.n_tokens; ++i) slot(s, s.n_past + i) = s.token_ids[i];
      if (!s.local_block_table.empty())
        for (int32_t i = 0; i < s.n_tokens; ++i) local_slot(s, s.n_past + i) = s.token_ids[i] * 3 + 1;
      // Hybrid rows also read the local window from the local table.
      if (local_read_window > 0)
        for (int32_t p = s.n_past; p < s.n_past + s.n_tokens; ++p)
          for (int32_t j = first_position_read(p, local_read_window); j <= p; ++j) {
            const auto& t = s.local_block_table.empty() ? s.block_table : s.local_block_table;
            EXPECT_NE(t[size_t(j / c.block_size)], kNoBlock)
                << "seq " << s.seq_id << ": the row at " << p << " reads local position " << j
                << " from a released block";
          }
      // Every row reads the keys of its window (read_window; 0: its whole
      // past): none of them may sit in a released block.
      for (int32_t p = s.n_past; p < s.n_past + s.n_tokens; ++p)
        for (int32_t j = first_position_read(p, read_window); j <= p; ++j)
          EXPECT_NE(s.block_table[size_t(j / c.block_size)], kNoBlock)
              << "seq " << s.seq_id << ": the row at " << p << " reads position " << j << " from a released block";
      if (s.need_logits) {
        const int32_t last = s.n_past + s.n_tokens - 1;
        uint64_t h = 1469598103934665603ULL;
        for (int32_t p = first_position_read(last, read_window); p <= last; ++p)
          h = (h ^ uint64_t(slot(s, p) + 7)) * 1099511628211ULL;
        // The local layers: their own slots (token * 3 + 1), or the shared table's.
        if (local_read_window > 0)
          for (int32_t p = first_position_read(last, local_read_window); p <= last; ++p)
            h = (h ^ uint64_t((s.local_block_table.empty() ? slot(s, p) * 3 + 1 : local_slot(s, p)) + 11)) *
                1099511628211ULL;
        sampled[k] = int32_t(h % 1000);
      }
    }
    max_blocks_used = std::max(max_blocks_used, sched.pool().n_used());
    max_local_blocks_used = std::max(max_local_blocks_used, sched.stats().n_local_blocks_used);
    if (plan.empty() && !keep_empty) return false;
    in_flight_.push_back({std::move(plan), std::move(sampled)});
    return true;
  }

  StepPlan land() {
    EXPECT_FALSE(in_flight_.empty());
    InFlight f = std::move(in_flight_.front());
    in_flight_.pop_front();
    const StepPlan& plan = f.plan;
    sched.commit(plan, f.sampled);
    for (size_t k = 0; k < plan.seqs.size(); ++k) {
      if (f.sampled[k] < 0) continue;
      SeqId id = plan.seqs[k].seq_id;
      if (!max_new_.count(id)) continue;  // finished by the test while in flight
      outputs[id].push_back(f.sampled[k]);
      if (int32_t(outputs[id].size()) == max_new_[id]) sched.finish(id);
    }
    return f.plan;
  }

  // Keeps up to `depth` plans in flight, like the engine over a pipeline.
  void run(int depth = 1, int max_steps = 10000) {
    for (int i = 0; i < max_steps && !(sched.idle() && in_flight_.empty()); ++i) {
      while (int(in_flight_.size()) < depth && launch()) {
      }
      if (!in_flight_.empty()) land();
    }
    ASSERT_TRUE(sched.idle());
    ASSERT_TRUE(in_flight_.empty());
  }

  // The test ends a sequence itself (an abort): no more outputs are recorded.
  void abort(SeqId id) {
    sched.finish(id);
    max_new_.erase(id);
  }
  size_t n_in_flight() const { return in_flight_.size(); }

  Scheduler sched;
  std::map<SeqId, std::vector<int32_t>> outputs;
  // The "model" attends to this many positions (kv's first_position_read);
  // sched's config may free the blocks before them (sliding_window) or not.
  int32_t read_window = 0;
  int32_t max_blocks_used = 0;  // pool blocks in use after any schedule()
  // Hybrid: the local layers attend to this many positions, read from
  // local_block_table when the scheduler keeps one, else from block_table.
  int32_t local_read_window = 0;
  int32_t max_local_blocks_used = 0;  // SchedulerStats::n_local_blocks_used after any schedule()
  int64_t n_preempted_with_holes = 0;  // preemptions of a sequence whose window had slid

 private:
  int32_t& slot(const ScheduledSeq& s, int32_t pos) {
    const int32_t bs = sched.config().block_size;
    const int32_t b = s.block_table[size_t(pos / bs)];
    if (b == kNoBlock) {  // reported by launch(); a stand-in slot keeps the run going
      static int32_t hole = -2;
      return hole;
    }
    return kv[size_t(b) * bs + pos % bs];
  }
  int32_t& local_slot(const ScheduledSeq& s, int32_t pos) {
    const int32_t bs = sched.config().block_size;
    const int32_t b = s.local_block_table[size_t(pos / bs)];
    if (b == kNoBlock) {  // reported by launch()
      static int32_t hole = -2;
      return hole;
    }
    return local_kv[size_t(b) * bs + pos % bs];
  }
  struct InFlight {
    StepPlan plan;
    std::vector<int32_t> sampled;
  };
  std::set<SeqId> slid_;    // sequences seen with a released block
  std::vector<int32_t> kv;  // [n_blocks * block_size] token id stored at each slot
  std::vector<int32_t> local_kv;  // [n_local_blocks * block_size] token id * 3 + 1 (hybrid)
  std::map<SeqId, int32_t> max_new_;
  std::deque<InFlight> in_flight_;
};

SchedulerConfig small_config() {
  SchedulerConfig c;
  c.n_blocks = 64;
  c.block_size = 4;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 16;
  c.max_model_len = 128;
  return c;
}

TEST(Scheduler, RejectsRequestsThatCanNeverFit) {
  SchedulerConfig c = small_config();
  try {
    Scheduler::check_fits(c, 100, 29);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("129 tokens (100 prompt + 29 max_tokens)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("128"), std::string::npos);
  }
  c.n_blocks = 8;  // 32 slots
  EXPECT_NO_THROW(Scheduler::check_fits(c, 30, 3));  // 32 slots: the last token's KV is never stored
  try {
    Scheduler::check_fits(c, 30, 4);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("9 KV blocks"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("has 8 blocks"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Scheduler::check_fits(c, 0, 4), Error);
  EXPECT_THROW(Scheduler::check_fits(c, 4, 0), Error);
  Scheduler s(c);
  EXPECT_THROW(s.add(1, prompt_of(30, 0), 4), Error);
  EXPECT_TRUE(s.idle());
}

TEST(Scheduler, ChunkedPrefillSharesStepsWithDecodes) {
  Driver d(small_config());
  d.add(1, prompt_of(3, 0), 20);
  d.step();  // prompt of seq 1
  d.add(2, prompt_of(50, 100), 2);
  int steps_with_both = 0, n_chunks = 0;
  for (int i = 0; i < 20 && d.sched.has(2); ++i) {
    StepPlan p = d.step();
    std::set<SeqId> ids;
    for (auto& s : p.seqs) {
      ids.insert(s.seq_id);
      if (s.seq_id == 1) {
        EXPECT_EQ(s.n_tokens, 1);  // decode
      }
      if (s.seq_id == 2 && s.n_tokens > 1) ++n_chunks;
    }
    if (ids.count(1) && ids.count(2)) ++steps_with_both;
    EXPECT_LE(p.n_scheduled_tokens, 16);
  }
  EXPECT_GE(n_chunks, 4);  // 50 tokens at <= 15 per step
  EXPECT_GE(steps_with_both, 4);
  d.run();
  EXPECT_EQ(d.outputs[2].size(), 2u);
  EXPECT_EQ(d.outputs[1].size(), 20u);
}

TEST(Scheduler, RespectsMaxNumSeqs) {
  SchedulerConfig c = small_config();
  c.max_num_seqs = 3;
  c.max_num_batched_tokens = 100;
  Driver d(c);
  for (int i = 0; i < 7; ++i) d.add(i, prompt_of(2, i * 10), 3);
  StepPlan p = d.step();
  EXPECT_EQ(p.seqs.size(), 3u);
  EXPECT_EQ(d.sched.n_waiting(), 4);
  d.run();
  EXPECT_EQ(d.outputs.size(), 7u);
}

std::map<SeqId, std::vector<int32_t>> run_workload(SchedulerConfig c, int64_t* n_preempt, int depth = 1) {
  Driver d(c);
  for (int i = 0; i < 6; ++i) d.add(i, prompt_of(5 + 3 * i, 1000 * i), 24);
  d.run(depth);
  *n_preempt = d.sched.stats().n_preemptions;
  EXPECT_EQ(d.sched.pool().n_used(), 0);
  return d.outputs;
}

TEST(Scheduler, PreemptionUnderTinyPoolGivesIdenticalOutputs) {
  SchedulerConfig big = small_config();
  big.n_blocks = 256;
  int64_t n0 = 0, n1 = 0;
  auto ref = run_workload(big, &n0);
  EXPECT_EQ(n0, 0);
  SchedulerConfig tiny = small_config();
  tiny.n_blocks = 12;  // 48 slots; the largest sequence needs 44
  auto got = run_workload(tiny, &n1);
  EXPECT_GT(n1, 0);
  EXPECT_EQ(ref, got);
  tiny.enable_prefix_caching = false;
  auto got2 = run_workload(tiny, &n1);
  EXPECT_GT(n1, 0);
  EXPECT_EQ(ref, got2);
}

// cache_salt: a request shares cached blocks only with requests of the same
// salt, so cached_tokens cannot tell one user what another sent.
TEST(Scheduler, CacheSaltSeparatesPrefixCaches) {
  Driver d(small_config());
  auto p = prompt_of(13, 500);  // 3 full blocks of 4 + 1
  // The hit is known once the sequence is admitted (its first step).
  auto hit_of = [&](SeqId id, BlockHash root) {
    d.add(id, p, 2, -1, root);
    d.step();
    const int32_t hit = d.sched.n_prefix_hit_tokens(id);
    d.run();
    return hit;
  };
  EXPECT_EQ(hit_of(1, cache_root("alice")), 0);
  EXPECT_EQ(hit_of(2, cache_root("bob")), 0) << "bob's request hit alice's cached blocks";
  EXPECT_EQ(hit_of(3, kRootBlockHash), 0) << "an unsalted request hit a salted one's blocks";
  EXPECT_EQ(hit_of(4, cache_root("alice")), 12);
  EXPECT_EQ(hit_of(5, kRootBlockHash), 12);
  EXPECT_EQ(d.outputs[1], d.outputs[4]);
  EXPECT_EQ(d.outputs[1], d.outputs[2]);
  EXPECT_EQ(cache_root(""), kRootBlockHash);
  EXPECT_NE(cache_root("alice"), cache_root("bob"));
}

// LongRoPE: a prompt longer than long_context_after is computed with the
// long factors at every position, so its blocks hold other KV than a shorter
// prompt's of the same tokens: it neither takes nor leaves them for one, and
// every chunk it schedules says so (ScheduledSeq::long_context).
TEST(Scheduler, LongContextPromptsCacheOnTheirOwnChain) {
  SchedulerConfig c = small_config();
  c.long_context_after = 13;
  Driver d(c);
  const auto p = prompt_of(13, 500);  // 3 full blocks of 4 + 1: not longer
  auto longer = p;
  longer.push_back(7);  // 14 tokens: longer
  auto hit_of = [&](SeqId id, const std::vector<int32_t>& prompt, bool long_context) {
    d.add(id, prompt, 2);
    const StepPlan first = d.step();
    for (const ScheduledSeq& s : first.seqs) EXPECT_EQ(s.long_context, long_context) << "sequence " << id;
    const int32_t hit = d.sched.n_prefix_hit_tokens(id);
    d.run();
    return hit;
  };
  EXPECT_EQ(hit_of(1, p, false), 0);
  EXPECT_EQ(hit_of(2, longer, true), 0) << "a long-context prompt took a short one's cached blocks";
  EXPECT_EQ(hit_of(3, longer, true), 12);
  EXPECT_EQ(hit_of(4, p, false), 12);
  EXPECT_NE(long_context_root(kRootBlockHash), kRootBlockHash);
  EXPECT_NE(long_context_root(cache_root("alice")), long_context_root(kRootBlockHash));
}

TEST(Scheduler, PrefixHitSkipsCachedTokens) {
  Driver d(small_config());
  auto p = prompt_of(13, 500);  // 3 full blocks of 4 + 1
  d.add(1, p, 2);
  d.run();
  d.add(2, p, 2);
  StepPlan plan = d.step();
  ASSERT_EQ(plan.seqs.size(), 1u);
  EXPECT_EQ(plan.seqs[0].n_past, 12);
  EXPECT_EQ(plan.seqs[0].n_tokens, 1);
  EXPECT_EQ(d.sched.n_prefix_hit_tokens(2), 12);
  d.run();
  EXPECT_EQ(d.outputs[1], d.outputs[2]);
  auto st = d.sched.stats().prefix_cache;
  EXPECT_EQ(st.n_query_tokens, 26);
  EXPECT_EQ(st.n_hit_tokens, 12);
  // A prompt of exactly 12 still computes its last token.
  d.add(3, prompt_of(12, 500), 1);
  plan = d.step();
  EXPECT_EQ(plan.seqs[0].n_past, 8);
  EXPECT_EQ(plan.seqs[0].n_tokens, 4);
}

// prompt_logits: the sequence computes every prompt position (no prefix-cache
// hit, though its prompt is cached), in chunks that ask for all their logits,
// at most max_prompt_logit_rows rows per step over all sequences; others
// keep the rest of the budget, and its decode steps are ordinary.
TEST(Scheduler, PromptLogitsSkipThePrefixCacheAndCapRowsPerStep) {
  SchedulerConfig c = small_config();
  c.max_prompt_logit_rows = 5;
  Driver d(c);
  auto p = prompt_of(13, 500);
  d.add(1, p, 2);
  d.run();
  d.add(2, p, 2, -1, kRootBlockHash, /*prompt_logits=*/true);
  d.add(3, p, 2, -1, kRootBlockHash, /*prompt_logits=*/true);
  d.add(4, p, 2);  // an ordinary sequence still hits the cache
  std::map<SeqId, int32_t> covered;  // positions whose logits came back, in order
  for (int step = 0; step < 20 && !d.sched.idle(); ++step) {
    StepPlan plan = d.step();
    int32_t rows = 0;
    for (const auto& s : plan.seqs) {
      if (s.seq_id == 2 || s.seq_id == 3) {
        if (s.n_past < 13) {
          EXPECT_TRUE(s.all_logits) << "seq " << s.seq_id << " at " << s.n_past;
          EXPECT_EQ(s.n_past, covered[s.seq_id]) << "a gap in seq " << s.seq_id << "'s prompt positions";
          covered[s.seq_id] += s.n_tokens;
          rows += s.n_logit_rows();
        } else {
          EXPECT_FALSE(s.all_logits);  // decoding: one row
          EXPECT_EQ(s.n_logit_rows(), 1);
        }
      } else {
        EXPECT_FALSE(s.all_logits);
      }
    }
    EXPECT_LE(rows, 5);
  }
  EXPECT_TRUE(d.sched.idle());
  EXPECT_EQ(covered[2], 13);
  EXPECT_EQ(covered[3], 13);
  EXPECT_EQ(d.outputs[2], d.outputs[1]);
  EXPECT_EQ(d.outputs[3], d.outputs[1]);
  EXPECT_EQ(d.outputs[4], d.outputs[1]);
  EXPECT_EQ(d.sched.pool().stats().n_hit_tokens, 12);  // seq 4's three cached blocks; none for 2 and 3
}

TEST(Scheduler, SiblingsWaitForPromptThenShareItsBlocks) {
  Driver d(small_config());
  auto p = prompt_of(21, 0);  // 2 chunks at 16 tokens per step
  d.add(10, p, 3);
  d.add(11, p, 3, /*after=*/10);
  d.add(12, p, 3, /*after=*/10);
  StepPlan s1 = d.step();
  ASSERT_EQ(s1.seqs.size(), 1u);
  StepPlan s2 = d.step();  // 10 finishes its prompt; the siblings are still blocked at schedule time
  ASSERT_EQ(s2.seqs.size(), 1u);
  StepPlan s3 = d.step();
  ASSERT_EQ(s3.seqs.size(), 3u);
  for (size_t k = 1; k < 3; ++k) {
    EXPECT_EQ(s3.seqs[k].n_past, 20);
    for (int b = 0; b < 5; ++b) EXPECT_EQ(s3.seqs[k].block_table[b], s3.seqs[0].block_table[b]);
  }
  d.run();
  EXPECT_EQ(d.outputs[10], d.outputs[11]);
}

TEST(Scheduler, FinishFreesBlocksAtOnce) {
  Driver d(small_config());
  d.add(1, prompt_of(30, 0), 50);
  d.add(2, prompt_of(10, 0), 50);
  d.step();
  d.step();
  EXPECT_GT(d.sched.pool().n_used(), 0);
  d.sched.finish(1);
  d.sched.finish(2);
  d.sched.finish(3);  // unknown: ignored
  EXPECT_EQ(d.sched.pool().n_used(), 0);
  EXPECT_TRUE(d.sched.idle());
}

TEST(Scheduler, WithoutChunkingLongPromptWaitsForAFullBudget) {
  SchedulerConfig c = small_config();
  c.enable_chunked_prefill = false;
  EXPECT_THROW(Scheduler{c}, Error);
  c.max_num_batched_tokens = 128;
  Driver d(c);
  d.add(1, prompt_of(4, 0), 4);
  d.add(2, prompt_of(100, 0), 4);
  StepPlan p = d.step();
  ASSERT_EQ(p.seqs.size(), 2u);
  EXPECT_EQ(p.seqs[1].n_tokens, 100);
  d.run();
}

// Micro-batches in flight (pipeline parallelism): the same outputs as one
// plan at a time, with and without preemption, at depths 2 and 3.
TEST(Scheduler, PipelinedPlansGiveIdenticalOutputs) {
  SchedulerConfig big = small_config();
  big.n_blocks = 256;
  int64_t n = 0;
  const auto ref = run_workload(big, &n, 1);
  for (int depth : {2, 3}) {
    EXPECT_EQ(run_workload(big, &n, depth), ref) << "depth " << depth;
    SchedulerConfig tiny = small_config();
    tiny.n_blocks = 12;
    EXPECT_EQ(run_workload(tiny, &n, depth), ref) << "tiny pool, depth " << depth;
    EXPECT_GT(n, 0);
  }
}

TEST(Scheduler, SequencesInFlightAreLeftOutOfTheNextPlan) {
  Driver d(small_config());
  for (int i = 0; i < 4; ++i) d.add(i, prompt_of(3, 10 * i), 5);
  ASSERT_TRUE(d.launch());  // all four prompts
  EXPECT_FALSE(d.launch());  // nothing else to run until they land
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(d.sched.in_flight(i));
  d.land();
  ASSERT_TRUE(d.launch());
  d.add(9, prompt_of(3, 90), 5);
  ASSERT_TRUE(d.launch());  // the newcomer runs beside the decodes in flight
  EXPECT_TRUE(d.sched.in_flight(9));
  d.run(2);
  EXPECT_EQ(d.outputs.size(), 5u);
}

TEST(Scheduler, PlanSeqCapSplitsABurstOverMicroBatches) {
  Scheduler s(small_config());
  for (int i = 0; i < 5; ++i) s.add(i, prompt_of(2, 10 * i), 3);
  EXPECT_EQ(s.schedule(2).seqs.size(), 2u);
  EXPECT_EQ(s.schedule(2).seqs.size(), 2u);
  EXPECT_EQ(s.schedule(2).seqs.size(), 1u);
  EXPECT_EQ(s.n_in_flight(), 5);
  EXPECT_TRUE(s.schedule(2).empty());
}

TEST(Scheduler, FinishInFlightKeepsBlocksUntilThePlanLands) {
  Driver d(small_config());
  d.add(1, prompt_of(9, 0), 5);
  ASSERT_TRUE(d.launch());
  const int32_t used = d.sched.pool().n_used();
  EXPECT_GT(used, 0);
  d.abort(1);  // the client went away while its batch runs
  EXPECT_FALSE(d.sched.has(1));
  EXPECT_EQ(d.sched.pool().n_used(), used);  // the running batch still writes them
  d.land();
  EXPECT_EQ(d.sched.pool().n_used(), 0);
  EXPECT_TRUE(d.sched.idle());
}

TEST(Scheduler, ReleasedPlanIsScheduledAgainFromTheSameTokens) {
  Scheduler s(small_config());
  s.add(1, prompt_of(6, 0), 3);
  StepPlan p = s.schedule();
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_TRUE(s.schedule().empty());
  s.release(p);  // the model failed before it ran
  EXPECT_FALSE(s.in_flight(1));
  EXPECT_EQ(s.n_computed(1), 0);
  StepPlan again = s.schedule();
  ASSERT_EQ(again.seqs.size(), 1u);
  EXPECT_EQ(again.seqs[0].n_past, 0);
  EXPECT_EQ(again.seqs[0].token_ids, p.seqs[0].token_ids);
}

// Speculative decoding's bookkeeping: drafts on a decode get slots within
// the budget, max_new_tokens and free blocks; commit keeps the accepted
// drafts, cuts the rest and frees the blocks only they used; only blocks
// full of accepted tokens enter the prefix cache.
TEST(Scheduler, DraftsGetSlotsAndTheRejectedOnesAreRolledBack) {
  SchedulerConfig c = small_config();  // blocks of 4, budget 16
  Scheduler s(c);
  s.add(1, prompt_of(6, 10), 20);
  StepPlan prefill = s.schedule();
  EXPECT_EQ(s.add_draft(prefill, 0, std::vector<int32_t>{1, 2}), 0);  // a prompt chunk takes no draft
  const int32_t first = 100;
  s.commit(prefill, std::vector<int32_t>{first});
  StepPlan plan = s.schedule();
  ASSERT_EQ(plan.seqs[0].n_tokens, 1);
  EXPECT_EQ(s.add_draft(plan, 0, std::vector<int32_t>{1, 2, 3, 4, 5, 6}), 6);
  EXPECT_EQ(plan.seqs[0].draft_ids, (std::vector<int32_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(plan.seqs[0].block_table.size(), 4u);  // positions 0 .. 12
  EXPECT_EQ(plan.seqs[0].n_logit_rows(), 7);
  EXPECT_EQ(plan.n_scheduled_tokens, 7);
  EXPECT_EQ(s.pool().n_used(), 4);
  // Two drafts accepted, then the target's own token: 6 prompt + 100, 1, 2 + 200.
  s.commit(plan, std::vector<int32_t>{200}, std::vector<int32_t>{2});
  std::vector<int32_t> want = prompt_of(6, 10);
  want.insert(want.end(), {first, 1, 2, 200});
  EXPECT_EQ(std::vector<int32_t>(s.tokens(1).begin(), s.tokens(1).end()), want);
  EXPECT_EQ(s.n_computed(1), 9);
  EXPECT_EQ(s.pool().n_used(), 3);    // the 4th block held only rejected drafts
  EXPECT_EQ(s.pool().n_cached(), 2);  // blocks 0 and 1 are full of accepted tokens; block 2 holds a rejected one
  // A plan that never ran gives its draft blocks back too.
  StepPlan failed = s.schedule();
  EXPECT_EQ(s.add_draft(failed, 0, std::vector<int32_t>{7, 8, 9, 10}), 4);
  EXPECT_EQ(s.pool().n_used(), 4);
  s.release(failed);
  EXPECT_EQ(s.pool().n_used(), 3);
  EXPECT_EQ(s.n_computed(1), 9);
  s.finish(1);
  EXPECT_EQ(s.pool().n_used(), 0);
}

TEST(Scheduler, DraftsFitMaxNewTokensTheBudgetAndTheFreeBlocks) {
  {  // max_new 4 with 1 generated: verifying d drafts may produce d + 1, so 2 drafts at most
    Scheduler s(small_config());
    s.add(1, prompt_of(3, 0), 4);
    s.commit(s.schedule(), std::vector<int32_t>{50});
    StepPlan plan = s.schedule();
    EXPECT_EQ(s.add_draft(plan, 0, std::vector<int32_t>{1, 2, 3, 4}), 2);
  }
  {  // a budget of 3 tokens: the decode and 2 drafts
    SchedulerConfig c = small_config();
    c.max_num_batched_tokens = 3;
    Scheduler s(c);
    s.add(1, prompt_of(3, 0), 20);
    s.commit(s.schedule(), std::vector<int32_t>{50});
    StepPlan plan = s.schedule();
    EXPECT_EQ(s.add_draft(plan, 0, std::vector<int32_t>{1, 2, 3, 4}), 2);
    EXPECT_EQ(plan.n_scheduled_tokens, 3);
  }
  {  // no free block for position 4: no draft, and nothing preempted for one
    SchedulerConfig c = small_config();
    c.n_blocks = 2;
    Scheduler s(c);
    s.add(1, prompt_of(3, 0), 5);
    s.commit(s.schedule(), std::vector<int32_t>{50});
    s.add(2, prompt_of(4, 20), 1);
    StepPlan plan = s.schedule();
    ASSERT_EQ(plan.seqs.size(), 2u);  // seq 1's decode and seq 2's prompt fill the pool
    EXPECT_EQ(s.pool().n_free(), 0);
    EXPECT_EQ(s.add_draft(plan, 0, std::vector<int32_t>{1, 2}), 0);
    EXPECT_TRUE(plan.seqs[0].draft_ids.empty());
    EXPECT_TRUE(plan.preempted.empty());
  }
}


// --- Sliding window (every layer attends to its last `sliding_window`
// positions): the blocks that leave the window are released. ---

SchedulerConfig window_config(int32_t window) {
  SchedulerConfig c = small_config();  // blocks of 4
  c.sliding_window = window;
  return c;
}

// Which table entries are holes, step by step, in a hand-worked case:
// window 6 (a query at p reads [p - 5, p]), a 10-token prompt in chunks of 4.
TEST(SlidingWindow, ReleasesABlockOnlyOnceNoQueryReadsIt) {
  SchedulerConfig c = window_config(6);
  c.max_num_batched_tokens = 4;
  Scheduler s(c);
  s.add(1, prompt_of(10, 0), 20);
  s.commit(s.schedule(), std::vector<int32_t>{-1});  // [0, 4): the next query (4) reads from 0
  EXPECT_EQ(s.pool().n_used(), 1);
  s.commit(s.schedule(), std::vector<int32_t>{-1});  // [4, 8): the next query (8) reads from 3
  EXPECT_EQ(s.pool().n_used(), 2);
  StepPlan p3 = s.schedule();  // [8, 10): the chunk's first row (8) reads from 3, so block 0 is still there
  ASSERT_EQ(p3.seqs[0].n_past, 8);
  EXPECT_NE(p3.seqs[0].block_table[0], kNoBlock);
  EXPECT_EQ(s.pool().n_used(), 3);
  s.commit(p3, std::vector<int32_t>{50});  // the next query (10) reads from 5: block 0 (positions 0-3) leaves
  EXPECT_EQ(s.pool().n_used(), 2);
  EXPECT_EQ(s.stats().n_blocks_slid, 1);
  StepPlan d1 = s.schedule();  // decode at 10
  EXPECT_EQ(d1.seqs[0].block_table[0], kNoBlock);
  EXPECT_NE(d1.seqs[0].block_table[1], kNoBlock);
  s.commit(d1, std::vector<int32_t>{51});  // next query 11 reads from 6: block 1 (4-7) stays
  s.commit(s.schedule(), std::vector<int32_t>{52});  // 12 reads from 7: block 1 stays
  EXPECT_EQ(s.pool().n_used(), 2);
  StepPlan d3 = s.schedule();  // decode at 12 takes block 3
  EXPECT_EQ(s.pool().n_used(), 3);
  EXPECT_NE(d3.seqs[0].block_table[1], kNoBlock);
  s.commit(d3, std::vector<int32_t>{53});  // 13 reads from 8: block 1 leaves
  EXPECT_EQ(s.pool().n_used(), 2);
  EXPECT_EQ(s.stats().n_blocks_slid, 2);
  s.finish(1);
  EXPECT_EQ(s.pool().n_used(), 0);
}

// Without the window config the same sequence keeps every block.
TEST(SlidingWindow, OffKeepsTheWholePast) {
  SchedulerConfig c = small_config();
  Scheduler s(c);
  s.add(1, prompt_of(10, 0), 20);
  s.commit(s.schedule(), std::vector<int32_t>{50});
  for (int i = 0; i < 10; ++i) s.commit(s.schedule(), std::vector<int32_t>{60 + i});
  EXPECT_EQ(s.pool().n_used(), 5);  // positions 0 .. 19
  EXPECT_EQ(s.stats().n_blocks_slid, 0);
}

// A pool far too small for any sequence's whole past: with the window it
// runs (requests fit by max_blocks_held), preempts, and gives the outputs
// of a big pool that frees nothing, with the same attention window. Every
// row's window is checked to read no released block (Driver::launch).
std::map<SeqId, std::vector<int32_t>> run_window_workload(SchedulerConfig c, int32_t read_window, int depth,
                                                          int32_t* max_used, int64_t* n_preempt,
                                                          int64_t* n_preempt_slid = nullptr) {
  Driver d(c);
  d.read_window = read_window;
  for (int i = 0; i < 6; ++i) d.add(i, prompt_of(5 + 7 * i, 1000 * (i % 3)), 30);
  d.add(6, prompt_of(40, 1000), 12);  // shares seq 4's prefix: prefix hits while blocks slide
  d.run(depth);
  EXPECT_EQ(d.sched.pool().n_used(), 0);
  *max_used = d.max_blocks_used;
  *n_preempt = d.sched.stats().n_preemptions;
  if (n_preempt_slid) *n_preempt_slid = d.n_preempted_with_holes;
  return d.outputs;
}

TEST(SlidingWindow, TinyPoolPreemptionAndPrefixHitsGiveTheOutputsOfAFullCache) {
  int64_t n_preempted_after_sliding = 0;  // the newest is preempted first, so mostly before it slid
  for (int32_t window : {1, 5, 6, 9}) {
    SchedulerConfig full = small_config();
    full.n_blocks = 512;
    int32_t full_max = 0, w_max = 0;
    int64_t n_pre = 0;
    auto ref = run_window_workload(full, window, 1, &full_max, &n_pre);
    EXPECT_EQ(n_pre, 0);
    SchedulerConfig w = window_config(window);
    w.n_blocks = 512;
    auto got = run_window_workload(w, window, 1, &w_max, &n_pre);
    EXPECT_EQ(ref, got) << "window " << window;
    EXPECT_LT(w_max, full_max / 2) << "window " << window;
    // The longest sequence is 70 tokens (18 blocks): the whole past never fits in 8 (65 tokens need 16).
    SchedulerConfig tiny = window_config(window);
    tiny.n_blocks = 8;
    tiny.max_num_batched_tokens = 8;  // a sequence holds at most ceil((window - 1 + 8) / 4) + 1 <= 5 blocks
    SchedulerConfig no_window = tiny;
    no_window.sliding_window = 0;
    EXPECT_THROW(Scheduler::check_fits(no_window, 35, 30), Error);
    for (bool caching : {true, false})
      for (int depth : {1, 2}) {
        tiny.enable_prefix_caching = caching;
        int32_t tiny_max = 0;
        int64_t n_slid_pre = 0;
        auto t = run_window_workload(tiny, window, depth, &tiny_max, &n_pre, &n_slid_pre);
        EXPECT_EQ(ref, t) << "window " << window << " caching " << caching << " depth " << depth;
        EXPECT_LE(tiny_max, 8);
        if (window >= 5) EXPECT_GT(n_pre, 0) << "window " << window;
        n_preempted_after_sliding += n_slid_pre;
      }
  }
  EXPECT_GT(n_preempted_after_sliding, 0);
}

// A prefix hit adopts only the cached blocks the window still reads; the
// ones before it stay evictable in the cache, unreferenced.
TEST(SlidingWindow, PrefixHitReferencesOnlyTheBlocksInTheWindow) {
  SchedulerConfig c = window_config(6);
  Scheduler s(c);
  const std::vector<int32_t> prompt = prompt_of(21, 7);
  s.add(1, prompt, 1);
  StepPlan p = s.schedule();  // 16 tokens
  s.commit(p, std::vector<int32_t>{-1});
  s.commit(s.schedule(), std::vector<int32_t>{99});  // the last 5; 21 computed: reads from 16
  EXPECT_EQ(s.pool().n_used(), 2);                   // blocks of 16-19, 20
  EXPECT_EQ(s.pool().n_cached(), 5);                 // the 5 full blocks stay cached (3 evictable)
  s.finish(1);
  EXPECT_EQ(s.pool().n_used(), 0);
  s.add(2, prompt, 4);
  StepPlan hit = s.schedule();
  ASSERT_EQ(hit.seqs.size(), 1u);
  EXPECT_EQ(hit.seqs[0].n_past, 20);  // (21 - 1) / 4 full blocks hit
  EXPECT_EQ(s.n_prefix_hit_tokens(2), 20);
  // The query at 20 reads from 15: blocks 0-2 (0-11) are holes, 3 and 4 referenced, 5 fresh.
  const std::vector<int32_t>& t = hit.seqs[0].block_table;
  ASSERT_EQ(t.size(), 6u);
  EXPECT_EQ(t[0], kNoBlock);
  EXPECT_EQ(t[1], kNoBlock);
  EXPECT_EQ(t[2], kNoBlock);
  EXPECT_NE(t[3], kNoBlock);
  EXPECT_NE(t[4], kNoBlock);
  EXPECT_EQ(s.pool().n_used(), 3);
  s.commit(hit, std::vector<int32_t>{5});
  s.finish(2);
  EXPECT_EQ(s.pool().n_used(), 0);
  // Once the chain's head is evicted, the rest of it is no hit (the
  // simplest correct rule: a hit starts at block 0).
  SchedulerConfig small = window_config(6);
  small.n_blocks = 6;
  Scheduler s2(small);
  s2.add(1, prompt, 1);
  s2.commit(s2.schedule(), std::vector<int32_t>{-1});
  s2.commit(s2.schedule(), std::vector<int32_t>{99});
  s2.finish(1);
  s2.add(3, prompt_of(17, 500), 1);  // takes the never-cached block, then evicts the LRU head: block 0's
  s2.commit(s2.schedule(), std::vector<int32_t>{-1});
  s2.commit(s2.schedule(), std::vector<int32_t>{1});
  s2.finish(3);
  s2.add(2, prompt, 1);
  StepPlan miss = s2.schedule();
  EXPECT_EQ(miss.seqs[0].n_past, 0);
}

// Drafts past the window: the rows of the drafts read their own windows
// (the blocks stay), the rejected rows are rolled back, and then the
// accepted length slides the window.
TEST(SlidingWindow, DraftsAndRollbackKeepEveryBlockARowReads) {
  SchedulerConfig c = window_config(5);
  Scheduler s(c);
  s.add(1, prompt_of(10, 10), 20);
  s.commit(s.schedule(), std::vector<int32_t>{100});  // 10 computed: reads from 6; block 0 leaves
  EXPECT_EQ(s.pool().n_used(), 2);
  StepPlan plan = s.schedule();
  ASSERT_EQ(plan.seqs[0].n_tokens, 1);
  EXPECT_EQ(s.add_draft(plan, 0, std::vector<int32_t>{1, 2, 3, 4, 5, 6}), 6);  // rows at 10 .. 16
  const std::vector<int32_t>& t = plan.seqs[0].block_table;
  ASSERT_EQ(t.size(), 5u);  // positions 0 .. 16
  EXPECT_EQ(t[0], kNoBlock);
  EXPECT_NE(t[1], kNoBlock);  // the row at 10 reads 6 .. 10
  EXPECT_EQ(s.pool().n_used(), 4);
  // One draft accepted: tokens 0 .. 11 computed, 12 sampled; the query at 12 reads from 8.
  s.commit(plan, std::vector<int32_t>{200}, std::vector<int32_t>{1});
  EXPECT_EQ(s.n_computed(1), 12);
  EXPECT_EQ(s.pool().n_used(), 2);  // block 1 left the window, block 4 held only rejected drafts
  EXPECT_EQ(s.stats().n_blocks_slid, 2);
  // A failed plan with drafts gives its draft blocks back; the window stays.
  StepPlan failed = s.schedule();
  EXPECT_EQ(s.add_draft(failed, 0, std::vector<int32_t>{7, 8, 9, 10, 11}), 5);
  EXPECT_EQ(s.pool().n_used(), 3);
  s.release(failed);
  EXPECT_EQ(s.pool().n_used(), 2);
  StepPlan again = s.schedule();
  EXPECT_EQ(again.seqs[0].n_past, 12);
  EXPECT_EQ(again.seqs[0].block_table[1], kNoBlock);
  EXPECT_NE(again.seqs[0].block_table[2], kNoBlock);
  s.commit(again, std::vector<int32_t>{300});
  s.finish(1);
  EXPECT_EQ(s.pool().n_used(), 0);
}

TEST(SlidingWindow, CheckFitsCountsOnlyTheWindow) {
  SchedulerConfig c = window_config(8);
  c.n_blocks = 7;
  c.max_num_batched_tokens = 16;
  // 100 tokens: 25 blocks whole, but at most ceil((8 - 1 + 16) / 4) + 1 = 7 held.
  EXPECT_NO_THROW(Scheduler::check_fits(c, 60, 40));
  c.n_blocks = 6;
  try {
    Scheduler::check_fits(c, 60, 40);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs 7 KV blocks"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("sliding window of 8"), std::string::npos) << e.what();
  }
  c.sliding_window = -1;
  EXPECT_THROW(Scheduler bad(c), Error);
}

// Hybrid models (Gemma 3): the local layers' KV in a pool of its own.
SchedulerConfig hybrid_config(int32_t window, int32_t n_local_blocks) {
  SchedulerConfig c = small_config();  // blocks of 4
  c.local_sliding_window = window;
  c.n_local_blocks = n_local_blocks;
  return c;
}

// Hand-worked: window 6, a 10-token prompt in chunks of 4. Both tables cover
// the same positions; only the local one releases blocks.
TEST(HybridKv, LocalTableSlidesWhileTheGlobalOneKeepsEveryBlock) {
  SchedulerConfig c = hybrid_config(6, 16);
  c.max_num_batched_tokens = 4;
  Scheduler s(c);
  ASSERT_NE(s.local_pool(), nullptr);
  s.add(1, prompt_of(10, 0), 20);
  StepPlan p1 = s.schedule();
  ASSERT_EQ(p1.seqs[0].local_block_table.size(), 1u);
  s.commit(p1, std::vector<int32_t>{-1});
  s.commit(s.schedule(), std::vector<int32_t>{-1});
  StepPlan p3 = s.schedule();  // [8, 10): its first row reads from 3
  EXPECT_EQ(s.pool().n_used(), 3);
  EXPECT_EQ(s.stats().n_local_blocks_used, 3);
  EXPECT_NE(p3.seqs[0].local_block_table[0], kNoBlock);
  s.commit(p3, std::vector<int32_t>{50});  // the next query (10) reads from 5: local block 0 leaves
  EXPECT_EQ(s.pool().n_used(), 3);
  EXPECT_EQ(s.stats().n_local_blocks_used, 2);
  EXPECT_EQ(s.stats().n_blocks_slid, 1);
  StepPlan d1 = s.schedule();
  EXPECT_NE(d1.seqs[0].block_table[0], kNoBlock);
  EXPECT_EQ(d1.seqs[0].local_block_table[0], kNoBlock);
  s.commit(d1, std::vector<int32_t>{51});
  s.commit(s.schedule(), std::vector<int32_t>{52});
  s.commit(s.schedule(), std::vector<int32_t>{53});  // 13 computed: reads from 8, local block 1 leaves
  EXPECT_EQ(s.pool().n_used(), 4);                     // positions 0 .. 13, all kept
  EXPECT_EQ(s.stats().n_local_blocks_used, 2);
  EXPECT_EQ(s.stats().n_blocks_slid, 2);
  s.finish(1);
  EXPECT_EQ(s.pool().n_used(), 0);
  EXPECT_EQ(s.stats().n_local_blocks_used, 0);
  // One pool: no local table at all.
  Scheduler one(small_config());
  EXPECT_EQ(one.local_pool(), nullptr);
  one.add(1, prompt_of(3, 0), 1);
  EXPECT_TRUE(one.schedule().seqs[0].local_block_table.empty());
}

// A sequence is admitted only when both pools have its blocks; a pool that
// is short leaves the other untouched.
TEST(HybridKv, AllocationIsAllOrNothingOverBothPools) {
  {  // the local pool is short
    SchedulerConfig c = hybrid_config(4, 6);  // a sequence holds at most ceil((3 + 16) / 4) + 1 = 6 local blocks
    Scheduler s(c);
    s.add(1, prompt_of(16, 0), 4);
    s.add(2, prompt_of(12, 100), 4);
    StepPlan p1 = s.schedule();  // seq 1's 16 tokens: 4 blocks in each pool
    ASSERT_EQ(p1.seqs.size(), 1u);
    EXPECT_EQ(s.pool().n_used(), 4);
    EXPECT_EQ(s.stats().n_local_blocks_used, 4);
    StepPlan p2 = s.schedule();  // seq 1 in flight; seq 2 needs 3 local blocks, 2 are free
    EXPECT_TRUE(p2.empty());
    EXPECT_EQ(s.pool().n_used(), 4);  // its 3 global blocks were not taken
    EXPECT_EQ(s.stats().n_local_blocks_used, 4);
    // vllm:kv_cache_usage_perc: the fuller pool (4 of 6 local blocks; 4 of 64 global).
    EXPECT_DOUBLE_EQ(s.stats().kv_usage, 4.0 / 6.0);
    s.commit(p1, std::vector<int32_t>{7});  // reads from 13: local blocks 0-2 leave
    EXPECT_EQ(s.stats().n_local_blocks_used, 1);
    StepPlan p3 = s.schedule();  // seq 1's decode at 16 and seq 2's prompt
    ASSERT_EQ(p3.seqs.size(), 2u);
    EXPECT_EQ(s.pool().n_used(), 8);
    EXPECT_EQ(s.stats().n_local_blocks_used, 5);
  }
  {  // the global pool is short
    SchedulerConfig c = hybrid_config(4, 16);
    c.n_blocks = 5;
    Scheduler s(c);
    s.add(1, prompt_of(16, 0), 4);
    s.add(2, prompt_of(8, 100), 1);
    StepPlan p1 = s.schedule();
    StepPlan p2 = s.schedule();  // seq 2 needs 2 global blocks, 1 is free
    EXPECT_TRUE(p2.empty());
    EXPECT_EQ(s.pool().n_used(), 4);
    EXPECT_EQ(s.stats().n_local_blocks_used, 4);  // its 2 local blocks were not taken
    s.commit(p1, std::vector<int32_t>{7});
    s.finish(1);
    EXPECT_EQ(s.pool().n_used(), 0);
    EXPECT_EQ(s.stats().n_local_blocks_used, 0);
  }
}

// The model reads every position from the global table and its last
// `window` from the local one. A local pool far too small for any sequence's
// whole past (and, in one run, a global pool that preempts too) gives the
// outputs of one big pool that frees nothing, with preemption, prefix hits,
// no caching and plans in flight; the local pool never holds more than its
// blocks, the global pool keeps every position.
std::map<SeqId, std::vector<int32_t>> run_hybrid_workload(SchedulerConfig c, int32_t window, int depth,
                                                          int32_t* max_local, int32_t* max_global,
                                                          int64_t* n_preempt) {
  Driver d(c);
  d.local_read_window = window;
  for (int i = 0; i < 6; ++i) d.add(i, prompt_of(5 + 7 * i, 1000 * (i % 3)), 30);
  d.add(6, prompt_of(40, 1000), 12);  // shares seq 4's prefix
  d.run(depth);
  EXPECT_EQ(d.sched.pool().n_used(), 0);
  EXPECT_EQ(d.sched.stats().n_local_blocks_used, 0);
  *max_local = d.max_local_blocks_used;
  *max_global = d.max_blocks_used;
  *n_preempt = d.sched.stats().n_preemptions;
  return d.outputs;
}

TEST(HybridKv, TinyLocalPoolGivesTheOutputsOfOneFullPool) {
  for (int32_t window : {1, 5, 6, 9}) {
    SchedulerConfig full = small_config();
    full.n_blocks = 512;
    int32_t max_local = 0, max_global = 0, full_max = 0;
    int64_t n_pre = 0;
    auto ref = run_hybrid_workload(full, window, 1, &max_local, &full_max, &n_pre);
    EXPECT_EQ(n_pre, 0);
    EXPECT_EQ(max_local, 0);
    SchedulerConfig big = hybrid_config(window, 512);
    big.n_blocks = 512;
    auto got = run_hybrid_workload(big, window, 1, &max_local, &max_global, &n_pre);
    EXPECT_EQ(ref, got) << "window " << window;
    EXPECT_EQ(max_global, full_max) << "window " << window;  // the global layers keep everything
    EXPECT_LT(max_local, full_max / 2) << "window " << window;
    for (int32_t n_global : {512, 24})  // 24: the longest sequence (70 tokens) needs 18
      for (bool caching : {true, false})
        for (int depth : {1, 2}) {
          SchedulerConfig tiny = hybrid_config(window, 8);
          tiny.max_num_batched_tokens = 8;  // at most ceil((window - 1 + 8) / 4) + 1 <= 5 local blocks
          tiny.n_blocks = n_global;
          tiny.enable_prefix_caching = caching;
          auto t = run_hybrid_workload(tiny, window, depth, &max_local, &max_global, &n_pre);
          EXPECT_EQ(ref, t) << "window " << window << " global " << n_global << " caching " << caching
                            << " depth " << depth;
          EXPECT_LE(max_local, 8);
          EXPECT_LE(max_global, n_global);
          if (window >= 5 || n_global == 24) {
            EXPECT_GT(n_pre, 0) << "window " << window << " global " << n_global;
          }
        }
  }
}

// A prefix hit adopts every global block and, in the local pool, the blocks
// its first query's window reads, cached under the same hashes.
TEST(HybridKv, PrefixHitTakesTheLocalBlocksOfItsWindow) {
  SchedulerConfig c = hybrid_config(6, 6);  // 21 + 1 tokens hold at most min(6, ceil(21 / 16) ..) = 6 local blocks
  Scheduler s(c);
  const std::vector<int32_t> prompt = prompt_of(21, 7);
  s.add(1, prompt, 1);
  s.commit(s.schedule(), std::vector<int32_t>{-1});  // 16 tokens
  s.commit(s.schedule(), std::vector<int32_t>{99});  // 21 computed: reads from 16
  EXPECT_EQ(s.pool().n_used(), 6);
  EXPECT_EQ(s.stats().n_local_blocks_used, 2);
  EXPECT_EQ(s.local_pool()->n_cached(), 5);  // local blocks are cached before they leave
  s.finish(1);
  s.add(2, prompt, 4);
  StepPlan hit = s.schedule();
  ASSERT_EQ(hit.seqs.size(), 1u);
  EXPECT_EQ(hit.seqs[0].n_past, 20);
  // The query at 20 reads from 15: local blocks 3 and 4 adopted, 0-2 holes; every global block adopted.
  const std::vector<int32_t>& t = hit.seqs[0].local_block_table;
  ASSERT_EQ(t.size(), 6u);
  EXPECT_EQ(t[0], kNoBlock);
  EXPECT_EQ(t[2], kNoBlock);
  EXPECT_NE(t[3], kNoBlock);
  EXPECT_NE(t[4], kNoBlock);
  for (int32_t b : hit.seqs[0].block_table) EXPECT_NE(b, kNoBlock);
  EXPECT_EQ(s.pool().n_used(), 6);
  EXPECT_EQ(s.stats().n_local_blocks_used, 3);
  s.commit(hit, std::vector<int32_t>{5});
  s.finish(2);
  // Another prompt evicts the local blocks of that window while the global
  // pool (64 blocks) keeps the whole chain: the hit is cut to what the local
  // pool still holds, here nothing (find_window_prefix's tests cut it partway).
  s.add(3, prompt_of(17, 500), 1);
  s.commit(s.schedule(), std::vector<int32_t>{-1});
  s.commit(s.schedule(), std::vector<int32_t>{1});
  s.finish(3);
  EXPECT_NE(find_cached_prefix(s.pool(), prompt).n_tokens, 0);
  s.add(4, prompt, 1);
  StepPlan miss = s.schedule();
  EXPECT_EQ(miss.seqs[0].n_past, 0);
  EXPECT_EQ(s.n_prefix_hit_tokens(4), 0);
}

// Drafts take blocks in both pools (as many as the local pool has), the
// rejected rows are rolled back in both, and a failed plan gives both back.
TEST(HybridKv, DraftsAndRollbackInBothPools) {
  SchedulerConfig c = hybrid_config(5, 4);
  c.max_num_batched_tokens = 8;  // at most ceil((4 + 8) / 4) + 1 = 4 local blocks
  Scheduler s(c);
  s.add(1, prompt_of(10, 10), 20);
  s.add(2, prompt_of(3, 50), 20);
  s.commit(s.schedule(), std::vector<int32_t>{-1});  // seq 1: 8 tokens
  s.commit(s.schedule(), std::vector<int32_t>{100, 200});  // seq 1: 10 computed, reads from 6: local block 0 leaves
  EXPECT_EQ(s.pool().n_used(), 4);                   // seq 1: 3, seq 2: 1
  EXPECT_EQ(s.stats().n_local_blocks_used, 3);       // seq 1: 2, seq 2: 1
  for (bool fail : {true, false}) {
    StepPlan plan = s.schedule();
    ASSERT_EQ(plan.seqs.size(), 2u);
    ASSERT_EQ(plan.seqs[0].seq_id, 1);
    // Budget 6, but the local pool has 1 free block: drafts at 11 .. 15 only.
    EXPECT_EQ(s.add_draft(plan, 0, prompt_of(10, 0)), 5);
    EXPECT_EQ(plan.seqs[0].local_block_table.size(), 4u);
    EXPECT_EQ(plan.seqs[0].block_table.size(), 4u);
    EXPECT_EQ(s.stats().n_local_blocks_used, 4);
    EXPECT_EQ(s.pool().n_used(), 5);
    if (fail) {  // a plan that did not run gives the drafts' blocks back in both pools
      s.release(plan);
      EXPECT_EQ(s.stats().n_local_blocks_used, 3);
      EXPECT_EQ(s.pool().n_used(), 4);
      continue;
    }
    // One accepted: 12 computed, 13 tokens; the query at 12 reads from 8: local blocks 0 and 1 gone.
    s.commit(plan, std::vector<int32_t>{300, 201}, std::vector<int32_t>{1, 0});
  }
  EXPECT_EQ(s.n_computed(1), 12);
  EXPECT_EQ(s.pool().n_used(), 5);  // seq 1: positions 0 .. 12 (4 blocks), seq 2: 1
  EXPECT_EQ(s.stats().n_local_blocks_used, 3);  // seq 1: 8 .. 12, seq 2: 1
  StepPlan third = s.schedule();  // seq 2's decode at 4 takes a block in each pool
  EXPECT_EQ(s.stats().n_local_blocks_used, 4);
  EXPECT_EQ(s.pool().n_used(), 6);
  // The local pool is full: drafts at 13 .. 15 (block 3) only, though the global pool has room.
  EXPECT_EQ(s.add_draft(third, 0, prompt_of(5, 0)), 3);
  EXPECT_EQ(s.pool().n_used(), 6);
  s.commit(third, std::vector<int32_t>{301, 202}, std::vector<int32_t>{3, 0});
  EXPECT_EQ(s.n_computed(1), 16);  // reads from 12: local block 2 leaves
  EXPECT_EQ(s.stats().n_local_blocks_used, 3);
  EXPECT_EQ(s.pool().n_used(), 6);
  s.finish(1);
  s.finish(2);
  EXPECT_EQ(s.pool().n_used(), 0);
  EXPECT_EQ(s.stats().n_local_blocks_used, 0);
}

TEST(HybridKv, CheckFitsBoundsBothPools) {
  SchedulerConfig c = hybrid_config(8, 7);
  c.max_num_batched_tokens = 16;
  // 100 tokens: 25 global blocks, at most ceil((8 - 1 + 16) / 4) + 1 = 7 local ones.
  EXPECT_NO_THROW(Scheduler::check_fits(c, 60, 40));
  c.n_local_blocks = 6;
  try {
    Scheduler::check_fits(c, 60, 40);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs 7 KV blocks of 4 tokens in the local layers' pool"),
              std::string::npos)
        << e.what();
  }
  c.n_local_blocks = 7;
  c.n_blocks = 24;  // the global layers need all 25
  EXPECT_THROW(Scheduler::check_fits(c, 60, 40), Error);
  SchedulerConfig bad = hybrid_config(8, 0);
  EXPECT_THROW(Scheduler s(bad), Error);
  bad = hybrid_config(0, 8);
  EXPECT_THROW(Scheduler s(bad), Error);
  bad = hybrid_config(8, 8);
  bad.sliding_window = 8;
  try {
    Scheduler s(bad);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exclude each other"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardlm
