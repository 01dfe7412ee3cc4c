// A generation request as the engine takes it (already tokenized) and the
// outputs it streams back. The HTTP layer maps OpenAI JSON onto these.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "grammar/compiled_grammar.h"
#include "sampling/sampler.h"
#include "sampling/sampling_params.h"

namespace shardlm {

struct StopOptions {
  int32_t max_tokens = 16;                   // generated tokens per sequence, >= 1
  int32_t min_tokens = 0;                    // EOS / stop tokens / stop strings ignored before this many
  bool ignore_eos = false;                   // keep generating past EOS (still stops at max_tokens)
  std::vector<int32_t> stop_token_ids;       // finish "stop" when sampled (besides EOS)
  std::vector<std::string> stop;             // finish "stop" when the text contains one; text ends before it
  bool include_stop_str_in_output = false;
};

struct EngineRequest {
  std::string request_id;                    // unique among live requests
  std::vector<int32_t> prompt_token_ids;     // [n_prompt]
  SamplingParams sampling;                   // validated at submit; seed + i for sequence i of n
  bool logprobs = false;                     // return each token's logprob (+ sampling.logprobs alternatives)
  // >= 0: each prompt token's logprob and rank under the model, with this
  // many most likely alternatives (vLLM's prompt_logprobs; at most the
  // vocabulary). Its prompt is computed in full (no prefix-cache hit).
  int32_t prompt_logprobs = -1;
  StopOptions stop;
  int32_t n = 1;                             // sequences sharing this prompt (its cached KV blocks)
  bool skip_special_tokens = true;           // passed to the detokenizer
  std::string cache_salt;                    // non-empty: shares cached prefix blocks only with the same salt
  // Structured output: each sequence's tokens are constrained to this
  // grammar (compiled for this model's vocabulary; its stop ids are the EOS
  // tokens). The sequence finishes "stop" as soon as the grammar is complete
  // and nothing may follow, or with EOS where it is complete; min_tokens
  // does not delay that end.
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
};

// Log-probabilities of one generated token under the raw model distribution
// (log_softmax of the logits, before penalties and temperature).
struct TokenLogprobs {
  int32_t token_id = 0;
  float logprob = 0.0f;
  int32_t rank = 0;                          // 1 = the most likely token
  std::vector<TokenLogprob> top;             // [sampling.logprobs] most likely, descending (sampling/sampler.h)
};

enum class FinishReason { kNone, kStop, kLength, kAbort };
const char* finish_reason_name(FinishReason reason);  // "", "stop", "length", "abort"

// One callback per sequence per step in which it produced a token (per
// token when speculative decoding produced several in one step), and one
// last callback carrying finish_reason (which may also carry the last token).
struct SequenceOutput {
  std::string request_id;
  int32_t index = 0;                         // which of the request's n sequences
  std::vector<int32_t> new_token_ids;        // tokens generated since the previous callback
  std::string text_delta;                    // final text since the previous callback
  std::vector<TokenLogprobs> logprobs;       // [new_token_ids.size()] if request.logprobs
  // [n_prompt - 1] when request.prompt_logprobs >= 0, on the first output of
  // sequence 0 only: entry i is prompt token i + 1 given tokens 0..i (token 0
  // has no logprob: nothing precedes it), with request.prompt_logprobs top.
  std::vector<TokenLogprobs> prompt_logprobs;
  FinishReason finish_reason = FinishReason::kNone;
  std::optional<std::string> stop_string;    // the stop string that ended it
  std::optional<int32_t> stop_token_id;      // or the stop/EOS token that ended it
  std::string error;                         // non-empty when the engine failed this sequence
  // Usage so far for this sequence.
  int32_t n_prompt_tokens = 0;
  int32_t n_completion_tokens = 0;
  int32_t n_cached_tokens = 0;               // prompt tokens served by the prefix cache
  // Timing, from submit() (steady clock): to this output, and to the request's first token.
  double elapsed_s = 0.0;
  double time_to_first_token_s = -1.0;        // < 0 until the first token
  bool request_finished = false;             // every sequence of the request has finished: last callback
  bool finished() const { return finish_reason != FinishReason::kNone; }
};

// Called on the engine thread: keep it short (post to the HTTP thread's
// queue) and do not call back into the engine except submit/abort.
struct RequestCallbacks {
  std::function<void(const SequenceOutput&)> on_output;
};

}  // namespace shardlm
