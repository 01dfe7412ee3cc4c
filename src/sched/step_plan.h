// What the scheduler decided for one engine step: plain data with named
// fields. The engine turns it into a ForwardBatch (engine/batch_builder.h);
// sched does not include model (DESIGN.md §2).
#pragma once

#include <cstdint>
#include <vector>

namespace shardlm {

using SeqId = int64_t;

struct ScheduledSeq {
  SeqId seq_id = 0;
  int32_t n_past = 0;                  // tokens already in its KV cache
  int32_t n_tokens = 0;                // new tokens computed this step (positions n_past ..)
  std::vector<int32_t> token_ids;      // [n_tokens]
  std::vector<int32_t> block_table;    // covers positions [0, n_past + n_tokens + n_draft)
  // Hybrid models (SchedulerConfig::local_sliding_window): the local layers'
  // blocks in their own pool for the same positions, kNoBlock (-1) before the
  // window; empty when every layer uses block_table.
  std::vector<int32_t> local_block_table;
  bool need_logits = false;            // the chunk reaches the sequence's last token: sample after it
  bool first_chunk = false;            // first compute of this sequence since it was (re)admitted
  // Prompt logprobs: logits for every position of this chunk (all prompt
  // positions), not only the last; at most max_prompt_logit_rows such rows
  // per step, over all sequences.
  bool all_logits = false;
  bool long_context = false;           // LongRoPE: the prompt is longer than original_max_position_embeddings
  // Speculative decoding (Scheduler::add_draft): a decode (n_tokens == 1)
  // may carry drafted tokens [n_draft] fed at positions n_past + 1 ..; each
  // of its 1 + n_draft rows produces logits (engine/speculation.h).
  std::vector<int32_t> draft_ids;
  // Logit rows this sequence gets in the step's logits, in plan order.
  int64_t n_logit_rows() const {
    return all_logits ? n_tokens : need_logits ? 1 + static_cast<int64_t>(draft_ids.size()) : 0;
  }
};

struct StepPlan {
  std::vector<ScheduledSeq> seqs;      // [n_seqs] running sequences first, then newly admitted
  std::vector<SeqId> preempted;        // freed this step; recomputed later from their tokens
  std::vector<int32_t> freed_blocks;   // blocks released by those preemptions (informational)
  int32_t n_scheduled_tokens = 0;      // sum of n_tokens and drafts, <= max_num_batched_tokens
  bool empty() const { return seqs.empty(); }
};

}  // namespace shardlm
