// Which rows of a step a device sampler may take, and which must stay with
// the host Sampler (sampling/sampler.h), decided per row from what the row
// asks for. The device sampler (backend/cuda/sampling.h: greedy,
// temperature, top-k/top-p/min-p, presence/frequency/repetition penalties,
// up to kMaxLogprobs top logprobs) keeps a [batch, vocab] logits matrix on
// the GPU; a row that needs something it lacks goes to the host, and only
// that row's logits cross.
//
// Host-only rows, and why (SamplingFallback):
//   - logit_bias: the device sampler adds no bias;
//   - a grammar mask (structured output): the bitmask is built on the host;
//   - banned tokens (min_tokens not reached: EOS and stop ids masked);
//   - presence/frequency/repetition penalties: the device kernel has them,
//     but their per-row token counts are not uploaded yet (Backend::sample_rows);
//   - a seed: the host Sampler's generator gives the same tokens on every
//     device and in every batch; the device's Philox draw repeats on the GPU
//     but gives other tokens than the CPU's, so seeded rows stay on the host;
//   - logprobs: the engine reports the chosen token's rank over the whole
//     row, which the device sampler does not compute.
//
// Status: `shardlm generate --sampling-device device` uses it (one row);
// the engine does not call it yet: every row of serve is sampled on the host.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "sampling/sampling_params.h"

namespace shardlm {

enum class SamplingFallback {
  kNone,
  kNoDeviceSampler,
  kLogitBias,
  kGrammar,
  kBannedTokens,
  kPenalties,
  kSeed,
  kLogprobs
};
// "logit_bias", "a grammar mask", ...: what the log line names.
const char* sampling_fallback_name(SamplingFallback f);

// What one row of the step asks of the sampler.
struct RowSamplingNeeds {
  const SamplingParams* params = nullptr;  // not null
  bool grammar = false;                    // a structured-output mask applies to this row
  bool banned_tokens = false;              // tokens masked to -inf this step (min_tokens)
  bool logprobs = false;                   // the request returns logprobs (with the chosen token's rank)
};

// Why `row` must be sampled on the host (kNone: the device may take it).
// device_sampler: the backend has one (false on the CPU: kNoDeviceSampler).
SamplingFallback row_sampling_fallback(const RowSamplingNeeds& row, bool device_sampler);

// The split of one step's rows (indices into its logits rows).
struct StepSamplingPlan {
  std::vector<int64_t> device_rows;  // sampled where the logits are; only ids (and logprobs) come back
  std::vector<int64_t> host_rows;    // their logits rows come back to the host Sampler
  std::vector<SamplingFallback> reasons;  // [host_rows.size()]
  bool all_host() const { return device_rows.empty(); }
};
StepSamplingPlan plan_step_sampling(const std::vector<RowSamplingNeeds>& rows, bool device_sampler);

// Says each fallback reason once per engine: note() returns the log line the
// first time a reason is seen, "" after (and for kNone / kNoDeviceSampler,
// which is said at startup instead).
class SamplingFallbackLog {
 public:
  std::string note(SamplingFallback f);

 private:
  std::set<SamplingFallback> seen_;
};

}  // namespace shardlm
