#include "engine/batch_builder.h"

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
    c.need_logits = s.need_logits;
    c.all_logits = s.all_logits;
    batch.seqs.push_back(std::move(c));
  }
  return batch;
}

}  // namespace shardlm
