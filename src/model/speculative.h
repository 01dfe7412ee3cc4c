// Prompt-lookup (n-gram) speculative decoding for generate: draft up to k
// tokens by finding the context's last n tokens (n from prompt_lookup_max
// down to prompt_lookup_min) earlier in the context and proposing what
// followed there; the target verifies all of them in one (k+1)-row step on
// the batch-invariant path, so each row's logits equal a 1-row decode step's
// bit for bit and greedy output is unchanged. Rejected positions are rolled
// back by truncating the sequence's n_past: their KV slots are never read and
// the next step overwrites them.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace shardlm {

struct SpeculativeOptions {
  int32_t num_speculative_tokens = 0;  // k; 0: no speculation
  int32_t prompt_lookup_min = 1;       // shortest n-gram matched
  int32_t prompt_lookup_max = 0;       // longest n-gram matched (>= min)
  // vLLM's disable_by_batch_size: no drafting in a step holding more decodes
  // than this (serve; 0: the engine's measured default, engine/speculation.h).
  int32_t disable_by_batch_size = 0;
  // vLLM's "model": a draft checkpoint's directory (model/draft_model.h)
  // instead of prompt lookup; "" for method ngram.
  std::string draft_model;
  bool enabled() const { return num_speculative_tokens > 0; }
  bool uses_draft_model() const { return enabled() && !draft_model.empty(); }
  // When enabled: 1 <= num_speculative_tokens <= 64 and, for ngram, 1 <=
  // prompt_lookup_min <= prompt_lookup_max; throws kInvalidArgument naming
  // the key (--speculative-config).
  void validate() const;
};

// Counters of one request (vLLM's spec_decode_num_drafts / _draft_tokens / _accepted_tokens).
struct SpeculativeStats {
  int64_t n_drafts = 0;           // verification steps with at least one drafted token
  int64_t n_draft_tokens = 0;     // tokens proposed
  int64_t n_accepted_tokens = 0;  // proposed tokens the target produced itself
};

// Up to max_draft tokens that followed the most recent earlier occurrence of
// context's longest matching suffix (preferring one followed by a full k);
// empty when none matches.
// context: [n] token ids (prompt, then generated).
std::vector<int32_t> ngram_draft(std::span<const int32_t> context, const SpeculativeOptions& options,
                                 int64_t max_draft);

}  // namespace shardlm
