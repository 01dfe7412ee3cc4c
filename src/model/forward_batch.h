// What one engine step asks the model to compute: for each scheduled
// sequence, a chunk of new tokens appended after the tokens already in its
// paged KV cache. Prefill and decode are the same thing (a decode is a chunk
// of one token); a long prompt is prefilled in several chunks over several
// steps. Plain data, produced by the scheduler, identical on every rank.
#pragma once

#include <cstdint>
#include <vector>

namespace shardlm {

struct SequenceChunk {
  int32_t n_tokens = 0;  // new tokens of this sequence in this step
  int32_t n_past = 0;    // tokens already in its KV cache; new positions are n_past .. n_past+n_tokens-1
  // KV blocks holding positions [0, n_past + n_tokens): block_table[p / block_size].
  std::vector<int32_t> block_table;
  bool need_logits = false;  // return logits for the last new token
  // Prompt logprobs: logits for EVERY new token of the chunk, in position
  // order (rows n_past .. n_past+n_tokens-1), not only the last. The engine
  // bounds how many such rows a step holds (SchedulerConfig::max_prompt_logit_rows).
  bool all_logits = false;
  // LongRoPE (ModelSpec::long_context): the sequence's prompt was longer than
  // original_max_position_embeddings, so every position rotates with the long
  // factors; otherwise only positions from there on do. Fixed for the life of
  // the sequence (a recomputed one keeps it).
  bool long_context = false;
  // Hybrid models whose local (sliding-window) layers keep their KV in a pool
  // of their own (KvCache's group 1): the blocks of the same positions there,
  // kNoBlock (-1) for those that left the window. Empty: every layer uses
  // block_table.
  std::vector<int32_t> local_block_table;
  // Logit rows this chunk asks for: n_tokens (all_logits), 1 (need_logits) or 0.
  int32_t n_logit_rows() const { return all_logits ? n_tokens : need_logits ? 1 : 0; }
};

struct ForwardBatch {
  std::vector<int32_t> token_ids;    // [sum n_tokens]: the sequences' chunks, concatenated in order
  std::vector<SequenceChunk> seqs;   // [n_seqs]
  int64_t n_tokens() const { return static_cast<int64_t>(token_ids.size()); }
  int64_t n_logits() const {
    int64_t n = 0;
    for (const auto& s : seqs) n += s.n_logit_rows();
    return n;
  }
};

}  // namespace shardlm
