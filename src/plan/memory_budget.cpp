#include "plan/memory_budget.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/units.h"
#include "kv/block_table.h"

namespace shardlm {

size_t kv_dtype_size(KvCacheDType kv, DType weight_dtype) {
  switch (kv) {
    case KvCacheDType::kAuto: return dtype_size(weight_dtype);
    case KvCacheDType::kBF16: return 2;
    case KvCacheDType::kF16: return 2;
    case KvCacheDType::kF32: return 4;
    case KvCacheDType::kFp8: return 1;
  }
  return 2;
}

const char* kv_dtype_name(KvCacheDType kv) {
  switch (kv) {
    case KvCacheDType::kAuto: return "auto";
    case KvCacheDType::kBF16: return "bf16";
    case KvCacheDType::kF16: return "f16";
    case KvCacheDType::kF32: return "f32";
    case KvCacheDType::kFp8: return "fp8";
  }
  return "?";
}

bool parse_kv_cache_dtype(std::string_view text, KvCacheDType* out) {
  std::string s(text);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s == "auto") *out = KvCacheDType::kAuto;
  else if (s == "bf16" || s == "bfloat16") *out = KvCacheDType::kBF16;
  else if (s == "f16" || s == "fp16" || s == "float16" || s == "half") *out = KvCacheDType::kF16;
  else if (s == "f32" || s == "fp32" || s == "float32" || s == "float") *out = KvCacheDType::kF32;
  else if (s == "fp8" || s == "fp8_e4m3" || s == "fp8_e5m2") *out = KvCacheDType::kFp8;
  else return false;
  return true;
}

int64_t WorkspaceBreakdown::total() const { return hidden + attention + mlp + reduce + pipeline + logits + sampler; }

WorkspaceBreakdown workspace_breakdown(const ModelSpec& spec, const Layout& layout, int tp_rank, int pp_rank,
                                       const MemoryBudgetOptions& options) {
  const RankShard s = shard_for(spec, layout, tp_rank, pp_rank);
  // Both backends keep activations in f32 (Backend::activation_dtype()),
  // whatever the weights' dtype; the buffers below are the model's
  // (CausalLM::reserve_step_buffers, Workspace::reserve), all live at once.
  const int64_t a = 4;
  const int64_t t = options.max_num_batched_tokens;
  const int64_t seqs = options.max_num_seqs;
  const int64_t h = spec.hidden_size;
  WorkspaceBreakdown w;
  w.hidden = 3 * t * h * a;
  w.attention = t * (2 * s.q_heads.size() + 2 * s.kv_heads.size()) * spec.head_dim * a;
  // Dense layers: gate and up over the rank's columns (act(gate)·up is written
  // over gate). MoE layers: the router's logits and each token's top-k ids and weights.
  const bool has_dense = !spec.is_moe() || spec.n_moe_layers() < spec.n_layers;
  w.mlp = has_dense ? 2 * t * s.intermediate.size() * a : 0;
  if (spec.is_moe()) {
    const int64_t k = std::max<int64_t>(1, spec.n_experts_per_token);
    // + the expert op's scratch (backend/cpu/moe_ops.cpp: the rows routed to one
    // expert gathered, their outputs, gate and up; host vectors the allocator
    // does not meter), at its worst: every token routed to one expert.
    w.mlp += t * spec.n_experts * a + 2 * t * k * 4 + t * (2 * h + 2 * s.expert_intermediate.size()) * 4;
  }
  w.reduce = 0;    // all-reduces run in place on the projection output
  w.pipeline = 0;  // stages send and receive the residual-stream buffer itself
  if (s.last_stage) {
    // A verification step (speculative decoding) asks k + 1 rows of each sequence.
    const int64_t rows = seqs * std::max<int64_t>(options.logit_rows_per_seq, 1);
    w.logits = rows * h * a + rows * spec.vocab_size * 4;  // last positions' hidden, the f32 logits returned
    if (layout.tp > 1) w.logits += rows * s.vocab.size() * a + rows * spec.vocab_size * a;  // local, gathered
    w.sampler = 2 * seqs * spec.vocab_size * 4;  // the host sampler's probabilities
  }
  return w;
}

