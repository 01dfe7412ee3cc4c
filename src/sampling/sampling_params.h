// Per-request sampling parameters, with vLLM's meaning and OpenAI's ranges.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace shardlm {

// temperature below this is greedy (vLLM's _SAMPLING_EPS).
constexpr double kGreedyTemperature = 1e-5;
// Most top logprobs one request may ask for (vLLM's default max_logprobs).
constexpr int32_t kMaxLogprobs = 20;

struct SamplingParams {
  double temperature = 1.0;         // [0, 2]; < kGreedyTemperature: greedy (argmax, lowest id on ties)
  double top_p = 1.0;               // (0, 1]: smallest set of most likely tokens with mass >= top_p
  int32_t top_k = -1;               // -1 (or 0): off; else keep the k most likely tokens
  double min_p = 0.0;               // [0, 1]: drop tokens with p < min_p * p_max
  double presence_penalty = 0.0;    // [-2, 2]: subtracted once from each token already in the output
  double frequency_penalty = 0.0;   // [-2, 2]: subtracted per occurrence in the output
  double repetition_penalty = 1.0;  // (0, 2]: prompt+output tokens: positive logits / p, negative * p
  std::optional<uint64_t> seed = std::nullopt;  // set: the same tokens every run, whatever the batch
  int32_t logprobs = 0;             // [0, kMaxLogprobs]: top alternatives returned per token
  // false: sample() skips the raw log_softmax pass when logprobs == 0 and
  // leaves SampleResult::logprob at 0 (the engine asks only for requests
  // that return logprobs).
  bool return_logprob = true;
  // (token id, bias in [-100, 100]) added to that token's logit before the
  // penalties (OpenAI's logit_bias; -100 bans a token, +100 all but forces it).
  std::vector<std::pair<int32_t, float>> logit_bias = {};

  bool greedy() const { return temperature < kGreedyTemperature; }
  // Throws Error(kInvalidArgument) naming the first parameter out of range,
  // its value and the allowed range.
  void validate() const;
};

}  // namespace shardlm
