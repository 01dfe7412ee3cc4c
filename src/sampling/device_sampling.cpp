#include "sampling/device_sampling.h"

#include "core/error.h"

namespace shardlm {

const char* sampling_fallback_name(SamplingFallback f) {
  switch (f) {
    case SamplingFallback::kNone: return "none";
    case SamplingFallback::kNoDeviceSampler: return "no device sampler on this backend";
    case SamplingFallback::kLogitBias: return "logit_bias";
    case SamplingFallback::kGrammar: return "a grammar mask (structured output)";
    case SamplingFallback::kBannedTokens: return "banned tokens (min_tokens)";
    case SamplingFallback::kPenalties: return "penalties (their token counts are not uploaded to the device yet)";
    case SamplingFallback::kSeed: return "a seed (the host generator repeats across devices)";
    case SamplingFallback::kLogprobs: return "logprobs (the chosen token's rank needs the whole row)";
  }
  return "?";
}

SamplingFallback row_sampling_fallback(const RowSamplingNeeds& row, bool device_sampler) {
  SHARDLM_CHECK(row.params != nullptr, "row_sampling_fallback: a row without sampling parameters");
  if (!device_sampler) return SamplingFallback::kNoDeviceSampler;
  if (row.grammar) return SamplingFallback::kGrammar;
  if (!row.params->logit_bias.empty()) return SamplingFallback::kLogitBias;
  if (row.banned_tokens) return SamplingFallback::kBannedTokens;
  const SamplingParams& p = *row.params;
  if (p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 || p.repetition_penalty != 1.0)
    return SamplingFallback::kPenalties;
  if (row.params->seed.has_value() && !row.params->greedy()) return SamplingFallback::kSeed;  // greedy draws nothing
  if (row.logprobs || row.params->logprobs > 0) return SamplingFallback::kLogprobs;
  return SamplingFallback::kNone;
}

StepSamplingPlan plan_step_sampling(const std::vector<RowSamplingNeeds>& rows, bool device_sampler) {
  StepSamplingPlan plan;
  for (size_t i = 0; i < rows.size(); ++i) {
    const SamplingFallback f = row_sampling_fallback(rows[i], device_sampler);
    if (f == SamplingFallback::kNone) {
      plan.device_rows.push_back(static_cast<int64_t>(i));
    } else {
      plan.host_rows.push_back(static_cast<int64_t>(i));
      plan.reasons.push_back(f);
    }
  }
  return plan;
}

std::string SamplingFallbackLog::note(SamplingFallback f) {
  if (f == SamplingFallback::kNone || f == SamplingFallback::kNoDeviceSampler) return "";
  if (!seen_.insert(f).second) return "";
  return str_cat("sampling: rows with ", sampling_fallback_name(f),
                 " are sampled on the host (their logits rows are copied back); the other rows stay on the device");
}

}  // namespace shardlm
