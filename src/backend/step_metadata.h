// What every op of one step needs to know about the batch, packed once per
// step into a single int32 buffer so that a device backend uploads it in one
// copy (begin_step) instead of one small copy per op and layer:
//
//   packed = [ token_ids  (n_tokens)
//            | positions  (n_tokens)
//            | logit_rows (n_logits)          token index whose logits are wanted
//            | seq records (n_seqs × 5)       token_begin, n_tokens, n_past, table_offset, n_table
//            | block tables (sum of n_table)
//            | local block tables (sum of n_local_table) ]  hybrid models' local layers (group 1)
//
// The host views (positions(), seqs(), ...) point into the same buffer. The
// object is reused from step to step, so after the first steps packing
// allocates nothing.
#pragma once

#include <climits>
#include <cstdint>
#include <span>
#include <vector>

#include "backend/op_args.h"

namespace shardlm::backend {

class StepMetadata {
 public:
  static constexpr int kSeqRecord = 5;

  // Starts a new step.
  void clear();
  // Appends one sequence's chunk: token ids at positions n_past .. n_past +
  // ids.size() - 1, with the block table covering them; n_logit_rows asks
  // for the logits of its last n_logit_rows new tokens (1: the one sampled;
  // ids.size(): every position, for prompt logprobs; a bool converts).
  // Positions at or past long_rope_from rotate with LongRoPE's long factors
  // (ModelSpec::long_context: 0 for a long prompt, else
  // original_max_position_embeddings); kNoLongRope for none.
  static constexpr int32_t kNoLongRope = INT32_MAX;
  // local_block_table: the same positions in the local layers' pool (a
  // KvLayerView of group 1 reads it through seqs(1)); empty when every layer
  // uses block_table.
  void add_seq(std::span<const int32_t> ids, int32_t n_past, std::span<const int32_t> block_table,
               int32_t n_logit_rows, int32_t long_rope_from = kNoLongRope,
               std::span<const int32_t> local_block_table = {});
  // Appends n padding rows after the sequences (a CUDA-graph bucket's spare
  // rows): each is one token (id 0, position 0) with its own logit row and a
  // sequence record of n_tokens = 0, n_past = 0 and no block table, which
  // every op skips (no KV write, no attention). A step of k decode sequences
  // padded to a bucket of b rows then has n_tokens = n_seqs = n_logits = b,
  // so its packed layout (every offset below) depends on b alone.
  void add_padding_rows(int64_t n);
  // Lays out the packed buffer and the host views; call after the last add_seq.
  void finish();

  int64_t n_tokens() const { return n_tokens_; }
  int64_t n_seqs() const { return static_cast<int64_t>(seqs_.size()); }
  int64_t n_logits() const { return n_logits_; }
  int64_t n_padding() const { return n_padding_; }  // padding rows, the last of the seqs / tokens / logits
  const int32_t* token_ids() const { return packed_.data(); }                       // [n_tokens]
  const int32_t* positions() const { return packed_.data() + n_tokens_; }           // [n_tokens]
  const int32_t* logit_rows() const { return packed_.data() + 2 * n_tokens_; }      // [n_logits]
  const AttentionSeq* seqs() const { return seqs_.data(); }                         // [n_seqs], host pointers
  // The same chunks over the tables of KvLayerView::group (1: the local tables).
  const AttentionSeq* seqs(int32_t group) const { return group == 1 ? local_seqs_.data() : seqs_.data(); }
  // [n_tokens] on the host: 1 where the token rotates with the long rope
  // table; nullptr when none does (the step's every token takes the first).
  const uint8_t* long_rope() const { return long_rope_.empty() ? nullptr : long_rope_.data(); }
  std::span<const int32_t> packed() const { return packed_; }
  // Offsets into packed() of each part, for a device copy of it.
  int64_t seq_records_offset() const { return 2 * n_tokens_ + n_logits_; }
  int64_t block_tables_offset() const { return seq_records_offset() + kSeqRecord * n_seqs(); }

 private:
  struct Pending {
    int32_t n_tokens, n_past, table_offset, n_table;
    int32_t local_offset, n_local;  // into local_tables_
    int32_t n_logit_rows;  // the last n_logit_rows tokens
    int32_t long_rope_from;
  };
  std::vector<int32_t> ids_, tables_, local_tables_;  // staging of add_seq
  std::vector<Pending> pending_;
  std::vector<int32_t> packed_;
  std::vector<AttentionSeq> seqs_;
  std::vector<AttentionSeq> local_seqs_;  // [n_seqs] over the local tables
  std::vector<uint8_t> long_rope_;  // host only: no device kernel reads it (CUDA refuses the long table)
  int64_t n_tokens_ = 0, n_logits_ = 0, n_padding_ = 0, n_padding_pending_ = 0;
};

}  // namespace shardlm::backend
