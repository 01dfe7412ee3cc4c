// Weighted tensor parallelism for mixed devices (--tensor-split, llama.cpp's
// name): the TP ranks of a stage take shares of the query heads, the MLP
// columns, the experts (under EP) and the vocabulary in proportion to
// relative weights, so an 80 GB card beside a 24 GB one holds (and reads)
// proportionally more. The split is part of the Layout, so sharding stays a
// pure function of (ModelSpec, Layout): plan prints it, the loader executes it.
//
// Rounding: shares are cut in whole units (GQA groups or heads, aligned
// column blocks, experts, 16-row vocabulary blocks) by largest remainder;
// every rank gets at least one unit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loader/model_spec.h"
#include "plan/sharding.h"

namespace shardlm {

// Parses "3,1" or "0.77,0.23": comma-separated positive finite weights.
// Throws Error(kInvalidArgument) naming `flag` and the bad entry.
std::vector<double> parse_tensor_split(const std::string& text, const std::string& flag = "--tensor-split");
// "0.77,0.23" (up to 4 significant digits, no trailing zeros).
std::string format_tensor_split(const std::vector<double>& weights);

// Throws Error(kInvalidArgument) unless the split has 0 (even), tp, or tp × pp
// (stage-major) positive finite entries. validate_layout calls it.
void check_tensor_split(const Layout& layout);

// Weights of the TP ranks of stage `pp_rank`, normalised to sum 1; empty when
// the layout has no split (the even split of sharding.h applies).
std::vector<double> stage_split(const Layout& layout, int pp_rank);

// `n_units` items over weights.size() parts in proportion to the weights,
// largest remainder, each part at least one unit. Throws Error(kInvalidArgument)
// when n_units < parts.
std::vector<int64_t> weighted_counts(int64_t n_units, const std::vector<double>& weights, const std::string& what);

// Part `part` of `n` items cut in units of `align` items in proportion to
// `weights` (align ignored when it does not divide n, as split_even does).
Range split_weighted(int64_t n, const std::vector<double>& weights, int part, int64_t align, const std::string& what);

// The Q heads of one TP rank. No split: split_even in units of `head_unit`.
// With a split: whole GQA groups (lcm(group, head_unit) heads per unit) when
// there are enough groups and the groups' balance is within 5% of the
// per-head split's; otherwise units of head_unit, with KV heads replicated on
// both ranks of a group cut in two, as uneven TP always does.
Range tp_q_heads(const ModelSpec& spec, const Layout& layout, int tp_rank, int pp_rank, int64_t head_unit);
// `n` columns / rows / experts of one TP rank: split_even without a split.
Range tp_range(int64_t n, const Layout& layout, int tp_rank, int pp_rank, int64_t align, const std::string& what);

// What the split realised on one stage: each rank's fraction of the Q heads,
// of the MLP columns (dense, or each expert's under TP) and of the vocabulary,
// beside the requested fraction.
struct RealisedSplit {
  std::vector<double> requested;  // [tp], sums to 1
  std::vector<double> q_heads;    // [tp]
  std::vector<double> mlp;        // [tp]
  std::vector<double> experts;    // [tp], EP only (else empty)
  std::vector<double> vocab;      // [tp]
};
RealisedSplit realised_split(const ModelSpec& spec, const Layout& layout, int pp_rank);

}  // namespace shardlm