int64_t rank_kv_bytes_per_token(const ModelSpec& spec, const Layout& layout, int tp_rank, int pp_rank,
                                KvCacheDType kv) {
  const RankShard s = shard_for(spec, layout, tp_rank, pp_rank);
  return 2 * s.kv_heads.size() * spec.head_dim * static_cast<int64_t>(kv_dtype_size(kv, spec.dtype)) *
         s.layers.size();
}

int64_t model_kv_bytes_per_token(const ModelSpec& spec, KvCacheDType kv) {
  return 2 * spec.n_kv_heads * spec.head_dim * static_cast<int64_t>(kv_dtype_size(kv, spec.dtype)) * spec.n_layers;
}

KvLayerTypes kv_layer_types(const ModelSpec& spec, KvCacheDType kv) {
  KvLayerTypes t;
  for (int64_t l = 0; l < spec.n_layers; ++l) (spec.is_sliding_layer(l) ? t.n_local_layers : t.n_global_layers) += 1;
  t.window = t.n_local_layers > 0 ? spec.sliding_window : 0;
  const int64_t per_layer = 2 * spec.n_kv_heads * spec.head_dim * static_cast<int64_t>(kv_dtype_size(kv, spec.dtype));
  t.global_bytes_per_token = per_layer * t.n_global_layers;
  t.local_bytes_per_token = per_layer * t.n_local_layers;
  return t;
}

int64_t cache_sliding_window(const ModelSpec& spec) {
  if (spec.sliding_window <= 0 || spec.n_layers < 1) return 0;
  for (int64_t l = 0; l < spec.n_layers; ++l)
    if (!spec.is_sliding_layer(l)) return 0;
  return spec.sliding_window;
}

int64_t local_pool_window(const ModelSpec& spec) {
  if (spec.sliding_window <= 0 || cache_sliding_window(spec) > 0) return 0;
  for (int64_t l = 0; l < spec.n_layers; ++l)
    if (spec.is_sliding_layer(l)) return spec.sliding_window;
  return 0;
}

int64_t local_pool_blocks(const ModelSpec& spec, const MemoryBudgetOptions& o) {
  const int64_t w = local_pool_window(spec);
  if (w == 0) return 0;
  const int64_t bs = o.block_size;
  return o.max_num_seqs * ((w - 1 + bs - 1) / bs + 2) + (o.max_num_batched_tokens + bs - 1) / bs;
}

int64_t rank_local_kv_bytes_per_token(const ModelSpec& spec, const Layout& layout, int tp_rank, int pp_rank,
                                      KvCacheDType kv) {
  if (local_pool_window(spec) == 0) return 0;
  const RankShard s = shard_for(spec, layout, tp_rank, pp_rank);
  int64_t n_local = 0;
  for (int64_t l = s.layers.begin; l < s.layers.end; ++l) n_local += spec.is_sliding_layer(l) ? 1 : 0;
  return 2 * s.kv_heads.size() * spec.head_dim * static_cast<int64_t>(kv_dtype_size(kv, spec.dtype)) * n_local;
}

int64_t kv_tokens_per_sequence(const ModelSpec& spec, int64_t n_context, int64_t block_size,
                               int64_t max_num_batched_tokens) {
  if (block_size < 1 || max_num_batched_tokens < 1)
    fail(ErrorCode::kInvalidArgument, "KV sizing: block size (", block_size, ") and --max-num-batched-tokens (",
         max_num_batched_tokens, ") must be >= 1");
  const int64_t window = std::min<int64_t>(cache_sliding_window(spec), INT32_MAX);
  return max_blocks_held(n_context, static_cast<int32_t>(std::min<int64_t>(block_size, INT32_MAX)),
                         static_cast<int32_t>(window), max_num_batched_tokens) *
         block_size;
}

