#include "backend/step_metadata.h"

#include "core/error.h"

namespace shardlm::backend {

void StepMetadata::clear() {
  ids_.clear();
  tables_.clear();
  local_tables_.clear();
  local_seqs_.clear();
  pending_.clear();
  packed_.clear();
  seqs_.clear();
  long_rope_.clear();
  n_tokens_ = n_logits_ = n_padding_ = n_padding_pending_ = 0;
}

void StepMetadata::add_padding_rows(int64_t n) {
  SHARDLM_CHECK(n >= 0, "padding rows: ", n);
  n_padding_pending_ += n;
}

void StepMetadata::add_seq(std::span<const int32_t> ids, int32_t n_past, std::span<const int32_t> block_table,
                           int32_t n_logit_rows, int32_t long_rope_from,
                           std::span<const int32_t> local_block_table) {
  if (ids.empty() || n_past < 0)
    fail(ErrorCode::kInvalidArgument, "forward batch: a sequence chunk needs at least one new token and n_past >= 0");
  if (n_logit_rows < 0 || n_logit_rows > static_cast<int64_t>(ids.size()))
    fail(ErrorCode::kInvalidArgument, "forward batch: ", n_logit_rows, " logit rows for a chunk of ", ids.size(), " tokens");
  pending_.push_back({static_cast<int32_t>(ids.size()), n_past, static_cast<int32_t>(tables_.size()),
                      static_cast<int32_t>(block_table.size()), static_cast<int32_t>(local_tables_.size()),
                      static_cast<int32_t>(local_block_table.size()), n_logit_rows, long_rope_from});
  ids_.insert(ids_.end(), ids.begin(), ids.end());
  tables_.insert(tables_.end(), block_table.begin(), block_table.end());
  local_tables_.insert(local_tables_.end(), local_block_table.begin(), local_block_table.end());
}

void StepMetadata::finish() {
  n_padding_ = n_padding_pending_;
  const int64_t n_real_tokens = static_cast<int64_t>(ids_.size());
  n_tokens_ = n_real_tokens + n_padding_;
  n_logits_ = n_padding_;
  for (const Pending& p : pending_) n_logits_ += p.n_logit_rows;
  const int64_t n_real_seqs = static_cast<int64_t>(pending_.size());
  const int64_t n_seqs = n_real_seqs + n_padding_;
  packed_.resize(static_cast<size_t>(2 * n_tokens_ + n_logits_ + kSeqRecord * n_seqs) + tables_.size() +
                 local_tables_.size());
  int32_t* ids = packed_.data();
  int32_t* pos = ids + n_tokens_;
  int32_t* logit_rows = pos + n_tokens_;
  int32_t* records = logit_rows + n_logits_;
  int32_t* tables = records + kSeqRecord * n_seqs;
  std::copy(ids_.begin(), ids_.end(), ids);
  int32_t* local_tables = tables + tables_.size();
  std::copy(tables_.begin(), tables_.end(), tables);
  std::copy(local_tables_.begin(), local_tables_.end(), local_tables);
  seqs_.resize(static_cast<size_t>(n_seqs));
  local_seqs_.resize(static_cast<size_t>(n_seqs));
  int32_t begin = 0, n_rows = 0;
  bool any_long = false;
  for (const Pending& p : pending_) any_long = any_long || p.n_past + p.n_tokens > p.long_rope_from;
  if (any_long) long_rope_.assign(static_cast<size_t>(n_tokens_), 0);
  for (int64_t s = 0; s < n_real_seqs; ++s) {
    const Pending& p = pending_[static_cast<size_t>(s)];
    for (int32_t t = 0; t < p.n_tokens; ++t) pos[begin + t] = p.n_past + t;
    if (any_long)
      for (int32_t t = 0; t < p.n_tokens; ++t) long_rope_[static_cast<size_t>(begin + t)] = p.n_past + t >= p.long_rope_from;
    for (int32_t t = p.n_tokens - p.n_logit_rows; t < p.n_tokens; ++t) logit_rows[n_rows++] = begin + t;
    int32_t* r = records + kSeqRecord * s;
    r[0] = begin, r[1] = p.n_tokens, r[2] = p.n_past, r[3] = p.table_offset, r[4] = p.n_table;
    seqs_[static_cast<size_t>(s)] = {begin, p.n_tokens, p.n_past, tables + p.table_offset, p.n_table};
    local_seqs_[static_cast<size_t>(s)] = {begin, p.n_tokens, p.n_past, local_tables + p.local_offset, p.n_local};
    begin += p.n_tokens;
  }
  for (int64_t s = n_real_seqs; s < n_seqs; ++s, ++begin) {
    ids[begin] = 0;
    pos[begin] = 0;
    logit_rows[n_rows++] = begin;
    int32_t* r = records + kSeqRecord * s;
    r[0] = begin, r[1] = 0, r[2] = 0, r[3] = 0, r[4] = 0;
    seqs_[static_cast<size_t>(s)] = {begin, 0, 0, tables, 0};
    local_seqs_[static_cast<size_t>(s)] = {begin, 0, 0, local_tables, 0};
  }
}

}  // namespace shardlm::backend
