// Per-request sampling parameters with vLLM's meanings and defaults.
// TODO(integrator): fold into shardlm::sampling's SamplingParams when that
// layer lands; the engine only needs sample_token() below.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace shardlm {

struct SamplingOptions {
  float temperature = 1.0f;          // 0 = greedy
  float top_p = 1.0f;                // (0, 1]
  int32_t top_k = 0;                 // <= 0 (or -1): off
  float min_p = 0.0f;                // [0, 1], relative to the most likely token
  float presence_penalty = 0.0f;     // [-2, 2], on generated tokens
  float frequency_penalty = 0.0f;    // [-2, 2], on generated tokens
  float repetition_penalty = 1.0f;   // > 0, on prompt and generated tokens
  std::optional<uint64_t> seed;      // reproducible regardless of batch composition
  int32_t logprobs = -1;             // -1: none; k >= 0: sampled token's logprob + k most likely
};

struct TokenLogprob {
  int32_t token_id = 0;
  float logprob = 0.0f;
};

// Log-probabilities of one generated token under the raw model distribution.
struct TokenLogprobs {
  int32_t token_id = 0;
  float logprob = 0.0f;
  int32_t rank = 0;                          // 1 = the most likely token
  std::vector<TokenLogprob> top;             // [sampling.logprobs] most likely, descending
};

// Throws kInvalidArgument naming the field, range and value.
void validate(const SamplingOptions& options, int64_t vocab_size);

// Everything sample_token needs to know about one sequence.
struct SamplingContext {
  std::span<const int32_t> prompt_ids;
  std::span<const int32_t> output_ids;        // generated so far
  uint64_t seed = 0;                          // per sequence
  std::span<const int32_t> banned_token_ids;  // -inf before sampling (EOS/stop ids under min_tokens)
};

struct SampleResult {
  int32_t token_id = 0;
  std::optional<TokenLogprobs> logprobs;
};

// logits: [vocab] raw model output of one sequence; modified in place.
// Deterministic in (logits, context): the random draw is a pure function of
// (seed, number of tokens generated so far), so the same seed gives the same
// tokens alone or in any batch, and after a preemption.
SampleResult sample_token(std::span<float> logits, const SamplingOptions& options, const SamplingContext& context);

}  // namespace shardlm