int64_t max_context_for_pool(const ModelSpec& spec, int64_t kv_tokens, int64_t block_size,
                             int64_t max_num_batched_tokens) {
  const int64_t whole = std::min(spec.max_position_embeddings, kv_tokens / block_size * block_size);
  if (cache_sliding_window(spec) > 0 &&
      kv_tokens_per_sequence(spec, spec.max_position_embeddings, block_size, max_num_batched_tokens) <= kv_tokens)
    return spec.max_position_embeddings;
  return whole;
}

int64_t draft_kv_blocks(int64_t target_kv_blocks) { return std::max<int64_t>(target_kv_blocks, 0) + 1; }

int64_t draft_workspace_bytes(const ModelSpec& draft, const MemoryBudgetOptions& options) {
  MemoryBudgetOptions one_row = options;  // the draft asks one row of each sequence per step
  one_row.logit_rows_per_seq = 1;
  const WorkspaceBreakdown w = workspace_breakdown(draft, Layout{}, 0, 0, one_row);
  return w.total() - w.sampler + options.max_num_seqs * draft.vocab_size * 4;
}

DraftBudget draft_budget(const ModelSpec& draft, const MemoryBudgetOptions& options) {
  DraftBudget d;
  d.weight_bytes = rank_weight_bytes(draft, Layout{}, 0, 0);
  d.workspace_bytes = draft_workspace_bytes(draft, options);
  d.kv_bytes_per_token = model_kv_bytes_per_token(draft, options.kv_cache_dtype);
  return d;
}

void add_speculation(MemoryBudgetOptions& options, int64_t num_speculative_tokens, const ModelSpec* draft) {
  options.logit_rows_per_seq = 1 + std::max<int64_t>(num_speculative_tokens, 0);
  options.draft = draft ? draft_budget(*draft, options) : DraftBudget{};
}

// n_kv_blocks and what follows from it (the draft's pool on rank 0 included).
static void set_kv_blocks(MemoryBudget& b, int64_t blocks) {
  b.n_kv_blocks = blocks;
  b.n_kv_tokens = blocks * b.block_size;
  b.kv_cache_bytes = blocks * b.kv_block_bytes + b.local_kv_cache_bytes;
  if (b.has_draft()) {
    b.n_draft_kv_blocks = draft_kv_blocks(blocks);
    b.draft_kv_cache_bytes = b.n_draft_kv_blocks * b.draft_kv_block_bytes;
  }
}

// The local layers' pool first (the same count on every rank: at most its
// cap, and no more blocks than the global pool gets when both get as many on
// the tightest rank), then each rank's global capacity from what is left.
static void split_kv_pools(std::vector<MemoryBudget>& budgets) {
  if (budgets.empty()) return;
  const int64_t cap = budgets.front().n_local_kv_blocks_max;
  int64_t n_local = 0;
  if (cap > 0) {
    int64_t even = kUnboundedBlocks;
    for (const MemoryBudget& b : budgets)
      if (const int64_t both = b.kv_block_bytes + b.local_kv_block_bytes + b.draft_kv_block_bytes; both > 0)
        even = std::min(even, std::max<int64_t>(b.usable_bytes, 0) / both);
    n_local = std::min(cap, even);
  }
  for (MemoryBudget& b : budgets) {
    b.n_local_kv_blocks = n_local;
    b.local_kv_cache_bytes = n_local * b.local_kv_block_bytes;
    const int64_t for_main = b.usable_bytes - b.local_kv_cache_bytes;
    b.n_kv_blocks_capacity = for_main <= 0                    ? 0
                             : cap > 0 && n_local == 0        ? 0  // not one block for the local layers
                             : b.kv_block_bytes + b.draft_kv_block_bytes > 0
                                 ? for_main / (b.kv_block_bytes + b.draft_kv_block_bytes)
                                                              : kUnboundedBlocks;
  }
}

MemoryBudget compute_memory_budget(const ModelSpec& spec, const Layout& layout, int tp_rank, int pp_rank,
                                   int64_t memory_bytes, const MemoryBudgetOptions& options) {
  return compute_memory_budget(spec, ModelTensors(spec), layout, tp_rank, pp_rank, memory_bytes, options);
}

