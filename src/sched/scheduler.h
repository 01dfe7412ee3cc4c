// Continuous batching as bookkeeping (vLLM v1): every sequence has tokens whose
// KV is not computed yet (a prompt, a chunk of a long prompt, one decode token,
// or everything again after preemption); each step gives the running sequences
// their share of the token budget first, then admits waiting ones. No phases.
//
// Protocol per step: plan = schedule(); the engine runs the model; then
// commit(plan, sampled) appends the sampled tokens and registers computed KV;
// then finish(seq) for sequences that stopped. Single-threaded: the engine
// thread owns the Scheduler.
//
// Pipelining: schedule() may be called again before the last plan is
// committed (one plan per micro-batch in flight). A sequence in an
// uncommitted plan is "in flight": later plans leave it out (its next token
// is not known yet) and never preempt it. Plans are committed (or released,
// when they never ran) in the order they were scheduled. finish() of a
// sequence in flight keeps its blocks until its plan is committed, so no
// later batch can be given blocks that a running batch still writes.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/block_pool.h"
#include "kv/block_table.h"
#include "sched/step_plan.h"

namespace shardlm {

struct SchedulerConfig {
  int32_t n_blocks = 1024;                  // KV blocks in the pool (from the memory budget)
  int32_t block_size = kDefaultBlockSize;   // token slots per block
  int32_t max_num_seqs = 256;               // sequences per step (--max-num-seqs)
  int32_t max_num_batched_tokens = 2048;    // tokens per step (--max-num-batched-tokens)
  int32_t max_model_len = 4096;             // prompt + generated tokens per sequence (--max-model-len)
  bool enable_chunked_prefill = true;       // split prompts longer than the remaining budget
  bool enable_prefix_caching = true;
  // Logit rows [vocab] f32 a step may hold for prompt logprobs, over all
  // sequences: a sequence that wants them is prefilled in chunks of at most
  // this many tokens, so its logits never take vocab x prompt floats at once
  // (2,048 positions x 152K vocab would be 1.2 GB). The engine derives it
  // from the vocabulary (EngineConfig::prompt_logits_bytes).
  int32_t max_prompt_logit_rows = 256;
  // LongRoPE models: ModelSpec::long_rope_from() (0 for other ropes). A
  // prompt longer than it is computed with the long factors at every
  // position (ScheduledSeq::long_context), so its blocks hold other KV than a
  // short prompt's of the same tokens: they are hashed on a chain of their own.
  int32_t long_context_after = 0;
  // > 0: every layer attends to its last sliding_window positions (itself
  // included; Mistral v0.1, Phi-3-mini-4k). A sequence then holds only the
  // blocks its next queries read: the blocks that leave the window are
  // released at commit (kv's release_before), so a sequence holds at most
  // max_blocks_held(.., sliding_window, max_num_batched_tokens) blocks and a
  // request is refused only when that many do not fit. 0: models where some
  // layer attends to its whole past (Gemma 3's global layers: its local
  // layers use local_sliding_window below) or none slides.
  int32_t sliding_window = 0;
  // Hybrid models (Gemma 3: local sliding-window layers interleaved with
  // global ones). > 0: the local layers attend to their last
  // local_sliding_window positions and keep their KV in a pool of their own,
  // n_local_blocks blocks of block_size slots; n_blocks is then the global
  // layers' pool. Each sequence holds a block in both pools for the same
  // positions (ScheduledSeq::local_block_table): both are allocated together
  // or not at all, the local table releases the blocks that leave the window
  // at commit (as sliding_window does for the one table), the global table
  // keeps every block. A request must fit both: its whole past in n_blocks,
  // max_blocks_held(.., local_sliding_window, max_num_batched_tokens) in
  // n_local_blocks. Requires sliding_window == 0. 0: one pool for every layer.
  int32_t local_sliding_window = 0;
  int32_t n_local_blocks = 0;
};

enum class SeqStatus { kWaiting, kRunning, kFinished };

struct SchedulerStats {
  int32_t n_running = 0;
  int32_t n_waiting = 0;
  int64_t n_preemptions = 0;  // total since start
  double kv_usage = 0.0;      // fraction of blocks in use (of the fuller pool when there are two)
  int32_t n_blocks_used = 0;  // KV blocks referenced by a sequence
  int64_t n_blocks_slid = 0;  // total blocks released since start for leaving the sliding window (either pool)
  int32_t n_local_blocks_used = 0;  // local-layer pool blocks referenced (0 without one)
  PrefixCacheStats prefix_cache;
};

class Scheduler {
 public:
  explicit Scheduler(const SchedulerConfig& config);

  const SchedulerConfig& config() const { return config_; }

  // Throws kInvalidArgument (with the numbers) when a sequence of n_prompt
  // tokens that may grow by max_new_tokens could never be scheduled: beyond
  // max_model_len, or more blocks than the whole pool (with a sliding window:
  // than kv's max_blocks_held). Pure: safe to call
  // from any thread before submitting.
  static void check_fits(const SchedulerConfig& config, int32_t n_prompt, int32_t max_new_tokens);

  // Queues a sequence (FCFS). `after` (optional): do not admit it before
  // that sequence has computed its whole prompt, so it can reuse the prompt's
  // cached blocks (n > 1 siblings). Runs check_fits.
  // `cache_root`: the prefix-cache chain it may share (kv's cache_root of its salt).
  // `prompt_logits`: its chunks return logits at every prompt position
  // (ScheduledSeq::all_logits) until the whole prompt was computed once; until
  // then it takes no prefix-cache hit, since a cached block's positions are
  // never computed (vLLM does the same). After that (a preempted sequence
  // recomputing its prompt) it is an ordinary sequence again.
  void add(SeqId id, std::vector<int32_t> prompt, int32_t max_new_tokens, SeqId after = -1,
           BlockHash cache_root = kRootBlockHash, bool prompt_logits = false);

