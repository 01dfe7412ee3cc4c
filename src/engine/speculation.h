// n-gram (prompt-lookup) speculative decoding in the engine, `serve
// --speculative-config` (the same drafting as generate: model/speculative.h).
//
// Per step, each decoding sequence (when the step holds at most
// speculative_max_decodes decodes; under a grammar, one whose walks are fast)
// gets up to k tokens proposed by ngram_draft over its prompt + output,
// clamped by what it may still produce and the model length;
// Scheduler::add_draft gives it KV slots for them (free blocks only: a
// draft never preempts). The batch then carries 1 + d single-token rows for
// it (engine/batch_builder.cpp), each with logits: row j is what a 1-row
// decode step after the first j drafts would compute (batch-invariant
// kernels), so verification is plain sampling, row by row, with the
// sequence's own sampler, accepting while the sampled token equals the
// draft (sampling/speculative_sampling.h: at temperature > 0 that is
// rejection sampling with a one-hot draft, and it preserves the target
// distribution). The accepted drafts and the token after them (the
// correction, or the bonus when all were accepted) go through the normal
// per-token path (stop strings, EOS, max_tokens, logprobs); Scheduler::commit
// cuts the rejected rows off the sequence's length and frees the blocks only
// they used, registering no block that holds their KV.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "engine/request.h"
#include "grammar/compiled_grammar.h"
#include "model/speculative.h"
#include "sampling/sampler.h"

namespace shardlm {

// The auto-off bound (EngineConfig::speculative_max_decodes): measured on a
// 2-core Zen 5 (README "Speculative decoding").
constexpr int32_t kDefaultSpeculativeMaxDecodes = 4;

// Verification of one sequence's rows.
struct VerifiedDraft {
  int32_t n_accepted = 0;  // leading drafts the target produced itself
  int32_t token = -1;      // the token after them: the target's correction, or the bonus after all d
  std::vector<std::optional<TokenLogprobs>> logprobs;  // [n_accepted + 1] when asked for, else empty
};

// Structured output: how many leading tokens of `draft` the grammar accepts
// from the matcher's state, each leaving a state where some token may follow
// (or the last ending the grammar). The matcher is left as it was; the masks
// it walked are cached for the rows (Engine::mask_draft_rows).
size_t grammar_draft_prefix(grammar::GrammarMatcher& matcher, std::span<const int32_t> draft);

// rows: [draft.size() + 1, vocab] logits, row j after the fed token and
// drafts [0, j). Samples row by row with `sampler` (its penalties and RNG
// advance by exactly the tokens produced), stopping at the first row whose
// token differs from its draft. want_logprobs: each produced token's raw
// logprob, rank and the sampler's top alternatives, as without speculation.
VerifiedDraft verify_draft_rows(Sampler& sampler, std::span<const int32_t> draft, const float* rows, int64_t vocab,
                                bool want_logprobs);

}  // namespace shardlm
