// A draft model for speculative decoding (`--speculative-config
// '{"model": DIR, "num_speculative_tokens": k}'`, vLLM's keys): a smaller
// checkpoint with the target's vocabulary proposes k tokens greedily, and the
// target verifies them in one (k+1)-row step as it does n-gram drafts
// (model/generate.cpp, engine/speculation.cpp), so the output is the
// target's whatever the draft says.
//
// Placement: the draft runs whole (TP 1, PP 1) beside the target's driver
// rank: generate gives it that rank's backend; serve gives each replica's
// engine a draft on a backend of its own on the driver's device, since the
// engine thread runs it between steps. The other ranks receive its tokens
// with the verification step.
//
// Its paged KV cache (serve: as many tokens as the target's) holds each
// sequence in blocks of its own (a free list; no prefix sharing). For each
// sequence propose() keeps the KV of the longest prefix it fed before that
// the context still has (the prompt, the accepted drafts) and feeds only the
// rest; the sequences of one call share each forward step (one row each
// after the first, catch-up, step). A sequence that needs blocks when none
// are free takes those of the least recently used sequence outside the call;
// if there are none, it gets no draft this time.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <unordered_map>
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
  // max_len: the longest context one sequence will have (prompt + max_tokens);
  // n_blocks: its KV cache's blocks of block_size (0: one sequence of max_len;
  // serve: plan's draft_kv_blocks). max_step_tokens / max_step_seqs > 0 bound
  // each forward step to that many tokens and sequences (a long catch-up is
  // fed in chunks), and its step buffers are reserved here, once, for that
  // size (plan's draft_workspace_bytes: serve passes max_num_batched_tokens
  // and max_num_seqs); 0: unbounded, buffers grown on demand (generate).
  DraftModel(const std::filesystem::path& dir, int64_t target_vocab, std::shared_ptr<backend::Backend> backend,
             int64_t max_len, int64_t block_size, DType kv_dtype, int64_t n_blocks = 0, int64_t max_step_tokens = 0,
             int64_t max_step_seqs = 0);
  ~DraftModel();

  struct Query {
    int64_t id = 0;                     // the sequence's key across calls (serve: its SeqId)
    std::span<const int32_t> context;   // [n]: prompt, then what it produced
    int64_t max_draft = 0;
  };
  // For each query, up to max_draft greedy tokens (lowest id on ties) after
  // its context; empty where it has nothing to say (past its own context
  // length, or no KV blocks to be had).
  std::vector<std::vector<int32_t>> propose(std::span<const Query> queries);
  // One sequence (generate's).
  std::vector<int32_t> propose(std::span<const int32_t> context, int64_t max_draft);
  // Frees a sequence's blocks (it finished); unknown ids are ignored.
  void release(int64_t id);

  int64_t weight_bytes() const;                           // measured as loaded (CausalLM::weight_bytes)
  int64_t kv_bytes() const { return cache_.bytes(); }     // measured (KvCache::bytes)
  // With bounded steps: what the backend's allocator obtained for the step
  // buffers reserved at load, plus the host logits rows' capacity (measured); else 0.
  int64_t workspace_bytes() const { return workspace_bytes_; }
  int64_t n_sequences_held() const { return static_cast<int64_t>(seqs_.size()); }
  const ModelSpec& spec() const { return spec_; }

 private:
  struct Sequence {
    std::vector<int32_t> blocks;  // [ceil(positions / block_size)]: its block table
    std::vector<int32_t> fed;     // tokens whose KV the cache holds, from position 0
    uint64_t last_use = 0;
  };
  // Gives s blocks for n_positions, evicting least recently used sequences
  // whose id is not in `busy`; false (nothing changed) when that cannot be.
  bool reserve(Sequence& s, int64_t n_positions, std::span<const Query> busy);

  ModelSpec spec_;
  int64_t vocab_;  // ids it may propose: both models' vocabularies
  int64_t max_len_;
  int64_t block_size_;
  int64_t max_step_tokens_;  // per forward step; INT64_MAX: unbounded
  int64_t max_step_seqs_;
  int64_t workspace_bytes_ = 0;
  std::vector<std::unique_ptr<Communicator>> comms_;  // a one-rank world: its tp and pp groups
  std::unique_ptr<CausalLM> model_;
  KvCache cache_;
  std::vector<int32_t> free_blocks_;  // a stack
  std::unordered_map<int64_t, Sequence> seqs_;
  uint64_t clock_ = 0;
  std::vector<float> logits_;  // [rows <= max_step_seqs_, spec_.vocab_size]
};

}  // namespace shardlm
