#include "plan/tensor_split.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

#include "core/error.h"

namespace shardlm {

std::vector<double> parse_tensor_split(const std::string& text, const std::string& flag) {
  std::vector<double> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    double w = 0;
    try {
      w = std::stod(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || !std::isfinite(w) || w <= 0)
      fail(ErrorCode::kInvalidArgument, flag, " \"", text, "\": entry \"", item,
           "\" is not a positive number; give one relative weight per tensor-parallel rank, e.g. 3,1");
    out.push_back(w);
  }
  if (out.empty() || (!text.empty() && text.back() == ','))
    fail(ErrorCode::kInvalidArgument, flag, " \"", text, "\": give one relative weight per tensor-parallel rank, e.g. 3,1");
  return out;
}

std::string format_tensor_split(const std::vector<double>& weights) {
  std::string out;
  for (size_t i = 0; i < weights.size(); ++i) {
    std::ostringstream s;
    s.precision(4);
    s << weights[i];
    out += (i ? "," : "") + s.str();
  }
  return out;
}

void check_tensor_split(const Layout& layout) {
  const auto& w = layout.tensor_split;
  if (w.empty()) return;
  const int n = static_cast<int>(w.size());
  if (n != layout.tp && n != layout.tp * layout.pp)
    fail(ErrorCode::kInvalidArgument, "--tensor-split has ", n, " weights but ", layout.to_string(), " has ", layout.tp,
         " tensor-parallel ranks per stage: give ", layout.tp, " weights (every stage alike)",
         layout.pp > 1 ? str_cat(" or ", layout.tp * layout.pp, " (tp × pp, stage-major)") : std::string());
  for (double x : w)
    if (!std::isfinite(x) || x <= 0)
      fail(ErrorCode::kInvalidArgument, "--tensor-split: weight ", x, " is not positive; every rank needs a share");
}

std::vector<double> stage_split(const Layout& layout, int pp_rank) {
  const auto& w = layout.tensor_split;
  if (w.empty()) return {};
  const size_t tp = static_cast<size_t>(layout.tp);
  const size_t first = w.size() == tp ? 0 : static_cast<size_t>(pp_rank) * tp;
  std::vector<double> out(w.begin() + static_cast<std::ptrdiff_t>(first),
                          w.begin() + static_cast<std::ptrdiff_t>(first + tp));
  const double sum = std::accumulate(out.begin(), out.end(), 0.0);
  for (double& x : out) x /= sum;
  return out;
}

std::vector<int64_t> weighted_counts(int64_t n_units, const std::vector<double>& weights, const std::string& what) {
  const int parts = static_cast<int>(weights.size());
  SHARDLM_CHECK(parts >= 1);
  if (n_units < parts)
    fail(ErrorCode::kInvalidArgument, "--tensor-split: ", n_units, " ", what, " cannot give each of ", parts,
         " tensor-parallel ranks at least one; use at most ", n_units, " ranks");
  const double sum = std::accumulate(weights.begin(), weights.end(), 0.0);
  std::vector<double> ideal(parts);
  std::vector<int64_t> count(parts);
  int64_t total = 0;
  for (int i = 0; i < parts; ++i) {
    ideal[i] = static_cast<double>(n_units) * weights[i] / sum;
    count[i] = std::max<int64_t>(1, static_cast<int64_t>(std::floor(ideal[i])));
    total += count[i];
  }
  // Largest remainder: add to the parts furthest below their ideal (ties to
  // the lower rank), or take from those furthest above it (never below one).
  while (total < n_units) {
    int best = 0;
    for (int i = 1; i < parts; ++i)
      if (ideal[i] - count[i] > ideal[best] - count[best]) best = i;
    ++count[best];
    ++total;
  }
  while (total > n_units) {
    int best = -1;
    for (int i = 0; i < parts; ++i)
      if (count[i] > 1 && (best < 0 || count[i] - ideal[i] > count[best] - ideal[best])) best = i;
    --count[best];
    --total;
  }
  return count;
}

Range split_weighted(int64_t n, const std::vector<double>& weights, int part, int64_t align, const std::string& what) {
  const int parts = static_cast<int>(weights.size());
  SHARDLM_CHECK(part >= 0 && part < parts);
  if (align < 1 || n % align != 0 || n / align < parts) align = 1;
  const std::vector<int64_t> count = weighted_counts(n / align, weights, what);
  const int64_t begin = std::accumulate(count.begin(), count.begin() + part, int64_t{0});
  return {begin * align, (begin + count[static_cast<size_t>(part)]) * align};
}

namespace {

// The slowest rank's load against its requested share: max_r count_r / ideal_r.
double overload(const std::vector<int64_t>& count, const std::vector<double>& weights) {
  const double n = static_cast<double>(std::accumulate(count.begin(), count.end(), int64_t{0}));
  double worst = 0;
  for (size_t i = 0; i < count.size(); ++i) worst = std::max(worst, static_cast<double>(count[i]) / (n * weights[i]));
  return worst;
}

std::vector<int64_t> head_counts(const ModelSpec& spec, const std::vector<double>& w, int64_t head_unit) {
  const int tp = static_cast<int>(w.size());
  const int64_t n = spec.n_heads;
  int64_t unit = head_unit;
  if (unit < 1 || n % unit != 0 || n / unit < tp) unit = 1;
  std::vector<int64_t> per_head = weighted_counts(n / unit, w, "query-head units");
  for (auto& c : per_head) c *= unit;
  const int64_t group = std::lcm<int64_t>(spec.group_size(), unit);
  if (group > unit && n % group == 0 && n / group >= tp) {
    std::vector<int64_t> per_group = weighted_counts(n / group, w, "GQA groups");
    for (auto& c : per_group) c *= group;
    if (overload(per_group, w) <= 1.05 * overload(per_head, w)) return per_group;
  }
  return per_head;
}

}  // namespace

Range tp_q_heads(const ModelSpec& spec, const Layout& layout, int tp_rank, int pp_rank, int64_t head_unit) {
  const std::vector<double> w = stage_split(layout, pp_rank);
  if (w.empty()) return split_even(spec.n_heads, layout.tp, tp_rank, head_unit);
  const std::vector<int64_t> count = head_counts(spec, w, head_unit);
  const int64_t begin = std::accumulate(count.begin(), count.begin() + tp_rank, int64_t{0});
  return {begin, begin + count[static_cast<size_t>(tp_rank)]};
}

Range tp_range(int64_t n, const Layout& layout, int tp_rank, int pp_rank, int64_t align, const std::string& what) {
  const std::vector<double> w = stage_split(layout, pp_rank);
  if (w.empty()) return split_even(n, layout.tp, tp_rank, align);
  return split_weighted(n, w, tp_rank, align, what);
}

RealisedSplit realised_split(const ModelSpec& spec, const Layout& layout, int pp_rank) {
  RealisedSplit out;
  out.requested = stage_split(layout, pp_rank);
  if (out.requested.empty()) out.requested.assign(static_cast<size_t>(layout.tp), 1.0 / layout.tp);
  for (int r = 0; r < layout.tp; ++r) {
    const RankShard s = shard_for(spec, layout, r, pp_rank);
    out.q_heads.push_back(static_cast<double>(s.q_heads.size()) / static_cast<double>(spec.n_heads));
    if (spec.is_moe() && layout.expert_parallel)
      out.experts.push_back(static_cast<double>(s.experts.size()) / static_cast<double>(spec.n_experts));
    const int64_t n_mlp = spec.is_moe() ? spec.moe_intermediate_size : spec.intermediate_size;
    const Range mlp = spec.is_moe() ? s.expert_intermediate : s.intermediate;
    out.mlp.push_back(static_cast<double>(mlp.size()) / static_cast<double>(n_mlp));
    out.vocab.push_back(static_cast<double>(s.vocab.size()) / static_cast<double>(spec.vocab_size));
  }
  return out;
}

}  // namespace shardlm
