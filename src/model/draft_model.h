// A draft model for speculative decoding (`--speculative-config
// '{"model": DIR, "num_speculative_tokens": k}'`, vLLM's keys): a smaller
// checkpoint with the target's vocabulary proposes k tokens greedily, and the
// target verifies them in one (k+1)-row step as it does n-gram drafts
// (model/generate.cpp), so the output is the target's whatever the draft says.
//
// Placement: the draft runs whole (TP 1, PP 1) on the target's driver rank,
// on that rank's device, beside the target's shard; the other ranks receive
// its tokens with the verification step. Its KV cache holds one sequence of
// the target's length: propose() keeps the longest prefix of what it fed that
// still matches the context (the accepted drafts) and feeds only the rest.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "loader/model_spec.h"
#include "model/causal_lm.h"
#include "model/kv_cache.h"

namespace shardlm {

// Refuses a draft whose vocabulary is not the target's, naming both: the
// tokenizers (tokenizer.json's vocabulary and added tokens, where both
// directories have one) must map the same ids, and the draft may not propose
// ids past the target's vocab_size. Embedding padding may differ (Qwen2.5's
// 151936 vs 152064 rows): the draft's proposals are cut to the ids both have.
void check_draft_vocabulary(const std::filesystem::path& target_dir, const ModelSpec& target,
                            const std::filesystem::path& draft_dir, const ModelSpec& draft);

class DraftModel {
 public:
  // max_len: the longest context it will see (prompt + max_tokens).
  DraftModel(const std::filesystem::path& dir, int64_t target_vocab, std::shared_ptr<backend::Backend> backend,
             int64_t max_len, int64_t block_size, DType kv_dtype);
  ~DraftModel();

  // Up to max_draft greedy tokens (lowest id on ties) after context [n].
  std::vector<int32_t> propose(std::span<const int32_t> context, int64_t max_draft);

  int64_t weight_bytes() const;                           // measured as loaded (CausalLM::weight_bytes)
  int64_t kv_bytes() const { return cache_.bytes(); }     // measured (KvCache::bytes)
  const ModelSpec& spec() const { return spec_; }

 private:
  ModelSpec spec_;
  int64_t vocab_;  // ids it may propose: both models' vocabularies
  int64_t max_len_;
  std::vector<std::unique_ptr<Communicator>> comms_;  // a one-rank world: its tp and pp groups
  std::unique_ptr<CausalLM> model_;
  KvCache cache_;
  std::vector<int32_t> table_;
  std::vector<int32_t> fed_;  // tokens whose KV the cache holds, from position 0
  std::vector<float> logits_;
};

}  // namespace shardlm
