#include "engine/batch_builder.h"

#include <cstddef>

namespace shardlm {

ForwardBatch make_forward_batch(const StepPlan& plan) {
  ForwardBatch batch;
  batch.token_ids.reserve(plan.n_scheduled_tokens);
  batch.seqs.reserve(plan.seqs.size());
  for (const ScheduledSeq& s : plan.seqs) {
    batch.token_ids.insert(batch.token_ids.end(), s.token_ids.begin(), s.token_ids.end());
    SequenceChunk c;
    c.n_tokens = s.n_tokens;
    c.n_past = s.n_past;
    c.block_table = s.block_table;
    c.local_block_table = s.local_block_table;
    c.need_logits = s.need_logits;
    c.all_logits = s.all_logits;
    c.long_context = s.long_context;
    batch.seqs.push_back(std::move(c));
    // Drafts: one single-token row each over the same block table, at the
    // positions after the fed token; on the batch-invariant kernels row j
    // computes what a 1-row decode step at n_past + j would, attending to
    // the rows before it (they write their KV in the same step).
    for (std::size_t j = 0; j < s.draft_ids.size(); ++j) {
      batch.token_ids.push_back(s.draft_ids[j]);
      SequenceChunk d;
      d.n_tokens = 1;
      d.n_past = s.n_past + s.n_tokens + static_cast<int32_t>(j);
      d.block_table = s.block_table;
      d.local_block_table = s.local_block_table;
      d.need_logits = true;
      d.long_context = s.long_context;
      batch.seqs.push_back(std::move(d));
    }
  }
  return batch;
}

}  // namespace shardlm
