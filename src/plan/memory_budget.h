// MemoryBudget: how one rank's memory divides into weights, workspace, a
// runtime reserve and the KV cache (../shared/DESIGN.md §4). plan prints it;
// serve calls the same function to size its KV block pool, so the numbers
// plan shows are the numbers serve allocates.
#pragma once

#include "core/defaults.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/dtype.h"
#include "loader/model_spec.h"
#include "plan/sharding.h"

namespace shardlm {

// Element type of the KV cache. kAuto follows the weights' dtype (vLLM's "auto").
enum class KvCacheDType { kAuto, kBF16, kF16, kF32, kFp8 };

// Bytes per element: fp8 = 1, bf16/f16 = 2, f32 = 4, auto = dtype_size(weights).
size_t kv_dtype_size(KvCacheDType kv, DType weight_dtype);
const char* kv_dtype_name(KvCacheDType kv);  // "auto", "bf16", "f16", "f32", "fp8"
// Accepts auto, bf16, bfloat16, f16, fp16, float16, half, f32, fp32, float32, fp8, fp8_e4m3, fp8_e5m2.
bool parse_kv_cache_dtype(std::string_view text, KvCacheDType* out);

// Runtime memory outside what the model allocates, per GPU: CUDA context
// (~300-500 MiB), cuBLAS/cuBLASLt workspaces, NCCL buffers (NCCL_BUFFSIZE
// 4 MiB × channels × peers) and allocator fragmentation. 1 GiB is a stated
// round figure; serve on CPU passes 0.
constexpr int64_t kDefaultGpuReserveBytes = int64_t{1} << 30;

// A draft model for speculative decoding (--speculative-config "model";
// model/draft_model.h): whole (TP 1, PP 1) beside each replica's driver,
// rank 0 (tp 0, pp 0), so it is charged to that rank's device. Its paged KV
// cache gets draft_kv_blocks(the target's blocks): the replica's KV pool and
// the draft's grow together, so a rank-0 device's KV memory buys blocks of
// kv_block_bytes + draft kv_bytes_per_token × block_size. A zero weight_bytes
// means no draft. draft_budget() fills it; plan and serve both call it.
struct DraftBudget {
  int64_t weight_bytes = 0;        // rank_weight_bytes(draft, TP 1, PP 1): exact shapes, its dtype as loaded
  int64_t workspace_bytes = 0;     // its step buffers (draft_workspace_bytes)
  int64_t kv_bytes_per_token = 0;  // model_kv_bytes_per_token(draft, kv dtype): every layer in one pool
  bool enabled() const { return weight_bytes > 0; }
};

// The draft's KV blocks: the target replica's pool (so it can hold what every
// sequence the target holds has fed it), and one spare: a sequence holds its
// context and all but the last of its drafts, which may cross a block edge
// the target's blocks have not reached yet. Serve's DraftModel gets exactly this.
int64_t draft_kv_blocks(int64_t target_kv_blocks);

struct MemoryBudgetOptions {
  double gpu_memory_utilization = 0.9;  // fraction of the device memory this process may use
  int64_t max_num_batched_tokens = 8192;  // tokens in one forward step (sizes the workspace)
  int64_t max_num_seqs = 8;               // sequences in one step (sizes logits and sampler)
  // Logits rows one sequence asks in a step: 1, or 1 + num_speculative_tokens
  // under speculative decoding (its verification rows; n-gram or draft).
  int64_t logit_rows_per_seq = 1;
  KvCacheDType kv_cache_dtype = KvCacheDType::kAuto;
  int64_t block_size = kDefaultBlockSize;
  int64_t reserve_bytes = kDefaultGpuReserveBytes;
  DraftBudget draft;  // --speculative-config "model": charged to each replica's rank 0 (none by default)
};

// Activation/workspace bytes of one rank for one step, by part: the buffers
// the model allocates (model/causal_lm.cpp reserve_step_buffers, and
// model/layers.cpp Workspace::reserve), all live at once and reused by every
// layer; tests/model/workspace_accounting_test.cpp measures them against
// this. T = max_num_batched_tokens, S = max_num_seqs, a = 4 (activations are
// f32 on both backends, whatever the weights' dtype):
//   hidden    = 3·T·hidden_size·a     residual stream, normed input, projection output
//   attention = T·(2·q_heads + 2·kv_heads)·head_dim·a   q, k, v and attention output of this rank
//   mlp       = 2·T·inter_slice·a (dense layers: gate, up)
//               + T·n_experts·a + 2·T·top_k·4 (MoE: router logits, top-k ids and weights)
//               + T·(2·hidden_size + 2·expert_inter_slice)·4 (MoE: the expert op's scratch, at worst)
//   reduce, pipeline = 0              all-reduces run in place; stages send the residual stream
//   logits    = R·hidden_size·a + R·vocab·4 (+ R·vocab_slice·a + R·vocab·a when tp > 1), R = S·logit_rows_per_seq
//               last stage only: the last positions' hidden, the logits returned (local, gathered);
//               speculative decoding's verification steps ask k + 1 rows per sequence
//   sampler   = 2·S·vocab·4           last stage: the host sampler's probabilities
// CUDA's own scratch (bf16 copies of GEMM inputs, the decode-attention
// partitions) is not counted here: it falls in the runtime reserve.
struct WorkspaceBreakdown {
  int64_t hidden = 0;
  int64_t attention = 0;
  int64_t mlp = 0;
  int64_t reduce = 0;
  int64_t pipeline = 0;
  int64_t logits = 0;
  int64_t sampler = 0;
  int64_t total() const;  // the sum of the parts
};

WorkspaceBreakdown workspace_breakdown(const ModelSpec& spec, const Layout& layout, int tp_rank, int pp_rank,
                                       const MemoryBudgetOptions& options);

// The draft model's step buffers (model/draft_model.h): it feeds at most
// max_num_batched_tokens tokens and max_num_seqs logit rows per forward step
// and reserves those buffers when it loads, so they are what
// workspace_breakdown gives the whole draft at TP 1, PP 1 without the sampler
// (it takes the argmax on the host), plus the host copy of its logits rows,
// S × draft vocab × 4.
int64_t draft_workspace_bytes(const ModelSpec& draft, const MemoryBudgetOptions& options);
// weight_bytes, workspace_bytes and kv_bytes_per_token of `draft` under options.
DraftBudget draft_budget(const ModelSpec& draft, const MemoryBudgetOptions& options);

// Speculative decoding's share of the budget, set alike by plan and serve:
// each sequence's k + 1 verification rows (n-gram or draft), and with a
// draft (non-null) its budget (draft_budget, after the rows are set).
void add_speculation(MemoryBudgetOptions& options, int64_t num_speculative_tokens, const ModelSpec* draft);

// K and V for one token on this rank: 2 × kv_heads_on_rank × head_dim × kv_bytes × layers_on_stage.
// Replicated KV heads (tp > n_kv_heads, or uneven GQA groups) are counted on every rank that holds them.
int64_t rank_kv_bytes_per_token(const ModelSpec& spec, const Layout& layout, int tp_rank, int pp_rank,
                                KvCacheDType kv);
// The whole model on one device: 2 × n_kv_heads × head_dim × kv_bytes × n_layers
// (Qwen2.5-72B bf16: 327,680 B; Qwen2.5-7B: 57,344 B).
int64_t model_kv_bytes_per_token(const ModelSpec& spec, KvCacheDType kv);

// KV per layer type (DESIGN.md §4, issue #22). Global layers keep every
// position of a sequence; local (sliding-window) layers are read only over
// their last `window` positions. Whole model on one device, like
// model_kv_bytes_per_token; global + local bytes = model_kv_bytes_per_token.
struct KvLayerTypes {
  int64_t n_global_layers = 0;
  int64_t n_local_layers = 0;
  int64_t window = 0;                   // spec.sliding_window (0: no local layer)
  int64_t global_bytes_per_token = 0;   // 2 × n_kv_heads × head_dim × kv_bytes × n_global_layers
  int64_t local_bytes_per_token = 0;    // the same over the local layers
};
KvLayerTypes kv_layer_types(const ModelSpec& spec, KvCacheDType kv);

// The window serve's paged cache frees blocks by (SchedulerConfig::sliding_window):
// spec.sliding_window when every layer slides (Mistral v0.1, Phi-3-mini-4k),
// else 0. Gemma 3's global layers keep the whole past in that pool; its local
// layers have a pool of their own (local_pool_window).
int64_t cache_sliding_window(const ModelSpec& spec);

// Hybrid models (some layers slide, some do not: Gemma 3): the local layers
// keep their KV in a pool of their own whose blocks leave the window
// (SchedulerConfig::local_sliding_window). Returns that window, else 0.
int64_t local_pool_window(const ModelSpec& spec);
// The most blocks that pool gets, the same on every rank of a replica:
// max_num_seqs sequences at once, each holding at most
// ceil((window - 1) / block) + 2 blocks besides its share of one step's
// max_num_batched_tokens, whose blocks add ceil(max_num_batched_tokens / block):
//   max_num_seqs × (ceil((window − 1) / block) + 2) + ceil(max_num_batched_tokens / block).
// One sequence's bound (kv's max_blocks_held) never exceeds it. It gets fewer
// when memory is short: never more blocks than the global pool, since a
// sequence holds a local block only where it holds the global block of the
// same positions (MemoryBudget's split). 0 without a local pool.
int64_t local_pool_blocks(const ModelSpec& spec, const MemoryBudgetOptions& options);
// K and V for one token on this rank's local layers when they have a pool of
// their own (local_pool_window > 0), else 0. Part of rank_kv_bytes_per_token.
int64_t rank_local_kv_bytes_per_token(const ModelSpec& spec, const Layout& layout, int tp_rank, int pp_rank,
                                      KvCacheDType kv);

// KV token slots one sequence of n_context positions holds at most in the
// paged cache (whole blocks): every block of its context, or with
// cache_sliding_window() the blocks of the window and one step's chunk of
// max_num_batched_tokens (kv's max_blocks_held, which the scheduler's
// check_fits uses too).
int64_t kv_tokens_per_sequence(const ModelSpec& spec, int64_t n_context, int64_t block_size,
                               int64_t max_num_batched_tokens);

// The longest context one sequence can have in a pool of kv_tokens slots:
// max_position_embeddings when its kv_tokens_per_sequence fits (a sliding
// window over every layer), else the pool's whole-block tokens, capped by
// max_position_embeddings. plan's default max-model-len and serve's.
int64_t max_context_for_pool(const ModelSpec& spec, int64_t kv_tokens, int64_t block_size,
                             int64_t max_num_batched_tokens);

// n_kv_blocks_capacity of a rank whose layers are all local (a pipeline
// stage of Gemma 3 without a global layer): its main pool takes no memory, so
// the replica's other ranks bind.
constexpr int64_t kUnboundedBlocks = int64_t{1} << 40;

// One rank's budget. All sizes in bytes.
struct MemoryBudget {
  int tp_rank = 0;
  int pp_rank = 0;
  int64_t memory_bytes = 0;        // device memory (GPU total, or the CPU pool serve was given)
  double gpu_memory_utilization = 0;
  int64_t budget_bytes = 0;        // floor(memory_bytes × gpu_memory_utilization)
  int64_t weight_bytes = 0;        // rank_weight_bytes(): exact shapes after sharding, replication included
  int64_t workspace_bytes = 0;     // workspace_breakdown().total()
  WorkspaceBreakdown workspace;
  int64_t reserve_bytes = 0;       // runtime reserve (options.reserve_bytes)
  int64_t usable_bytes = 0;        // budget − weights − workspace − reserve (− the draft's weights, workspace
                                   // and spare KV block on rank 0 with a draft); negative = shortfall
  // The main pool, whose blocks hold every position of a sequence's context:
  // all layers, or with a local pool the global layers only.
  int64_t kv_bytes_per_token = 0;  // rank_kv_bytes_per_token() − local_kv_bytes_per_token
  int64_t block_size = 0;          // tokens per KV block
  int64_t kv_block_bytes = 0;      // kv_bytes_per_token × block_size
  // Hybrid models (local_pool_window > 0): the local layers' own pool, sized
  // first (local_pool_blocks); the main pool gets what is left.
  int64_t local_kv_bytes_per_token = 0;  // rank_local_kv_bytes_per_token()
  int64_t n_local_kv_blocks_max = 0;     // local_pool_blocks()
  int64_t n_local_kv_blocks = 0;         // min(n_local_kv_blocks_max, the blocks both pools get when each
                                         // has as many: floor(usable / (kv_block_bytes + local_kv_block_bytes))
                                         // on the tightest rank of the replica)
  int64_t local_kv_block_bytes = 0;      // local_kv_bytes_per_token × block_size
  int64_t local_kv_cache_bytes = 0;      // n_local_kv_blocks × local_kv_block_bytes
  int64_t n_kv_blocks_capacity = 0;  // floor(max(usable − local_kv_cache_bytes, 0) / kv_block_bytes): this rank
                                     // (with the replica's local pool after match_replica_kv; a rank without
                                     // a global layer: kUnboundedBlocks)
  int64_t n_kv_blocks = 0;         // blocks allocated: the capacity, or after match_replica_kv the
                                   // replica's smallest capacity (every rank holds the same tokens)
  int64_t n_kv_tokens = 0;         // n_kv_blocks × block_size
  int64_t kv_cache_bytes = 0;      // n_kv_blocks × kv_block_bytes + local_kv_cache_bytes: what serve allocates
  // The draft model (options.draft), on the replica's rank 0 only (else all 0).
  // Its blocks come with the main pool's: n_kv_blocks_capacity divides what
  // is left by kv_block_bytes + draft_kv_block_bytes.
  int64_t draft_weight_bytes = 0;
  int64_t draft_workspace_bytes = 0;
  int64_t draft_kv_bytes_per_token = 0;
  int64_t draft_kv_block_bytes = 0;       // draft_kv_bytes_per_token × block_size
  int64_t n_draft_kv_blocks = 0;          // draft_kv_blocks(n_kv_blocks)
  int64_t draft_kv_cache_bytes = 0;       // n_draft_kv_blocks × draft_kv_block_bytes: what serve's draft allocates
  bool has_draft() const { return draft_weight_bytes > 0; }
  bool fits() const { return n_kv_blocks > 0; }  // weights and workspace fit with room for one block
};

// Throws Error(kInvalidArgument) for a utilization outside (0, 1], non-positive
// token counts or block size, or a rank outside the layout.
MemoryBudget compute_memory_budget(const ModelSpec& spec, const Layout& layout, int tp_rank, int pp_rank,
                                   int64_t memory_bytes, const MemoryBudgetOptions& options);
// The same, with the model's tensors built once by the caller (plan).
MemoryBudget compute_memory_budget(const ModelSpec& spec, const ModelTensors& tensors, const Layout& layout,
                                   int tp_rank, int pp_rank, int64_t memory_bytes, const MemoryBudgetOptions& options);

// Every rank of a replica holds the KV of the same tokens (its heads, its
// layers): gives every rank the same local pool (n_local_kv_blocks, sized
// over the replica), sets each rank's n_kv_blocks to the smallest capacity
// among them and recomputes n_kv_tokens and kv_cache_bytes.
void match_replica_kv(std::vector<MemoryBudget>& budgets);

// The tp × pp ranks of one replica, in rank order (tp fastest); memory_bytes[r]
// is the memory of the device rank r lands on (size tp × pp, or size 1 = all
// equal). Already matched with match_replica_kv: these are the pools serve allocates.
std::vector<MemoryBudget> compute_replica_budgets(const ModelSpec& spec, const Layout& layout,
                                                  const std::vector<int64_t>& memory_bytes,
                                                  const MemoryBudgetOptions& options);
// Tokens the replica holds: the minimum over its ranks.
int64_t replica_kv_tokens(const std::vector<MemoryBudget>& budgets);

nlohmann::json memory_budget_json(const MemoryBudget& budget);

}  // namespace shardlm
