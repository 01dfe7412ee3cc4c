#include "model/speculative.h"

#include <algorithm>

#include "core/error.h"

namespace shardlm {

void SpeculativeOptions::validate() const {
  if (!enabled()) return;
  if (num_speculative_tokens > 64)
    fail(ErrorCode::kInvalidArgument, "--speculative-config: num_speculative_tokens must be 1 to 64, got ",
         num_speculative_tokens);
  if (!draft_model.empty()) return;  // no lookup
  if (prompt_lookup_min < 1 || prompt_lookup_max < prompt_lookup_min)
    fail(ErrorCode::kInvalidArgument, "--speculative-config: need 1 <= prompt_lookup_min <= prompt_lookup_max, got ",
         prompt_lookup_min, " and ", prompt_lookup_max);
}

std::vector<int32_t> ngram_draft(std::span<const int32_t> context, const SpeculativeOptions& options,
                                 int64_t max_draft) {
  const int64_t n_ctx = static_cast<int64_t>(context.size());
  const int64_t k = std::min<int64_t>(options.num_speculative_tokens, max_draft);
  if (k <= 0) return {};
  for (int64_t n = std::min<int64_t>(options.prompt_lookup_max, n_ctx - 1); n >= options.prompt_lookup_min; --n) {
    const int64_t suffix = n_ctx - n;  // the pattern is context[suffix, n_ctx)
    // The most recent earlier start s < suffix with context[s, s+n) == pattern that is followed
    // by k tokens; failing that, the one followed by the most (a match overlapping the suffix,
    // as in a run of one repeated token, is followed by fewer).
    int64_t best_from = -1, best_to = -1;
    for (int64_t s = suffix - 1; s >= 0; --s) {
      if (!std::equal(context.begin() + s, context.begin() + s + n, context.begin() + suffix)) continue;
      const int64_t from = s + n, to = std::min<int64_t>(n_ctx, from + k);
      if (to - from > best_to - best_from) best_from = from, best_to = to;
      if (to - from == k) break;
    }
    if (best_to > best_from) return std::vector<int32_t>(context.begin() + best_from, context.begin() + best_to);
  }
  return {};
}

}  // namespace shardlm