  // max_seqs > 0 caps the sequences of this plan below max_num_seqs: the
  // engine splits the live sequences over the micro-batches of a pipeline.
  StepPlan schedule(int32_t max_seqs = 0);

  // Speculative decoding: gives plan.seqs[k] (a decode: one token, with
  // logits) drafted tokens to verify after its token, as many of `draft` as
  // fit the step's token budget, the sequence's max_new_tokens (every
  // verified row may produce one) and free KV blocks (a draft never preempts
  // anything). Returns how many it took; 0 leaves the plan as it was.
  int32_t add_draft(StepPlan& plan, size_t k, std::span<const int32_t> draft);

  // After the model ran `plan`: marks the chunks computed, registers full
  // blocks in the prefix cache, and appends sampled[i] (< 0: none) to
  // plan.seqs[i]'s tokens. Sequences finished/aborted since schedule() are skipped.
  // n_accepted (empty, or [plan.seqs.size()]): for a sequence with drafts,
  // how many leading drafts the target produced itself; those are appended
  // before sampled[i], and only the fed token and they count as computed:
  // the rejected rows are rolled back (the length is cut, the blocks only
  // they used freed; none is registered with their KV).
  void commit(const StepPlan& plan, std::span<const int32_t> sampled, std::span<const int32_t> n_accepted = {});
  // A scheduled plan that did not run (the model failed): its sequences are
  // no longer in flight and nothing they were to compute counts as computed.
  void release(const StepPlan& plan);

  // Removes the sequence (finished or aborted) and frees its blocks at once.
  // Unknown ids are ignored (already finished).
  void finish(SeqId id);

  // A held sequence is left out of every plan (running or waiting) until
  // released, keeping its blocks: the engine holds one whose next grammar
  // mask is still being computed. Unknown ids are ignored.
  void set_held(SeqId id, bool held);

  bool has(SeqId id) const { return seqs_.count(id) != 0; }
  bool in_flight(SeqId id) const;
  bool idle() const { return running_.empty() && waiting_.empty(); }
  int32_t n_running() const { return static_cast<int32_t>(running_.size()); }
  int32_t n_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  int32_t n_in_flight() const;  // running sequences in an uncommitted plan
  SeqStatus status(SeqId id) const;
  std::span<const int32_t> tokens(SeqId id) const;   // prompt + generated
  int32_t n_computed(SeqId id) const;
  int32_t n_prefix_hit_tokens(SeqId id) const;       // tokens served by the prefix cache at first admission
  int32_t n_preemptions(SeqId id) const;
  SchedulerStats stats() const;
  const BlockPool& pool() const { return pool_; }
  // The local layers' pool (SchedulerConfig::local_sliding_window); null without one.
  const BlockPool* local_pool() const { return local_pool_ ? &*local_pool_ : nullptr; }

 private:
  struct Seq {
    SeqId id = 0;
    std::vector<int32_t> tokens;  // prompt + generated
    int32_t n_prompt = 0;
    int32_t max_new_tokens = 0;
    int32_t n_computed = 0;       // leading tokens with KV in the cache
    SeqStatus status = SeqStatus::kWaiting;
    BlockTable table;
    BlockTable local;             // local layers' table (hybrid models); empty otherwise
    SeqId after = -1;
    BlockHash cache_root = kRootBlockHash;  // parent hash of its block 0
    bool admitted_once = false;
    int32_t n_prefix_hit = 0;
    int32_t n_preemptions = 0;
    bool in_flight = false;       // in a plan not yet committed
    bool held = false;            // set_held
    bool prompt_logits = false;   // logits at every prompt position still wanted (add's prompt_logits)
    bool long_context = false;    // SchedulerConfig::long_context_after: the prompt is longer
  };
  Seq& get(SeqId id);
  const Seq& get(SeqId id) const;
  bool blocked_by_sibling(const Seq& s) const;
  void preempt(Seq& s, StepPlan& plan);
  // Finished while in flight: held in finishing_ until its plan ends.
  void end_flight(const ScheduledSeq& sc);
  // Frees the blocks a draft took beyond the sequence's next token.
  void drop_draft_blocks(Seq& s);
  // Sliding window: releases the blocks no query from s.n_computed on reads.
  void slide_window(Seq& s);
  // Grows both of s's tables to n_total_slots, first adopting the matches
  // (on empty tables); all-or-nothing over both pools: false changes nothing.
  bool allocate(Seq& s, int32_t n_total_slots, const PrefixMatch* match = nullptr,
                const PrefixMatch* local_match = nullptr);
  // Releases both of s's tables (finish, preemption).
  void free_tables(Seq& s);
  ScheduledSeq make_scheduled(const Seq& s, int32_t n_new, bool first) const;
  // n_new capped by the prompt-logit rows left in this step (s.prompt_logits);
  // 0: s waits for a later step.
  static int32_t cap_logit_rows(const Seq& s, int32_t n_new, int32_t* rows_left);

  SchedulerConfig config_;
  BlockPool pool_;
  std::optional<BlockPool> local_pool_;  // local layers (local_sliding_window > 0)
  std::unordered_map<SeqId, std::unique_ptr<Seq>> seqs_;
  std::unordered_map<SeqId, std::unique_ptr<Seq>> finishing_;  // finished in flight; blocks still held
  std::vector<SeqId> running_;    // admission order; the back is preempted first
  std::deque<SeqId> waiting_;     // preempted sequences go to the front
  int64_t n_preemptions_ = 0;
  int64_t n_blocks_slid_ = 0;
};

}  // namespace shardlm
