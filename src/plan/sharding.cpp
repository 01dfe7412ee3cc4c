#include "plan/sharding.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "plan/tensor_split.h"

namespace shardlm {

std::string Layout::to_string() const {
  return str_cat("TP=", tp, " PP=", pp, " DP=", dp, expert_parallel ? str_cat(" EP=", tp) : std::string(),
                 tensor_split.empty() ? std::string() : " split " + format_tensor_split(tensor_split));
}

Range expert_range(int64_t n_experts, int ep, int ep_rank) { return split_even(n_experts, ep, ep_rank); }

Range split_even(int64_t n, int n_parts, int part, int64_t align) {
  SHARDLM_CHECK(n_parts >= 1 && part >= 0 && part < n_parts);
  if (align < 1 || n % align != 0 || n / align < n_parts) align = 1;
  const int64_t units = n / align;
  const int64_t base = units / n_parts;
  const int64_t extra = units % n_parts;
  const int64_t begin = part * base + std::min<int64_t>(part, extra);
  const int64_t size = base + (part < extra ? 1 : 0);
  return {begin * align, (begin + size) * align};
}

void validate_layout(const ModelSpec& spec, const Layout& layout) {
  if (layout.tp < 1 || layout.pp < 1 || layout.dp < 1)
    fail(ErrorCode::kInvalidArgument, "layout ", layout.to_string(), ": every degree must be at least 1");
  if (layout.tp > spec.n_heads)
    fail(ErrorCode::kInvalidArgument, "--tensor-parallel-size ", layout.tp, " exceeds the model's ", spec.n_heads,
         " attention heads: each tensor-parallel rank needs at least one Q head; use at most ", spec.n_heads,
         " or add pipeline/data parallelism");
  if (layout.pp > spec.n_layers)
    fail(ErrorCode::kInvalidArgument, "--pipeline-parallel-size ", layout.pp, " exceeds the model's ", spec.n_layers,
         " layers: each stage needs at least one layer");
  if (layout.expert_parallel && !spec.is_moe())
    fail(ErrorCode::kInvalidArgument, "--enable-expert-parallel: ", spec.architecture,
         " is a dense model without experts; drop the flag (it applies to mixture-of-experts models)");
  check_tensor_split(layout);
  check_quantized_layout(spec, layout);
  if (!layout.pp_layer_partition.empty()) {
    if (static_cast<int>(layout.pp_layer_partition.size()) != layout.pp)
      fail(ErrorCode::kInvalidArgument, "--pp-layer-partition has ", layout.pp_layer_partition.size(),
           " entries but --pipeline-parallel-size is ", layout.pp, ": give one layer count per stage");
    int64_t sum = 0;
    for (int64_t n : layout.pp_layer_partition) {
      if (n < 1) fail(ErrorCode::kInvalidArgument, "--pp-layer-partition: every stage needs at least one layer, found ", n);
      sum += n;
    }
    if (sum != spec.n_layers)
      fail(ErrorCode::kInvalidArgument, "--pp-layer-partition sums to ", sum, " layers but the model has ", spec.n_layers);
  }
}

namespace {

// Storage bytes of one element of a tensor: its quantized storage dtype, or
// the checkpoint's.
int64_t element_bytes(const ModelSpec& spec, const TensorSpec& t) {
  return static_cast<int64_t>(dtype_size(t.dtypes.empty() ? spec.dtype : t.dtypes[0]));
}

}  // namespace

ModelTensors::ModelTensors(const ModelSpec& spec) : all(expected_tensors(spec)) {
  // The mean, because MoE models may mix dense and sparse layers.
  int64_t n = 0;
  for (const auto& t : all)
    if (t.layer >= 0) n += shape_numel(t.shape) * element_bytes(spec, t);
  mean_layer_bytes = n / std::max<int64_t>(1, spec.n_layers);
}

int64_t quant_in_align(const ModelSpec& spec) {
  const QuantConfig& q = spec.quant;
  switch (q.method) {
    case QuantMethod::kAwq: return q.group_size;
    case QuantMethod::kGptq:
      // Act-order groups are scattered over the rows, and group_size -1 is one
      // group: each rank then holds every group's scales and zeros, and only
      // the packed words need whole int32s.
      return q.desc_act || q.group_size < 0 ? q.pack_factor() : std::lcm<int64_t>(q.group_size, q.pack_factor());
    case QuantMethod::kFp8: return q.weight_block_size.empty() ? 1 : q.weight_block_size[1];
    case QuantMethod::kNone: break;
  }
  return 1;
}

int64_t quant_out_align(const ModelSpec& spec) {
  const QuantConfig& q = spec.quant;
  switch (q.method) {
    case QuantMethod::kAwq:
    case QuantMethod::kGptq: return q.pack_factor();
    case QuantMethod::kFp8: return q.weight_block_size.empty() ? 1 : q.weight_block_size[0];
    case QuantMethod::kNone: break;
  }
  return 1;
}

namespace {

// Q heads per unit of the head split: q/k/v column edges and o_proj row edges
// (heads × head_dim) must fall on the quantization's packing and groups.
int64_t head_unit(const ModelSpec& spec) {
  const int64_t l = std::lcm(quant_in_align(spec), quant_out_align(spec));
  return l / std::gcd(l, spec.head_dim);
}

int64_t intermediate_align(const ModelSpec& spec) {
  return std::lcm<int64_t>(16, std::lcm(quant_in_align(spec), quant_out_align(spec)));
}

// Vocabulary rows per unit of the embedding / lm_head split: blocks of 16,
// and whole packed words of a quantized lm_head (GPTQ packs 32 / bits output
// channels per qzeros word), which a vocabulary not a multiple of 16 still needs.
int64_t vocab_align(const ModelSpec& spec) {
  const bool quantized_head = spec.quant.quantizes(spec.tensor_prefix + "lm_head");
  if (!quantized_head || spec.vocab_size % 16 == 0) return 16;
  return quant_out_align(spec);
}

}  // namespace

void check_quantized_layout(const ModelSpec& spec, const Layout& layout) {
  if (!spec.quant.enabled() || layout.tp == 1) return;
  const int64_t in_align = quant_in_align(spec), out_align = quant_out_align(spec);
  const int64_t unit = head_unit(spec);
  const int64_t inter = spec.is_moe() ? spec.moe_intermediate_size : spec.intermediate_size;
  const int64_t ialign = intermediate_align(spec);
  const std::string what = str_cat(spec.quant.source, " (", spec.quant.describe(), ")");
  const int n_stages = static_cast<int>(layout.tensor_split.size()) > layout.tp ? layout.pp : 1;
  for (int st = 0; st < n_stages; ++st)
  for (int r = 0; r < layout.tp; ++r) {
    const Range heads = tp_q_heads(spec, layout, r, st, unit);
    const int64_t g = spec.group_size();
    const Range kv{heads.begin / g, (heads.end + g - 1) / g};
    const int64_t hd = spec.head_dim;
    if ((heads.begin * hd) % in_align != 0 || (heads.end * hd) % in_align != 0 || (heads.begin * hd) % out_align != 0 ||
        (heads.end * hd) % out_align != 0)
      fail(ErrorCode::kInvalidArgument, "--tensor-parallel-size ", layout.tp, ": rank ", r, " would hold Q heads [",
           heads.begin, ", ", heads.end, "), whose columns [", heads.begin * hd, ", ", heads.end * hd,
           ") of q_proj/o_proj do not fall on whole quantization groups of ", in_align, " rows and packed words of ",
           out_align, " channels of ", what, "; the heads split in units of ", unit, " (", spec.n_heads,
           " heads); choose a tensor-parallel size of at most ", spec.n_heads / unit, " that fits");
    // FP8 K/V rows may start inside a scale block (both ranks keep that
    // block's scale row; the kernel offsets into it): only AWQ/GPTQ words
    // must stay whole.
    const int64_t kv_align = spec.quant.method == QuantMethod::kFp8 ? 1 : out_align;
    if ((kv.begin * hd) % kv_align != 0 || (kv.end * hd) % kv_align != 0)
      fail(ErrorCode::kInvalidArgument, "--tensor-parallel-size ", layout.tp, ": rank ", r, " would hold KV heads [",
           kv.begin, ", ", kv.end, "), whose k_proj/v_proj rows do not fall on the ", kv_align, "-channel units of ",
           what, "; choose another tensor-parallel size");
    if (spec.quant.quantizes(spec.tensor_prefix + "lm_head")) {
      const Range vocab = tp_range(spec.vocab_size, layout, r, st, vocab_align(spec), "vocabulary blocks");
      if (vocab.begin % out_align != 0 || vocab.end % out_align != 0)
        fail(ErrorCode::kInvalidArgument, "--tensor-parallel-size ", layout.tp, ": rank ", r,
             " would hold vocabulary rows [", vocab.begin, ", ", vocab.end, ") of the quantized lm_head, which do not ",
             "fall on the ", out_align, "-channel packed words of ", what, "; choose another tensor-parallel size");
    }
    const Range cols = tp_range(inter, layout, r, st, ialign, "MLP column units");
    if (cols.begin % ialign != 0 || cols.end % ialign != 0)
      fail(ErrorCode::kInvalidArgument, "--tensor-parallel-size ", layout.tp, ": intermediate_size ", inter,
           " cannot be split into ", layout.tp, " ranges of whole ", ialign, "-column units (quantization groups of ",
           what, "); choose a tensor-parallel size of at most ", inter / ialign);
  }
}

std::vector<int64_t> pipeline_partition(const ModelSpec& spec, const Layout& layout) {
  validate_layout(spec, layout);
  if (!layout.pp_layer_partition.empty()) return layout.pp_layer_partition;
  if (layout.pp == 1) return {spec.n_layers};
  return pipeline_partition(spec, ModelTensors(spec), layout);
}

std::vector<int64_t> pipeline_partition(const ModelSpec& spec, const ModelTensors& tensors, const Layout& layout) {
  validate_layout(spec, layout);
  if (!layout.pp_layer_partition.empty()) return layout.pp_layer_partition;
  const int pp = layout.pp;
  if (pp == 1) return {spec.n_layers};
  // Stage costs in bytes: layers × per_layer, plus the embedding on stage 0
  // and norm + lm_head on the last. Dynamic programme over (stage, layers so
  // far) minimising the largest stage, then the sum of squares, so equal-cost
  // stages get equal layers (28 layers, 3 stages, tiny vocab: 9, 10, 9).
  // The embedding and head weigh what their tensors store: a quantized
  // lm_head (GPTQModel's lm_head: true) is a fraction of a bf16 one.
  const double per_layer = static_cast<double>(tensors.mean_layer_bytes);
  double embed = 0, lm_head = 0, norm = 0;
  for (const TensorSpec& t : tensors.all) {
    if (t.layer >= 0) continue;
    const double b = static_cast<double>(shape_numel(t.shape) * element_bytes(spec, t));
    if (t.slot == TensorSlot::kEmbedding) embed += b;
    else if (t.slot == TensorSlot::kLmHead && !spec.tie_word_embeddings) lm_head += b;
    else if (t.slot == TensorSlot::kFinalNorm) norm += b;
  }
  const double head = (spec.tie_word_embeddings ? embed : lm_head) + norm;  // lm_head (or tied embedding rows) + norm
  const int64_t n = spec.n_layers;
  struct Cell { double max_cost; double sum_sq; int64_t prev; bool ok; };
  std::vector<std::vector<Cell>> dp(pp + 1, std::vector<Cell>(n + 1, {0, 0, -1, false}));
  dp[0][0] = {0, 0, -1, true};
  for (int stage = 1; stage <= pp; ++stage) {
    const double fixed = (stage == 1 ? embed : 0.0) + (stage == pp ? head : 0.0);
    for (int64_t k = stage; k <= n; ++k) {
      for (int64_t j = stage - 1; j < k; ++j) {
        const Cell& before = dp[stage - 1][j];
        if (!before.ok) continue;
        double cost = fixed + static_cast<double>(k - j) * per_layer;
        Cell cand{std::max(before.max_cost, cost), before.sum_sq + cost * cost, j, true};
        Cell& cur = dp[stage][k];
        if (!cur.ok || cand.max_cost < cur.max_cost ||
            (cand.max_cost == cur.max_cost && cand.sum_sq < cur.sum_sq))
          cur = cand;
      }
    }
  }
  std::vector<int64_t> counts(pp);
  int64_t k = n;
  for (int stage = pp; stage >= 1; --stage) {
    int64_t j = dp[stage][k].prev;
    counts[stage - 1] = k - j;
    k = j;
  }
  return counts;
}

RankShard shard_for(const ModelSpec& spec, const Layout& layout, int tp_rank, int pp_rank) {
  validate_layout(spec, layout);
  SHARDLM_CHECK(tp_rank >= 0 && tp_rank < layout.tp && pp_rank >= 0 && pp_rank < layout.pp);
  RankShard s;
  s.tp_rank = tp_rank;
  s.pp_rank = pp_rank;
  s.q_heads = tp_q_heads(spec, layout, tp_rank, pp_rank, head_unit(spec));
  const int64_t g = spec.group_size();
  s.kv_heads = {s.q_heads.begin / g, (s.q_heads.end + g - 1) / g};
  s.intermediate = tp_range(spec.intermediate_size, layout, tp_rank, pp_rank, intermediate_align(spec), "MLP column units");
  if (spec.is_moe()) {
    if (layout.expert_parallel) {
      s.experts = layout.tensor_split.empty() ? expert_range(spec.n_experts, layout.tp, tp_rank)
                                              : tp_range(spec.n_experts, layout, tp_rank, pp_rank, 1, "experts");
      s.expert_intermediate = {0, spec.moe_intermediate_size};
    } else {
      s.experts = {0, spec.n_experts};
      s.expert_intermediate = tp_range(spec.moe_intermediate_size, layout, tp_rank, pp_rank, intermediate_align(spec),
                                       "expert MLP column units");
    }
  }
  s.vocab = tp_range(spec.vocab_size, layout, tp_rank, pp_rank, vocab_align(spec), "vocabulary blocks");
  std::vector<int64_t> parts = pipeline_partition(spec, layout);
  int64_t begin = std::accumulate(parts.begin(), parts.begin() + pp_rank, int64_t{0});
  s.layers = {begin, begin + parts[pp_rank]};
  s.first_stage = pp_rank == 0;
  s.last_stage = pp_rank == layout.pp - 1;
  return s;
}

std::vector<TensorShard> rank_tensors(const ModelSpec& spec, const Layout& layout, int tp_rank, int pp_rank) {
  return rank_tensors(spec, ModelTensors(spec), layout, tp_rank, pp_rank);
}

std::vector<TensorShard> rank_tensors(const ModelSpec& spec, const ModelTensors& tensors, const Layout& layout,
                                      int tp_rank, int pp_rank) {
  Layout partitioned = layout;
  partitioned.pp_layer_partition = pipeline_partition(spec, tensors, layout);
  const RankShard s = shard_for(spec, partitioned, tp_rank, pp_rank);
  const int64_t hd = spec.head_dim;
  const Range q_cols{s.q_heads.begin * hd, s.q_heads.end * hd};
  const Range kv_rows{s.kv_heads.begin * hd, s.kv_heads.end * hd};
  std::vector<TensorShard> out;
  auto add_slice = [&](const TensorSpec& t, int dim, Range slice) {
    TensorShard ts;
    ts.name = t.name;
    ts.slot = t.slot;
    ts.role = t.role;
    ts.full_shape = t.shape;
    ts.split_dim = dim;
    ts.local_shape = t.shape;
    if (dim >= 0) ts.local_shape[dim] = slice.size();
    else slice = {0, t.shape.empty() ? 1 : t.shape[0]};
    ts.slice = slice;
    ts.bytes = shape_numel(ts.local_shape) * element_bytes(spec, t);
    out.push_back(std::move(ts));
  };
  // [begin/unit, ceil(end/unit)): a range of channels or rows as packed words,
  // groups or scale blocks.
  auto per = [](Range r, int64_t unit) { return Range{r.begin / unit, (r.end + unit - 1) / unit}; };
  // A quantized part of a Linear split on output channels (dim 0 of [out, in])
  // or input rows (dim 1), `slice` in those logical units.
  auto add_quant = [&](const TensorSpec& t, int logical_dim, Range slice) {
    const QuantConfig& q = spec.quant;
    const bool col = logical_dim == 0;
    const int64_t pf = q.pack_factor();
    switch (t.part) {
      case QuantPart::kQWeight:
        if (q.method == QuantMethod::kAwq) return col ? add_slice(t, 1, per(slice, pf)) : add_slice(t, 0, slice);
        return col ? add_slice(t, 1, slice) : add_slice(t, 0, per(slice, pf));
      case QuantPart::kQZeros:
      case QuantPart::kScales: {
        const int64_t out_unit = t.part == QuantPart::kQZeros ? pf : 1;
        if (col) return add_slice(t, 1, per(slice, out_unit));
        if (q.method == QuantMethod::kGptq && (q.desc_act || q.group_size < 0)) return add_slice(t, -1, {});
        return add_slice(t, 0, per(slice, q.group_rows(t.in_features)));
      }
      case QuantPart::kGIdx: return col ? add_slice(t, -1, {}) : add_slice(t, 0, slice);
      case QuantPart::kFp8Weight: return add_slice(t, col ? 0 : 1, slice);
      case QuantPart::kScaleInv:
        if (!q.weight_block_size.empty()) return add_slice(t, col ? 0 : 1, per(slice, q.weight_block_size[col ? 0 : 1]));
        if (col && !t.shape.empty() && t.shape[0] == t.out_features) return add_slice(t, 0, slice);  // per channel
        return add_slice(t, -1, {});
      case QuantPart::kNone: break;
    }
    add_slice(t, logical_dim, slice);
  };
  auto add = [&](const TensorSpec& t, int dim, Range slice) {
    if (t.part != QuantPart::kNone && dim >= 0) add_quant(t, dim, slice);
    else add_slice(t, dim, slice);
  };
  // The range a column or row split divides on this rank.
  auto space_range = [&](const TensorSpec& t, ShardSpace space) -> Range {
    switch (space) {
      case ShardSpace::kQHeads: return q_cols;
      case ShardSpace::kKvHeads: return kv_rows;
      case ShardSpace::kIntermediate: return s.intermediate;
      case ShardSpace::kNone: break;
    }
    fail(ErrorCode::kInternal, "tensor ", t.name, " is ", shard_role_name(t.role),
         "-parallel without a split space (its family's table in loader/families/ must name one)");
  };
  for (const TensorSpec& t : tensors.all) {
    if (t.layer >= 0 && !s.layers.contains(t.layer)) continue;
    if (t.layer < 0) {  // embedding, final norm, lm_head: by the stage that uses them
      const bool first = t.slot == TensorSlot::kEmbedding;
      const bool needed = first ? s.first_stage || (spec.tie_word_embeddings && s.last_stage)
                                : s.last_stage && !(t.slot == TensorSlot::kLmHead && spec.tie_word_embeddings);
      if (!needed) continue;
    }
    switch (t.role) {
      case ShardRole::kReplicated:
      case ShardRole::kRouter: add(t, -1, {}); break;
      case ShardRole::kColumn: add(t, 0, space_range(t, t.space)); break;
      case ShardRole::kRow: add(t, 1, space_range(t, t.space)); break;
      case ShardRole::kVocab: add(t, 0, s.vocab); break;
      case ShardRole::kExpertColumn:
      case ShardRole::kExpertRow:
        if (!s.experts.contains(t.expert)) break;
        add(t, t.role == ShardRole::kExpertRow ? 1 : 0, s.expert_intermediate);
        break;
      case ShardRole::kFusedParts: {
        // Each part's rows of this rank, offset by the parts before it.
        if (t.part != QuantPart::kNone)
          fail(ErrorCode::kUnsupported, t.name, ": fused Linears of quantized checkpoints are not sharded yet");
        int64_t offset = 0;
        for (size_t p = 0; p < t.fused.size(); ++p) {
          const Range r = space_range(t, t.fused[p].space);
          add_slice(t, 0, {offset + r.begin, offset + r.end});
          out.back().fused_part = static_cast<int>(p);
          offset += t.fused[p].rows;
        }
        break;
      }
    }
  }
  return out;
}

int64_t rank_weight_bytes(const ModelSpec& spec, const Layout& layout, int tp_rank, int pp_rank) {
  return rank_weight_bytes(spec, ModelTensors(spec), layout, tp_rank, pp_rank);
}

int64_t rank_weight_bytes(const ModelSpec& spec, const ModelTensors& tensors, const Layout& layout, int tp_rank,
                          int pp_rank) {
  int64_t n = 0;
  for (const auto& t : rank_tensors(spec, tensors, layout, tp_rank, pp_rank)) n += t.bytes;
  return n;
}

}  // namespace shardlm