MemoryBudget compute_memory_budget(const ModelSpec& spec, const ModelTensors& tensors, const Layout& layout,
                                   int tp_rank, int pp_rank, int64_t memory_bytes, const MemoryBudgetOptions& options) {
  if (!(options.gpu_memory_utilization > 0.0 && options.gpu_memory_utilization <= 1.0))
    fail(ErrorCode::kInvalidArgument, "--gpu-memory-utilization ", options.gpu_memory_utilization,
         ": must be in (0, 1], the fraction of each device's memory shardlm may use (vLLM's default is 0.9)");
  if (options.max_num_batched_tokens < 1)
    fail(ErrorCode::kInvalidArgument, "--max-num-batched-tokens ", options.max_num_batched_tokens, ": must be at least 1");
  if (options.max_num_seqs < 1)
    fail(ErrorCode::kInvalidArgument, "--max-num-seqs ", options.max_num_seqs, ": must be at least 1");
  if (options.block_size < 1)
    fail(ErrorCode::kInvalidArgument, "--block-size ", options.block_size, ": must be at least 1");
  if (options.reserve_bytes < 0)
    fail(ErrorCode::kInvalidArgument, "reserve bytes ", options.reserve_bytes, ": must not be negative");
  if (memory_bytes < 0) fail(ErrorCode::kInvalidArgument, "device memory ", memory_bytes, " bytes: must not be negative");
  validate_layout(spec, layout);
  if (tp_rank < 0 || tp_rank >= layout.tp || pp_rank < 0 || pp_rank >= layout.pp)
    fail(ErrorCode::kInvalidArgument, "rank (tp ", tp_rank, ", pp ", pp_rank, ") is outside layout ", layout.to_string());

  MemoryBudget b;
  b.tp_rank = tp_rank;
  b.pp_rank = pp_rank;
  b.memory_bytes = memory_bytes;
  b.gpu_memory_utilization = options.gpu_memory_utilization;
  b.budget_bytes = static_cast<int64_t>(std::floor(static_cast<double>(memory_bytes) * options.gpu_memory_utilization));
  b.weight_bytes = rank_weight_bytes(spec, tensors, layout, tp_rank, pp_rank);
  b.workspace = workspace_breakdown(spec, layout, tp_rank, pp_rank, options);
  b.workspace_bytes = b.workspace.total();
  b.reserve_bytes = options.reserve_bytes;
  b.usable_bytes = b.budget_bytes - b.weight_bytes - b.workspace_bytes - b.reserve_bytes;
  b.block_size = options.block_size;
  if (options.draft.enabled() && tp_rank == 0 && pp_rank == 0) {
    b.draft_weight_bytes = options.draft.weight_bytes;
    b.draft_workspace_bytes = options.draft.workspace_bytes;
    b.draft_kv_bytes_per_token = options.draft.kv_bytes_per_token;
    b.draft_kv_block_bytes = b.draft_kv_bytes_per_token * b.block_size;
    b.usable_bytes -= b.draft_weight_bytes + b.draft_workspace_bytes + b.draft_kv_block_bytes;  // its spare block
  }
  b.local_kv_bytes_per_token = rank_local_kv_bytes_per_token(spec, layout, tp_rank, pp_rank, options.kv_cache_dtype);
  b.kv_bytes_per_token =
      rank_kv_bytes_per_token(spec, layout, tp_rank, pp_rank, options.kv_cache_dtype) - b.local_kv_bytes_per_token;
  b.kv_block_bytes = b.kv_bytes_per_token * b.block_size;
  b.n_local_kv_blocks_max = local_pool_blocks(spec, options);
  b.local_kv_block_bytes = b.local_kv_bytes_per_token * b.block_size;
  std::vector<MemoryBudget> alone{b};
  split_kv_pools(alone);
  b = alone.front();
  set_kv_blocks(b, b.n_kv_blocks_capacity);
  return b;
}

