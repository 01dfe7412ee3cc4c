// Turns one row of logits into the next token of one sequence.
//
// Order (vLLM v1): penalties (repetition over prompt+output, frequency and
// presence over output) -> greedy argmax if temperature == 0, else
// temperature -> min_p -> top_k -> top_p -> draw from the renormalised
// distribution with the sequence's own RNG.
//
// Logprobs are those of the RAW model distribution, log_softmax(logits)
// before penalties, temperature and filtering (vLLM's default
// logprobs_mode "raw_logprobs"; OpenAI's API means the same).
//
// RNG: std::mt19937_64 seeded with params.seed (or from std::random_device
// when unset); each non-greedy token consumes exactly one 64-bit draw, turned
// into u in [0, 1) as (x >> 11) * 2^-53, and the token is the first (in
// token-id order) whose cumulative kept probability exceeds u * total (the
// sums taken by blocks of 16: sampling/speculative_sampling.h). The state
// belongs to the sequence, so batching never changes a seeded result; and
// the vocabulary passes (sampling/vocab_kernels.h) give the same bits on
// every instruction set, so the same logits give the same tokens on any CPU.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
#include <vector>

#include "sampling/sampling_params.h"

namespace shardlm {

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;  // log_softmax of the raw logits
};

struct SampleResult {
  int32_t token = 0;
  float logprob = 0.0f;                   // of the chosen token, raw distribution
  std::vector<TokenLogprob> top_logprobs; // [params.logprobs], most likely first, lowest id on ties
};

// Reusable buffers of filter_tokens and draw_unfiltered (below). The
// vocab-sized ones are written by 16-wide stores: keep them [vocab] long.
struct SamplingScratch {
  std::vector<float> weight;     // [vocab] capacity
  std::vector<int32_t> kept;     // [vocab] capacity
  std::vector<int32_t> order;    // [vocab] capacity: candidates being selected
  std::vector<std::pair<float, int32_t>> heap;  // [k]: (logit, id), least likely on top
  std::vector<double> bucket_mass;              // top_p: mass per logit bucket
  std::vector<double> block_sum;                // [vocab / 16] draw_unfiltered's block sums
};

// Sampling state of one sequence: its parameters, the tokens penalties look
// at, and its RNG. Not thread-safe; one per sequence, so the sequences of a
// batch can be sampled in parallel. The scratch sample() works in is per
// thread (a few vocab-sized buffers, grown once), so after the first call a
// thread's sample() allocates nothing unless top logprobs are asked for.
class Sampler {
 public:
  // Validates params (throws Error(kInvalidArgument)); vocab_size > 0.
  // Prompt ids outside [0, vocab_size) are ignored by the penalties.
  Sampler(const SamplingParams& params, std::span<const int32_t> prompt_ids, int64_t vocab_size);
  virtual ~Sampler() = default;  // tests substitute a sampler that fails on cue

  // logits: [vocab_size] f32 of the sequence's last position. Returns the
  // chosen token and records it as an output token. Throws
  // Error(kInvalidArgument) if logits.size() != vocab_size.
  virtual SampleResult sample(std::span<const float> logits);

  // Records an output token chosen elsewhere (resuming after preemption,
  // forced tokens): it counts for penalties but consumes no randomness.
  void accept(int32_t token);

  const SamplingParams& params() const { return params_; }
  const std::vector<int32_t>& output_ids() const { return output_ids_; }

 private:
  SamplingParams params_;
  int64_t vocab_size_;
  bool penalised_;                                    // any of the three penalties is on
  std::vector<uint8_t> in_prompt_;                    // [vocab_size] when repetition_penalty != 1: 1 if in the prompt
  std::unordered_map<int32_t, int32_t> output_count_; // token -> occurrences in the output (kept when penalised_)
  std::vector<int32_t> output_ids_;
  std::mt19937_64 rng_;
};

// Applies the penalties of params to logits in place (exposed for tests).
// output_count: occurrences in the output; in_prompt: [vocab] flags.
void apply_penalties(const SamplingParams& params, std::span<float> logits, std::span<const uint8_t> in_prompt,
                     const std::unordered_map<int32_t, int32_t>& output_count);

// The distribution sample() draws from: probabilities [vocab] after
// temperature, min_p, top_k and top_p (zeros for dropped tokens, summing to
// 1), for already-penalised logits. Not for greedy params.
std::vector<double> sampling_distribution(const SamplingParams& params, std::span<const float> logits);

// The tokens that survive temperature, min_p, top_k and top_p, for
// already-penalised logits [vocab]: scratch.kept holds their ids in id
// order and scratch.weight their unnormalised probabilities
// exp((logit - max) / temperature) (f32, > 0), both of length n (the
// return value). 0 when no token has a finite positive weight (all -inf or
// NaN, or a +inf logit): the caller falls back to argmax.
//
// Cost: O(vocab) passes (vectorised: sampling/vocab_kernels.h) and no
// full-vocabulary sort. With top_k, a heap of the k most likely tokens (exp
// only over those); without, one exp pass and, for top_p, the mass of 4,096
// logit buckets, of which only the one where the kept mass reaches top_p is
// sorted. Ties between equal logits go to the lower id, as everywhere in the
// sampler. Not for greedy params.
size_t filter_tokens(const SamplingParams& params, std::span<const float> logits, SamplingScratch& scratch);

// The draw of sample() when only temperature and min_p filter (top_k off,
// top_p = 1): the weights filter_tokens would keep, left by token id in
// scratch.weight (zeros for the dropped) with their block sums from the exp
// pass, and the token inverse_cdf_index draws over them with u. No
// compaction and no pass of the draw's own: the common case (OpenAI's
// defaults) reads the row twice. -1 where filter_tokens returns 0.
int32_t draw_unfiltered(const SamplingParams& params, std::span<const float> logits, SamplingScratch& scratch,
                        double u);

// The n most likely of logits (NaN counts as -inf), most likely first,
// lowest id on ties, into out (cleared first). O(vocab log n).
void top_n(std::span<const float> logits, size_t n, std::vector<std::pair<float, int32_t>>& heap,
           std::vector<int32_t>& out);

// vLLM's rank of `token` in one row of logits: how many tokens are at least
// as likely (ties count against it, as vLLM's batched_count_greater_than
// does), so 1 = the one most likely token. NaN entries never count.
int32_t vocab_rank(std::span<const float> logits, int32_t token);

// One row's raw log_softmax at `token` (the same arithmetic as sample()'s
// logprobs: f32 max, f64 sum), its vocab_rank, and its n_top most likely
// alternatives (top_n's order). A prompt position reports this for the
// prompt token that follows it.
struct RowLogprobs {
  float logprob = 0.0f;
  int32_t rank = 0;
  std::vector<TokenLogprob> top;  // [n_top] most likely first
};
RowLogprobs row_logprobs(std::span<const float> logits, int32_t token, size_t n_top,
                         std::vector<std::pair<float, int32_t>>& heap, std::vector<int32_t>& top_ids);

// Index of the largest value, lowest index on ties; NaN never wins.
int32_t argmax(std::span<const float> logits);

}  // namespace shardlm
