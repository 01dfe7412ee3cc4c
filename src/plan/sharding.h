// Sharding as a pure function of (ModelSpec, Layout): which heads, columns,
// vocabulary rows and layers each rank holds. plan prints it, the loader
// executes it, the model computes with it (../shared/DESIGN.md §3). Any TP
// degree from 1 to n_heads is accepted; any PP split of the layers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loader/model_spec.h"

namespace shardlm {

// Half-open [begin, end).
struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool contains(int64_t i) const { return i >= begin && i < end; }
  bool operator==(const Range&) const = default;
};

// Part `part` of `n` items split into `n_parts` contiguous ranges whose sizes
// differ by at most one unit of `align` items (the first parts are larger).
// With align > 1, n must be a multiple of align or align is ignored.
Range split_even(int64_t n, int n_parts, int part, int64_t align = 1);

struct Layout {
  int tp = 1;  // tensor-parallel degree
  int pp = 1;  // pipeline stages
  int dp = 1;  // data-parallel replicas
  // Layers per stage, summing to n_layers; empty = balanced by bytes.
  std::vector<int64_t> pp_layer_partition;
  // Expert parallelism (--enable-expert-parallel, MoE models only): the experts
  // of each MoE layer go whole to the TP ranks of its stage in near-equal counts
  // (128 over 6 = 22,22,21,21,21,21); attention stays tensor-parallel. Off:
  // every expert's MLP is split over the TP ranks like a dense MLP.
  bool expert_parallel = false;
  // --tensor-split (plan/tensor_split.h): relative shares of the TP ranks,
  // tp entries (every stage alike) or tp × pp (stage-major); empty = even.
  std::vector<double> tensor_split{};
  int world_size() const { return tp * pp * dp; }
  int ranks_per_replica() const { return tp * pp; }
  int ep() const { return expert_parallel ? tp : 1; }  // expert-parallel degree
  std::string to_string() const;  // "TP=3 PP=2 DP=1", "TP=6 PP=1 DP=1 EP=6", "TP=2 PP=1 DP=1 split 3,1"
};

// Rank numbering (TensorRT-LLM's worldConfig): tp fastest, then pp, then dp.
struct WorldConfig {
  int rank = 0;
  Layout layout;
  int tp_rank() const { return rank % layout.tp; }
  int pp_rank() const { return (rank / layout.tp) % layout.pp; }
  int dp_rank() const { return rank / (layout.tp * layout.pp); }
  static int rank_of(const Layout& layout, int tp_rank, int pp_rank, int dp_rank) {
    return (dp_rank * layout.pp + pp_rank) * layout.tp + tp_rank;
  }
};

// Throws Error(kInvalidArgument) with the reason when the ranks cannot run the
// layout: tp < 1 or tp > n_heads, pp > n_layers, a partition that does not
// sum to n_layers or has an empty stage, expert parallelism on a dense model.
void validate_layout(const ModelSpec& spec, const Layout& layout);

// Quantized checkpoints: row (input-dim) and column (output-channel) slice
// edges must fall on whole groups / packed words / scale blocks. The split
// granularities, 1 for unquantized specs.
int64_t quant_in_align(const ModelSpec& spec);
int64_t quant_out_align(const ModelSpec& spec);
// Throws Error(kInvalidArgument) naming the rank, the range and the
// quantization when a TP slice cannot take whole groups. validate_layout calls it.
void check_quantized_layout(const ModelSpec& spec, const Layout& layout);

// The checkpoint's tensors (expected_tensors) and the mean bytes of one
// decoder layer, built once: plan evaluates hundreds of (layout, rank) pairs
// of one model, and a 128-expert model has tens of thousands of tensors.
struct ModelTensors {
  explicit ModelTensors(const ModelSpec& spec);
  std::vector<TensorSpec> all;
  int64_t mean_layer_bytes = 0;
};

// Layers per stage: the override when given, else contiguous stages balanced
// by weight bytes (stage 0 carries the embedding, the last stage the final
// norm and lm_head).
std::vector<int64_t> pipeline_partition(const ModelSpec& spec, const Layout& layout);
std::vector<int64_t> pipeline_partition(const ModelSpec& spec, const ModelTensors& tensors, const Layout& layout);

// What one (tp_rank, pp_rank) holds. Global indices throughout.
struct RankShard {
  int tp_rank = 0;
  int pp_rank = 0;
  Range q_heads;       // Q heads computed here
  Range kv_heads;      // KV heads held here: every group its Q heads touch (may be shared with a neighbour)
  Range intermediate;         // dense MLP intermediate columns (intermediate_size split over TP)
  Range experts;              // experts held, global ids: all of them without EP, a contiguous share with EP
  Range expert_intermediate;  // columns of each held expert: moe_intermediate_size split over TP, whole with EP
  Range vocab;         // rows of embed_tokens / lm_head
  Range layers;        // decoder layers of this stage
  bool first_stage = false;  // holds embed_tokens
  bool last_stage = false;   // holds model.norm and lm_head
};

RankShard shard_for(const ModelSpec& spec, const Layout& layout, int tp_rank, int pp_rank);

// Experts of TP rank `tp_rank` under expert parallelism over `ep` ranks: the
// split vLLM's determine_expert_map makes ("linear" placement), first ranks larger.
Range expert_range(int64_t n_experts, int ep, int ep_rank);


// One tensor as held by one rank: which slice of the checkpoint tensor.
struct TensorShard {
  std::string name;                  // HF name in the checkpoint
  std::vector<int64_t> full_shape;   // shape in the checkpoint
  int split_dim = -1;                // -1 replicated, 0 rows, 1 columns
  Range slice;                       // along split_dim (whole dim when replicated)
  std::vector<int64_t> local_shape;  // shape held on the rank
  int64_t bytes = 0;                 // local_shape elements × dtype size
  // A fused tensor (ShardRole::kFusedParts) gives one TensorShard per part,
  // each a row slice (slice: rows of the whole tensor); -1 otherwise.
  int fused_part = -1;
  TensorSlot slot = TensorSlot::kAttnNorm;  // the tensor's meaning (its TensorSpec's)
  ShardRole role = ShardRole::kReplicated;
};

// Every tensor a rank loads, with its slice. Tied embeddings: the last stage
// reads embed_tokens rows as its lm_head (one copy when it is also the first).
std::vector<TensorShard> rank_tensors(const ModelSpec& spec, const Layout& layout, int tp_rank, int pp_rank);
std::vector<TensorShard> rank_tensors(const ModelSpec& spec, const ModelTensors& tensors, const Layout& layout,
                                      int tp_rank, int pp_rank);
int64_t rank_weight_bytes(const ModelSpec& spec, const Layout& layout, int tp_rank, int pp_rank);
int64_t rank_weight_bytes(const ModelSpec& spec, const ModelTensors& tensors, const Layout& layout, int tp_rank,
                          int pp_rank);

}  // namespace shardlm