std::vector<MemoryBudget> compute_replica_budgets(const ModelSpec& spec, const Layout& layout,
                                                  const std::vector<int64_t>& memory_bytes,
                                                  const MemoryBudgetOptions& options) {
  const int n = layout.ranks_per_replica();
  if (memory_bytes.size() != 1 && static_cast<int>(memory_bytes.size()) != n)
    fail(ErrorCode::kInvalidArgument, "compute_replica_budgets: ", memory_bytes.size(), " memory sizes for ", n,
         " ranks of ", layout.to_string(), "; give one per rank or one for all");
  std::vector<MemoryBudget> out;
  out.reserve(n);
  for (int r = 0; r < n; ++r) {
    WorldConfig w{r, layout};
    out.push_back(compute_memory_budget(spec, layout, w.tp_rank(), w.pp_rank(),
                                        memory_bytes.size() == 1 ? memory_bytes[0] : memory_bytes[r], options));
  }
  match_replica_kv(out);
  return out;
}

void match_replica_kv(std::vector<MemoryBudget>& budgets) {
  if (budgets.empty()) return;
  split_kv_pools(budgets);
  int64_t blocks = budgets.front().n_kv_blocks_capacity;
  for (const auto& b : budgets) blocks = std::min(blocks, b.n_kv_blocks_capacity);
  for (auto& b : budgets) set_kv_blocks(b, blocks);
}

int64_t replica_kv_tokens(const std::vector<MemoryBudget>& budgets) {
  int64_t n = budgets.empty() ? 0 : budgets.front().n_kv_tokens;
  for (const auto& b : budgets) n = std::min(n, b.n_kv_tokens);
  return n;
}

nlohmann::json memory_budget_json(const MemoryBudget& b) {
  return {{"tp_rank", b.tp_rank},
          {"pp_rank", b.pp_rank},
          {"memory_bytes", b.memory_bytes},
          {"gpu_memory_utilization", b.gpu_memory_utilization},
          {"budget_bytes", b.budget_bytes},
          {"weight_bytes", b.weight_bytes},
          {"workspace_bytes", b.workspace_bytes},
          {"workspace",
           {{"hidden", b.workspace.hidden},
            {"attention", b.workspace.attention},
            {"mlp", b.workspace.mlp},
            {"reduce", b.workspace.reduce},
            {"pipeline", b.workspace.pipeline},
            {"sampler", b.workspace.sampler},
            {"logits", b.workspace.logits}}},
          {"reserve_bytes", b.reserve_bytes},
          {"usable_bytes", b.usable_bytes},
          {"kv_bytes_per_token", b.kv_bytes_per_token},
          {"block_size", b.block_size},
          {"kv_block_bytes", b.kv_block_bytes},
          {"local_kv_bytes_per_token", b.local_kv_bytes_per_token},
          {"n_local_kv_blocks_max", b.n_local_kv_blocks_max},
          {"n_local_kv_blocks", b.n_local_kv_blocks},
          {"local_kv_block_bytes", b.local_kv_block_bytes},
          {"local_kv_cache_bytes", b.local_kv_cache_bytes},
          {"n_kv_blocks_capacity", b.n_kv_blocks_capacity},
          {"n_kv_blocks", b.n_kv_blocks},
          {"n_kv_tokens", b.n_kv_tokens},
          {"kv_cache_bytes", b.kv_cache_bytes},
          {"draft", b.has_draft() ? nlohmann::json{{"weight_bytes", b.draft_weight_bytes},
                                                   {"workspace_bytes", b.draft_workspace_bytes},
                                                   {"kv_bytes_per_token", b.draft_kv_bytes_per_token},
                                                   {"kv_block_bytes", b.draft_kv_block_bytes},
                                                   {"n_kv_blocks", b.n_draft_kv_blocks},
                                                   {"kv_cache_bytes", b.draft_kv_cache_bytes}}
                                  : nlohmann::json()},
          {"fits", b.fits()}};
}

}  // namespace shardlm
