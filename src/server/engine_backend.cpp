#include "server/engine_backend.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <sstream>
#include <thread>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "backend/device/memory_accounting.h"
#include "core/error.h"
#include "core/units.h"
#include "engine/tokenizer_detokenizer.h"
#include "loader/generation_config.h"
#include "server/connection_server.h"
#include "server/structured_output.h"
#include "model/draft_model.h"
#include "model/quantized_linear.h"
#include "model/weight_source.h"

namespace shardlm::server {

namespace {

constexpr int64_t kDefaultCpuKvCacheBytes = int64_t{4} << 30;  // vLLM's CPU default (VLLM_CPU_KVCACHE_SPACE)

int64_t system_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : int64_t{8} << 30;
}

DType kv_dtype_of(KvCacheDType kv, DType weights) {
  switch (kv) {
    case KvCacheDType::kAuto: return weights;
    case KvCacheDType::kBF16: return DType::kBF16;
    case KvCacheDType::kF16: return DType::kF16;
    case KvCacheDType::kF32: return DType::kF32;
    case KvCacheDType::kFp8: return DType::kF8E4M3;  // E4M3, scale 1 (vLLM's default without calibration)
  }
  return weights;
}

// The state of one request shared by the engine thread (callbacks) and the
// HTTP thread (RequestStream): the engine may call back after the HTTP side
// is gone, so both hold it.
struct StreamState {
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<GenerateEvent> events;
  bool finished = false;
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;               // prompt tokens the prefix cache served
  std::vector<int64_t> completion_by_seq;  // [n]
  std::function<void()> on_finish;         // releases the routing slot
};

class EngineStream final : public RequestStream {
 public:
  EngineStream(std::shared_ptr<StreamState> state, Engine& engine, std::string request_id)
      : state_(std::move(state)), engine_(engine), request_id_(std::move(request_id)) {}
  ~EngineStream() override {
    if (!done()) cancel();
  }
  bool next(std::vector<GenerateEvent>* out, std::chrono::milliseconds timeout) override {
    // The handler submitted all it will and now waits: an idle engine
    // holding a burst need not wait for this request any longer.
    ConnectionServer::release_current_arrival();
    std::unique_lock<std::mutex> lock(state_->mutex);
    state_->cv.wait_for(lock, timeout, [&] { return !state_->events.empty() || state_->finished; });
    if (state_->events.empty()) return false;
    while (!state_->events.empty()) {
      out->push_back(std::move(state_->events.front()));
      state_->events.pop_front();
    }
    return true;
  }
  bool done() const override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->finished && state_->events.empty();
  }
  void cancel() override { engine_.abort(request_id_); }
  int64_t prompt_tokens() const override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->prompt_tokens;
  }
  int64_t cached_tokens() const override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->cached_tokens;
  }
  int64_t completion_tokens() const override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    int64_t n = 0;
    for (int64_t c : state_->completion_by_seq) n += c;
    return n;
  }

 private:
  std::shared_ptr<StreamState> state_;
  Engine& engine_;
  std::string request_id_;
};

std::string replica_error(size_t d, const EngineHealth& h) {
  return str_cat("replica ", d, ": ", h.fatal ? "down: " : "restarting its executor after: ", h.error);
}

}  // namespace

struct EngineBackend::Replica {
  std::unique_ptr<ModelExecutor> executor;
  std::unique_ptr<Engine> engine;
};

EngineBackend::EngineBackend(EngineBackendOptions options) : options_(std::move(options)) {}

EngineBackend::~EngineBackend() { shutdown(false); }

void EngineBackend::shutdown(bool drain) {
  ready_ = false;
  for (size_t d = 0; d < replicas_.size(); ++d) {
    auto& r = replicas_[d];
    if (!r->engine) continue;
    r->engine->stop(drain);
    if (!options_.speculative.enabled()) continue;
    // The acceptance rate over the run (also in /metrics as vllm:spec_decode_*).
    const MetricsSnapshot m = r->engine->metrics().snapshot();
    std::fprintf(stderr,
                 "shardlm serve: replica %zu speculative decoding (%s): %lld drafts, %lld draft tokens, "
                 "%lld accepted (%.1f%%)\n",
                 d, options_.speculative.uses_draft_model() ? "draft model" : "ngram",
                 static_cast<long long>(m.spec_decode_num_drafts_total),
                 static_cast<long long>(m.spec_decode_num_draft_tokens_total),
                 static_cast<long long>(m.spec_decode_num_accepted_tokens_total),
                 m.spec_decode_num_draft_tokens_total > 0
                     ? 100.0 * double(m.spec_decode_num_accepted_tokens_total) / double(m.spec_decode_num_draft_tokens_total)
                     : 0.0);
  }
}

std::string LoadReport::text() const {
  std::ostringstream out;
  const int64_t per_token = budgets.empty() ? 0 : budgets[0].kv_bytes_per_token;
  out << "memory budget per rank (GiB = 2^30 bytes):\n";
  for (size_t r = 0; r < budgets.size(); ++r) {
    const MemoryBudget& b = budgets[r];
    out << "  rank " << r << " (tp " << b.tp_rank << ", pp " << b.pp_rank << "): weights "
        << format_gib(static_cast<double>(b.weight_bytes), 3) << " (" << with_commas(b.weight_bytes) << " B), KV cache "
        << format_gib(static_cast<double>(b.kv_cache_bytes), 3) << " (" << with_commas(b.n_kv_blocks) << " blocks of "
        << b.block_size << " tokens, " << with_commas(b.kv_bytes_per_token) << " B/token"
        << (b.n_local_kv_blocks > 0 ? str_cat("; local layers' pool ", with_commas(b.n_local_kv_blocks), " blocks, ",
                                              with_commas(b.local_kv_bytes_per_token), " B/token")
                                    : std::string())
        << "), workspace "
        << format_gib(static_cast<double>(b.workspace_bytes), 3) << "\n";
    if (r < allocated.size()) {
      // Measured by the rank's allocator (on a GPU: cudaMemGetInfo deltas,
      // which round to the driver's pages, hence the tolerance there).
      const auto& a = allocated[r];
      const double tol = measured_tolerance;
      const auto u = [](int64_t v) { return static_cast<uint64_t>(std::max<int64_t>(v, 0)); };
      out << "    allocated (measured): weights " << with_commas(a.weight_bytes) << " B ("
          << backend::plan_agreement_text(u(b.weight_bytes), u(a.weight_bytes), tol) << "), KV cache "
          << with_commas(a.kv_cache_bytes) << " B ("
          << backend::plan_agreement_text(u(b.kv_cache_bytes), u(a.kv_cache_bytes), tol) << "); weights + KV "
          << backend::plan_agreement_text(u(b.weight_bytes + b.kv_cache_bytes), u(a.weight_bytes + a.kv_cache_bytes), tol)
          << "\n";
    }
  }
  out << "KV cache holds " << with_commas(kv_tokens) << " tokens per replica (" << with_commas(per_token)
      << " B/token on rank 0); max model len " << with_commas(max_model_len) << " tokens; ";
  if (sliding_window > 0)
    out << "sliding window of " << with_commas(sliding_window) << " positions on every layer: blocks that leave it "
        << "are released, so a sequence of max model len holds at most " << with_commas(kv_tokens_per_seq)
        << " tokens; ";
  if (local_window > 0)
    out << "local layers: a sliding window of " << with_commas(local_window) << " positions in a pool of their own ("
        << with_commas(n_local_kv_blocks) << " blocks) that releases the blocks leaving it; ";
  out << "max concurrency at max model len: " << (kv_tokens_per_seq > 0 ? kv_tokens / kv_tokens_per_seq : 0)
      << " sequences";
  if (!graphs.empty()) out << "\n" << graphs;
  if (!draft_dir.empty()) {
    // Plan's figures (rank 0's budget) beside what the draft's allocator obtained.
    const MemoryBudget none;
    const MemoryBudget& b = budgets.empty() ? none : budgets[0];
    const auto u = [](int64_t v) { return static_cast<uint64_t>(std::max<int64_t>(v, 0)); };
    out << "\ndraft model " << draft_dir << " beside each replica's driver: planned weights "
        << with_commas(b.draft_weight_bytes) << " B, workspace " << with_commas(b.draft_workspace_bytes)
        << " B, KV cache " << with_commas(b.draft_kv_cache_bytes) << " B (" << with_commas(b.n_draft_kv_blocks)
        << " blocks, " << with_commas(b.draft_kv_bytes_per_token) << " B/token)\n    allocated (measured): weights "
        << with_commas(draft_weight_bytes) << " B ("
        << backend::plan_agreement_text(u(b.draft_weight_bytes), u(draft_weight_bytes), measured_tolerance)
        << "), workspace " << with_commas(draft_workspace_bytes) << " B ("
        << backend::plan_agreement_text(u(b.draft_workspace_bytes), u(draft_workspace_bytes), measured_tolerance)
        << "), KV cache " << with_commas(draft_kv_bytes) << " B ("
        << backend::plan_agreement_text(u(b.draft_kv_cache_bytes), u(draft_kv_bytes), measured_tolerance) << "; "
        << with_commas(draft_kv_tokens) << " tokens)";
  }
  return out.str();
}

void EngineBackend::load() {
  const auto& dir = options_.model_dir;
  ModelSpec spec = load_model_config(dir / "config.json");
  auto weights = open_checkpoint(dir);
  // Quantized checkpoints store scales in F16, BF16 or F32: size with what this one holds, as plan does.
  adopt_checkpoint_scales_dtype(spec, *weights);
  tokenizer_.emplace(Tokenizer::load(dir));
  chat_template_ = chat_template::load_model_chat_template(dir, options_.chat_template_limits);
  {
    GenerationDefaults g = load_generation_defaults(dir);
    sampling_defaults_ = {g.temperature, g.top_p, g.top_k, g.min_p, g.repetition_penalty, g.max_new_tokens};
  }
  detokenizer_ = std::make_unique<TokenizerDetokenizer>(*tokenizer_);

  Layout replica = options_.layout;
  replica.dp = 1;
  validate_layout(spec, replica);
  if (replica.pp_layer_partition.empty()) replica.pp_layer_partition = pipeline_partition(spec, replica);
  const int n_ranks_total = replica.tp * replica.pp * std::max(1, options_.layout.dp);

  // Size the KV cache as plan does: per rank, weights + workspace + KV.
  MemoryBudgetOptions mo;
  mo.gpu_memory_utilization = 1.0;
  mo.max_num_batched_tokens = options_.max_num_batched_tokens;
  mo.max_num_seqs = options_.max_num_seqs;
  mo.kv_cache_dtype = options_.kv_cache_dtype;
  mo.block_size = options_.block_size;
  mo.reserve_bytes = 0;  // CPU: no CUDA context or NCCL buffers (a GPU sets its reserve below)
  const DType kv_dtype = kv_dtype_of(options_.kv_cache_dtype, spec.dtype);
  ModelSpec draft_spec;
  if (options_.speculative.uses_draft_model()) {
    // The draft must speak the target's vocabulary; refused naming both directories.
    const std::filesystem::path draft_dir(options_.speculative.draft_model);
    draft_spec = load_model_config(draft_dir / "config.json");
    adopt_checkpoint_scales_dtype(draft_spec, *open_checkpoint(draft_dir));
    check_draft_vocabulary(dir, spec, draft_dir, draft_spec);
  }
  // Speculation's verification rows, and the draft beside rank 0 of each
  // replica: in the budget as plan --speculative-config puts them.
  if (options_.speculative.enabled())
    add_speculation(mo, options_.speculative.num_speculative_tokens,
                    options_.speculative.uses_draft_model() ? &draft_spec : nullptr);
  std::vector<MemoryBudget> fixed = compute_replica_budgets(spec, replica, {0}, mo);
  std::vector<int64_t> memory(fixed.size());
  const bool on_gpu = !options_.device.is_cpu();
  if (on_gpu && kv_dtype != DType::kBF16)
    fail(ErrorCode::kUnsupported, "--kv-cache-dtype ", dtype_safetensors_name(kv_dtype), " on ",
         options_.device.to_string(), ": the CUDA KV cache is bf16; use --kv-cache-dtype bf16 (or auto on a bf16 "
         "checkpoint)");
  if (on_gpu) {
    // vLLM's --gpu-memory-utilization: the fraction of the device's total
    // memory for everything; every rank of every replica shares this one GPU.
    mo.reserve_bytes = kDefaultGpuReserveBytes;  // CUDA context, cuBLASLt workspace, scratch
    fixed = compute_replica_budgets(spec, replica, {0}, mo);
    if (options_.kv_cache_memory_bytes > 0) {
      for (size_t r = 0; r < fixed.size(); ++r)
        memory[r] = options_.kv_cache_memory_bytes - fixed[r].usable_bytes;  // all else (a draft's too), and the KV
    } else {
      const double u = options_.memory_utilization > 0.0 ? options_.memory_utilization : 0.9;
      const backend::DeviceMemInfo info = backend::cuda_device_memory(options_.device.index);
      std::fill(memory.begin(), memory.end(),
                static_cast<int64_t>(backend::gpu_rank_memory_bytes(
                    u, info, options_.ranks_share_device ? n_ranks_total : 1, options_.device.index)));
    }
    report_.measured_tolerance = 0.01;
  } else if (options_.memory_utilization > 0.0) {
    mo.gpu_memory_utilization = options_.memory_utilization;
    std::fill(memory.begin(), memory.end(), system_memory_bytes() / n_ranks_total);
  } else {
    int64_t kv = options_.kv_cache_memory_bytes > 0 ? options_.kv_cache_memory_bytes
                                                    : std::min(kDefaultCpuKvCacheBytes / n_ranks_total,
                                                               system_memory_bytes() / 2 / n_ranks_total);
    // What a rank holds besides KV (fixed's usable with no memory is minus
    // that; rank 0's includes a draft's weights, workspace and spare block), and kv:
    // with a draft, rank 0's KV memory holds both models' KV.
    for (size_t r = 0; r < fixed.size(); ++r) memory[r] = kv - fixed[r].usable_bytes;
  }
  report_.spec = spec;
  report_.budgets = compute_replica_budgets(spec, replica, memory, mo);
  const MemoryBudget& b0 = report_.budgets[0];
  if (b0.n_kv_blocks < 1)
    fail(ErrorCode::kOutOfMemory, "the KV cache gets no block: rank 0 needs ", format_gib(static_cast<double>(b0.weight_bytes)),
         " of weights + ", format_gib(static_cast<double>(b0.workspace_bytes)), " of workspace",
         b0.has_draft() ? str_cat(" + ", format_gib(static_cast<double>(b0.draft_weight_bytes + b0.draft_workspace_bytes)),
                                  " for the draft model's weights and workspace, and each block needs one of the "
                                  "draft's beside it (", with_commas(b0.draft_kv_block_bytes), " B)")
                        : std::string(),
         b0.n_local_kv_blocks_max > 0
             ? str_cat(", and each block of the global layers (", with_commas(b0.kv_block_bytes),
                       " B) needs one of the local layers' own pool beside it (", with_commas(b0.local_kv_block_bytes),
                       " B)")
             : std::string(),
         "; raise --kv-cache-memory or ",
         "--gpu-memory-utilization");
  report_.n_kv_blocks = b0.n_kv_blocks;
  report_.kv_tokens = b0.n_kv_tokens;
  // A sliding window over every layer: a sequence holds only its window's blocks (plan's kv_tokens_per_sequence).
  const int64_t cache_window = cache_sliding_window(spec);
  if (options_.max_model_len > 0) {
    if (options_.max_model_len > spec.max_position_embeddings)
      fail(ErrorCode::kInvalidArgument, "--max-model-len ", options_.max_model_len, " exceeds the model's context of ",
           spec.max_position_embeddings, " tokens (", spec.max_position_source(), ")");
    const int64_t need =
        kv_tokens_per_sequence(spec, options_.max_model_len, options_.block_size, options_.max_num_batched_tokens);
    if (need > report_.kv_tokens)
      fail(ErrorCode::kOutOfMemory, "--max-model-len ", options_.max_model_len, " needs ", need, " tokens of KV cache for one ",
           "sequence", cache_window > 0 ? str_cat(" (its sliding window of ", cache_window, " and a chunk of ",
                                                  options_.max_num_batched_tokens, " batched tokens, in whole blocks)")
                                        : std::string(),
           ", but the KV cache holds ", report_.kv_tokens, " tokens (", b0.n_kv_blocks, " blocks of ", b0.block_size,
           ", ", with_commas(b0.kv_bytes_per_token), " B/token); lower --max-model-len or raise --kv-cache-memory");
    report_.max_model_len = options_.max_model_len;
  } else {
    report_.max_model_len =
        max_context_for_pool(spec, report_.kv_tokens, options_.block_size, options_.max_num_batched_tokens);
  }
  report_.sliding_window = cache_window;
  report_.kv_tokens_per_seq =
      kv_tokens_per_sequence(spec, report_.max_model_len, options_.block_size, options_.max_num_batched_tokens);
  if (report_.n_kv_blocks > INT32_MAX) report_.n_kv_blocks = INT32_MAX;
  if (!options_.device.is_cpu() && spec.long_rope_from() > 0 && report_.max_model_len > spec.long_rope_from())
    fail(ErrorCode::kUnsupported, "LongRoPE's long factors (positions past original_max_position_embeddings ",
         spec.long_rope_from(), ", or a prompt longer than it) run on the CPU backend only; on ",
         options_.device.to_string(), " pass --max-model-len ", spec.long_rope_from(), " or less");

  EngineConfig ec;
  ec.scheduler.n_blocks = static_cast<int32_t>(report_.n_kv_blocks);
  ec.scheduler.block_size = static_cast<int32_t>(options_.block_size);
  ec.scheduler.max_num_seqs = static_cast<int32_t>(options_.max_num_seqs);
  ec.scheduler.max_num_batched_tokens = static_cast<int32_t>(options_.max_num_batched_tokens);
  ec.scheduler.max_model_len = static_cast<int32_t>(report_.max_model_len);
  ec.scheduler.long_context_after = static_cast<int32_t>(spec.long_rope_from());
  ec.scheduler.sliding_window = static_cast<int32_t>(std::min<int64_t>(cache_window, INT32_MAX));
  // Hybrid models (Gemma 3): the local layers' own pool, as plan sized it.
  report_.local_window = local_pool_window(spec);
  report_.n_local_kv_blocks = std::min<int64_t>(b0.n_local_kv_blocks, INT32_MAX);
  ec.scheduler.local_sliding_window = static_cast<int32_t>(std::min<int64_t>(report_.local_window, INT32_MAX));
  ec.scheduler.n_local_blocks = static_cast<int32_t>(report_.n_local_kv_blocks);
  ec.scheduler.enable_prefix_caching = options_.enable_prefix_caching;
  for (int64_t id : load_eos_token_ids(dir, spec)) ec.eos_token_ids.push_back(static_cast<int32_t>(id));
  ec.max_live_requests = static_cast<int32_t>(options_.max_waiting_requests);
  ec.max_executor_restarts = options_.max_executor_restarts;
  ec.speculative = options_.speculative;
  ec.arrivals = arrivals_;
  ec.burst_window_ms = options_.burst_window_ms;
  // The ranks' OpenMP teams own this process's cores: sampling beside them
  // in a team of its own would throttle their spin-waits (EngineConfig).
  if (options_.device.is_cpu()) ec.host_threads = 1;
  // With PP = 1 and one replica the ranks' cores are idle while the engine
  // samples: its rows go to plain threads on them (engine/host_workers.h),
  // not to one core. (Pipelined stages and other replicas keep computing.)
  if (options_.device.is_cpu() && options_.layout.pp == 1 && options_.layout.dp <= 1)
    ec.host_workers = static_cast<int32_t>(std::min(3u, std::max(1u, std::thread::hardware_concurrency()) - 1));
  if (options_.speculative.disable_by_batch_size > 0) ec.speculative_max_decodes = options_.speculative.disable_by_batch_size;
  if (ec.speculative.enabled() && !options_.batch_invariant)
    fail(ErrorCode::kInvalidArgument, "speculative decoding needs the batch-invariant kernels (batch_invariant)");

  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  for (int d = 0; d < std::max(1, options_.layout.dp); ++d) {
    auto r = std::make_unique<Replica>();
    LocalGroupOptions lo;
    lo.layout = replica;
    lo.n_blocks = report_.n_kv_blocks;
    lo.n_local_blocks = report_.n_local_kv_blocks;
    lo.block_size = options_.block_size;
    lo.kv_dtype = kv_dtype;
    lo.n_threads_per_rank = std::max(1, static_cast<int>(hw) / n_ranks_total);
    lo.device = options_.device;
    lo.graphs.enabled = options_.cuda_graphs;
    lo.batch_invariant = options_.batch_invariant;
    lo.graphs.max_batch = std::min<int64_t>(options_.max_num_seqs, backend::kDefaultGraphMaxBatch);
    lo.graphs.max_context = report_.max_model_len;
    if (d == 0) {
      lo.fail_rank = options_.fail_rank;
      lo.fail_at_batch = options_.fail_at_batch;
    }
    std::vector<LocalGroupExecutor::RankMemory> allocated;
    if (options_.make_executor) {
      r->executor = options_.make_executor(spec, lo, &allocated);
      if (d == 0 && options_.cuda_graphs)
        report_.graphs = "CUDA graphs: off (under mpirun the ranks' steps run eagerly; graphs are wired into the "
                         "threads path at TP = PP = 1)";
    } else {
      auto local = std::make_unique<LocalGroupExecutor>(spec, weights, lo);
      allocated = local->rank_memory();
      if (d == 0) report_.graphs = local->graph_status();
      r->executor = std::move(local);
    }
    EngineConfig rec = ec;
    if (options_.speculative.uses_draft_model()) {
      // Each replica's engine thread runs its own draft, on a backend of its
      // own (the ranks' backends belong to their threads); its cache holds
      // as many tokens as the target's, and a block more (model/draft_model.h).
      backend::BackendOptions dbo;
      dbo.device = options_.device;
      dbo.n_threads = lo.n_threads_per_rank;
      dbo.batch_invariant = options_.batch_invariant;  // so the target as its own draft proposes what it verifies
      const int64_t n_draft_blocks = b0.n_draft_kv_blocks;  // draft_kv_blocks(the replica's pool), as planned
      auto draft = std::make_shared<DraftModel>(
          options_.speculative.draft_model, spec.vocab_size, backend::make_backend(dbo), report_.max_model_len,
          options_.block_size, kv_dtype_of(options_.kv_cache_dtype, draft_spec.dtype), n_draft_blocks,
          options_.max_num_batched_tokens, options_.max_num_seqs);  // bounded steps: plan's draft workspace
      if (d == 0) {
        report_.draft_dir = options_.speculative.draft_model;
        report_.draft_weight_bytes = draft->weight_bytes();
        report_.draft_kv_bytes = draft->kv_bytes();
        report_.draft_workspace_bytes = draft->workspace_bytes();
        report_.draft_kv_tokens = n_draft_blocks * options_.block_size;
      }
      rec.draft_model = std::move(draft);
    }
    r->engine = std::make_unique<Engine>(rec, *r->executor, detokenizer_.get());
    r->engine->start();
    if (d == 0) report_.allocated = allocated;
    report_.allocated_by_replica.push_back(allocated);
    replicas_.push_back(std::move(r));
  }
  routing_ = std::make_unique<RoutingPolicy>(replicas_.size());
  // Structured outputs: the model's ids as bytes (special tokens and ids
  // the tokenizer lacks are never produced under a grammar; EOS ends one).
  const int64_t model_vocab = replicas_.at(0)->engine->vocab_size();
  std::vector<std::string> token_bytes(static_cast<size_t>(model_vocab));
  for (int32_t id = 0; id < std::min<int64_t>(model_vocab, tokenizer_->vocab_size()); ++id)
    if (!tokenizer_->is_special(id)) token_bytes[size_t(id)] = std::string(tokenizer_->token_bytes(id));
  std::vector<int32_t> stops;
  for (int32_t id : ec.eos_token_ids)
    if (id >= 0 && id < model_vocab) stops.push_back(id);
  grammar_compiler_ = std::make_unique<grammar::GrammarCompiler>(
      std::make_shared<grammar::TokenVocabulary>(std::move(token_bytes), std::move(stops)), options_.grammar);
  ready_ = true;
}

std::shared_ptr<const grammar::CompiledGrammar> EngineBackend::compile_grammar(const grammar::GrammarSpec& spec) const {
  if (!ready_) throw ApiException({503, "the model is still loading", "service_unavailable", "", "model_loading"});
  return compile_grammar_or_400(*grammar_compiler_, spec, options_.grammar_compile_timeout_s);
}

std::vector<int32_t> EngineBackend::tokenize(const std::string& text, bool add_special_tokens) const {
  try {
    return tokenizer_->encode(text, add_special_tokens);
  } catch (const Error& e) {
    throw ApiException({400, e.what(), "invalid_request_error", "prompt", ""});
  }
}

std::string EngineBackend::detokenize(const std::vector<int32_t>& ids) const { return tokenizer_->decode(ids); }

std::vector<std::string> EngineBackend::token_strings(const std::vector<int32_t>& ids) const {
  std::vector<std::string> out;
  out.reserve(ids.size());
  for (int32_t id : ids) {
    const auto token = tokenizer_->id_to_token(id);
    if (!token)
      throw ApiException({400, "token id " + std::to_string(id) + " is not in the tokenizer's vocabulary",
                          "invalid_request_error", "tokens", ""});
    out.emplace_back(*token);
  }
  return out;
}

std::string EngineBackend::render_chat(const ordered_json& messages, const ordered_json& tools, bool add_generation_prompt,
                                       const ordered_json& template_kwargs) const {
  if (!chat_template_)
    throw ApiException({400, "this model has no chat template (tokenizer_config.json); use /v1/completions",
                        "invalid_request_error", "messages", ""});
  chat_template::ChatInputs inputs;
  inputs.messages = messages;
  inputs.tools = tools.is_array() && !tools.empty() ? tools : ordered_json();
  inputs.add_generation_prompt = add_generation_prompt;
  inputs.extra = template_kwargs;
  return render_chat_or_400(*chat_template_, inputs);
}

std::string render_chat_or_400(const chat_template::ModelChatTemplate& tmpl, const chat_template::ChatInputs& inputs) {
  // The render stops when the client hangs up (polled every few ms of work)
  // and at the template's budgets (steps, list items, string bytes, depth).
  // A budget hit is a 400, not a 500: a real template only reaches one with
  // messages too large for it, and a 5xx is retried by clients (the openai
  // SDKs retry twice), which would repeat the expensive render.
  chat_template::RenderOptions options;
  options.cancelled = [] { return ConnectionServer::current_client_gone(); };
  try {
    return tmpl.render(inputs, options);
  } catch (const Error& e) {
    throw ApiException({400, std::string("the chat template failed on these messages: ") + e.what(),
                        "invalid_request_error", "messages", ""});
  }
}

std::unique_ptr<RequestStream> EngineBackend::submit(const GenerateParams& p) {
  if (!ready_) throw ApiException({503, "the model is still loading", "service_unavailable", "", "model_loading"});
  EngineRequest req;
  req.request_id = p.request_id;
  req.prompt_token_ids = p.prompt_ids;
  req.n = p.n;
  req.sampling.temperature = p.temperature;
  req.sampling.top_p = p.top_p;
  req.sampling.top_k = static_cast<int32_t>(std::min<int64_t>(p.top_k, INT32_MAX));
  req.sampling.min_p = p.min_p;
  req.sampling.presence_penalty = p.presence_penalty;
  req.sampling.frequency_penalty = p.frequency_penalty;
  req.sampling.repetition_penalty = p.repetition_penalty;
  if (p.seed) req.sampling.seed = static_cast<uint64_t>(*p.seed);
  req.sampling.logit_bias = p.logit_bias;
  req.logprobs = p.logprobs >= 0;
  req.sampling.logprobs = std::max(0, p.logprobs);
  req.prompt_logprobs = p.prompt_logprobs;
  req.stop.max_tokens = static_cast<int32_t>(std::min<int64_t>(p.max_tokens, INT32_MAX));
  req.stop.min_tokens = static_cast<int32_t>(std::min<int64_t>(p.min_tokens, INT32_MAX));
  req.stop.ignore_eos = p.ignore_eos;
  req.stop.stop = p.stop;
  req.stop.stop_token_ids = p.stop_token_ids;
  req.skip_special_tokens = p.skip_special_tokens;
  req.grammar = p.grammar;
  req.cache_salt = p.cache_salt;

  // Prefix affinity keys on the prompt's leading token ids (as bytes).
  std::string key(reinterpret_cast<const char*>(p.prompt_ids.data()),
                  std::min<size_t>(p.prompt_ids.size(), 256) * sizeof(int32_t));
  const int64_t cost = static_cast<int64_t>(p.prompt_ids.size()) + p.max_tokens * p.n;
  // A replica whose executor is down (or restarting) gets nothing new.
  std::vector<int> down;
  std::string why_down;
  for (size_t d = 0; d < replicas_.size(); ++d) {
    EngineHealth h = replicas_[d]->engine->health();
    if (!h.ok) {
      down.push_back(static_cast<int>(d));
      if (why_down.empty()) why_down = replica_error(d, h);
    }
  }
  const int replica = routing_->acquire(key, cost, down);
  if (replica < 0)
    throw ApiException({503, "no replica can serve: " + why_down, "service_unavailable", "", "executor_down"});
  Engine& engine = *replicas_.at(replica)->engine;

  auto state = std::make_shared<StreamState>();
  state->prompt_tokens = static_cast<int64_t>(p.prompt_ids.size());
  state->completion_by_seq.assign(p.n, 0);
  RoutingPolicy* routing = routing_.get();
  state->on_finish = [routing, replica, cost] { routing->release(replica, cost); };
  const Tokenizer* tok = &*tokenizer_;
  RequestCallbacks callbacks;
  std::vector<int32_t> prompt_ids;  // for the prompt logprobs' first token, which has none
  if (p.prompt_logprobs >= 0) prompt_ids = p.prompt_ids;
  // The engine thread calls it, one output at a time: `prompt_sent` needs no lock.
  callbacks.on_output = [state, tok, prompt_ids = std::move(prompt_ids), prompt_sent = false](const SequenceOutput& o) mutable {
    GenerateEvent e;
    // The engine sends the prompt logprobs with sequence 0's first token.
    if (!prompt_ids.empty() && !prompt_sent && o.index == 0 && !o.new_token_ids.empty()) {
      prompt_sent = true;
      auto decode = [tok](int32_t id) { return tok->decode(std::vector<int32_t>{id}); };
      e.prompt_logprobs.reserve(prompt_ids.size());
      PromptTokenLogprob first;
      first.token_id = prompt_ids.at(0);
      first.token = decode(first.token_id);
      e.prompt_logprobs.push_back(std::move(first));
      for (const TokenLogprobs& lp : o.prompt_logprobs) {
        PromptTokenLogprob x;
        x.token_id = lp.token_id;
        x.token = decode(lp.token_id);
        x.scored = true;
        x.logprob = lp.logprob;
        x.rank = lp.rank;
        for (const auto& t : lp.top) x.top.push_back({t.token, decode(t.token), t.logprob});
        e.prompt_logprobs.push_back(std::move(x));
      }
    }
    e.index = o.index;
    e.text = o.text_delta;
    e.token_ids = o.new_token_ids;
    for (const auto& lp : o.logprobs) {
      e.logprobs.push_back(lp.logprob);
      e.tokens.push_back(tok->decode(std::vector<int32_t>{lp.token_id}));
      std::vector<TopLogprob> top;
      for (const auto& t : lp.top) top.push_back({t.token, tok->decode(std::vector<int32_t>{t.token}), t.logprob});
      e.top_logprobs.push_back(std::move(top));
    }
    if (o.finished()) e.finish_reason = finish_reason_name(o.finish_reason);
    e.stop_string = o.stop_string;
    e.error = o.error;
    std::function<void()> release;
    {
      std::lock_guard<std::mutex> lock(state->mutex);
      if (o.index >= 0 && o.index < static_cast<int>(state->completion_by_seq.size()))
        state->completion_by_seq[o.index] = o.n_completion_tokens;
      if (o.index == 0) state->cached_tokens = o.n_cached_tokens;  // the n sequences share one prompt
      state->events.push_back(std::move(e));
      if (o.request_finished) {
        state->finished = true;
        release = std::move(state->on_finish);
        state->on_finish = nullptr;
      }
    }
    state->cv.notify_all();
    if (release) release();
  };
  try {
    engine.submit(std::move(req), std::move(callbacks));
  } catch (const Error& e) {
    routing_->release(replica, cost);
    if (e.code() == ErrorCode::kOutOfMemory)
      throw ApiException({429, std::string("the server is at capacity: ") + e.what(), "rate_limit_error", "", "queue_full"});
    if (e.code() == ErrorCode::kUnsupported)
      throw ApiException({503, e.what(), "service_unavailable", "", ""});
    if (e.code() == ErrorCode::kDistributed)
      throw ApiException({503, e.what(), "service_unavailable", "", "executor_down"});
    throw ApiException({400, e.what(), "invalid_request_error", "", ""});
  }
  return std::make_unique<EngineStream>(state, engine, p.request_id);
}

std::string EngineBackend::health_error() const {
  // Unhealthy when no replica can take a request (with DP, the others carry
  // on while one restarts: requests are routed around it).
  std::string first;
  for (size_t d = 0; d < replicas_.size(); ++d) {
    EngineHealth h = replicas_[d]->engine->health();
    if (h.ok) return {};
    if (first.empty()) first = replica_error(d, h);
  }
  return first;
}

bool EngineBackend::fatal() const {
  // Down for good only when no replica can ever serve again.
  if (replicas_.empty()) return false;
  for (const auto& r : replicas_)
    if (!r->engine->health().fatal) return false;
  return true;
}

Deployment EngineBackend::deployment() const {
  Deployment d;
  if (!ready_) return d;
  const ModelSpec& spec = report_.spec;
  Layout replica = options_.layout;
  replica.dp = 1;
  if (replica.pp_layer_partition.empty()) replica.pp_layer_partition = pipeline_partition(spec, replica);
  d.available = true;
  d.model = options_.model_name;
  d.architecture = spec.architecture;
  d.dtype = dtype_safetensors_name(spec.dtype);
  d.tp = replica.tp;
  d.pp = replica.pp;
  d.dp = std::max(1, options_.layout.dp);
  d.ep = replica.ep();
  d.moe = spec.is_moe();
  d.n_layers = spec.n_layers;
  d.n_heads = spec.n_heads;
  d.n_kv_heads = spec.n_kv_heads;
  d.head_dim = spec.head_dim;
  d.n_experts = spec.n_experts;
  d.n_experts_per_token = spec.n_experts_per_token;
  d.max_model_len = report_.max_model_len;
  d.block_size = options_.block_size;
  d.kv_tokens_per_replica = report_.kv_tokens;
  d.measured_tolerance = report_.measured_tolerance;
  const auto range = [](const Range& r) { return IndexRange{r.begin, r.end}; };
  for (int dp = 0; dp < d.dp; ++dp) {
    const auto* allocated = dp < static_cast<int>(report_.allocated_by_replica.size())
                                ? &report_.allocated_by_replica[size_t(dp)] : nullptr;
    for (size_t r = 0; r < report_.budgets.size(); ++r) {
      const MemoryBudget& b = report_.budgets[r];
      const RankShard shard = shard_for(spec, replica, b.tp_rank, b.pp_rank);
      RankDeployment rd;
      rd.replica = dp;
      rd.rank = static_cast<int>(r);
      rd.tp_rank = b.tp_rank;
      rd.pp_rank = b.pp_rank;
      rd.device = options_.device.to_string();
      rd.memory_bytes = b.memory_bytes;
      rd.capacity_bytes = b.budget_bytes;
      rd.planned_weight_bytes = b.weight_bytes;
      rd.planned_kv_cache_bytes = b.kv_cache_bytes;
      rd.planned_workspace_bytes = b.workspace_bytes;
      rd.planned_reserve_bytes = b.reserve_bytes;
      // What the rank's allocator obtained (LocalGroupExecutor / MPI ranks
      // report it), never plan's formula again.
      if (allocated && r < allocated->size()) {
        rd.measured_weight_bytes = (*allocated)[r].weight_bytes;
        rd.measured_kv_cache_bytes = (*allocated)[r].kv_cache_bytes;
      }
      rd.n_kv_blocks = b.n_kv_blocks;
      rd.kv_bytes_per_token = b.kv_bytes_per_token;
      rd.q_heads = range(shard.q_heads);
      rd.kv_heads = range(shard.kv_heads);
      if (spec.is_moe()) rd.experts = range(shard.experts);
      rd.layers = range(shard.layers);
      d.ranks.push_back(std::move(rd));
    }
  }
  return d;
}

// Per rank: plan's bytes beside the allocator's (the watermark deployment
// guides say to watch per card), and the KV blocks in use and their peak.
std::string EngineBackend::rank_metrics() const {
  if (!ready_) return "";
  std::string label = options_.model_name;
  std::string escaped;
  for (char c : label) {
    if (c == '\\' || c == '"') escaped += '\\';
    if (c == '\n') { escaped += "\\n"; continue; }
    escaped += c;
  }
  std::ostringstream out;
  const auto labels = [&](size_t d, size_t r) {
    const MemoryBudget& b = report_.budgets[r];
    return str_cat("model_name=\"", escaped, "\",replica=\"", d, "\",rank=\"", r, "\",tp_rank=\"", b.tp_rank,
                   "\",pp_rank=\"", b.pp_rank, "\"");
  };
  out << "# HELP shardlm:rank_memory_bytes Bytes per rank by kind: planned by plan's memory budget, measured by the "
         "rank's allocator.\n# TYPE shardlm:rank_memory_bytes gauge\n";
  for (size_t d = 0; d < replicas_.size(); ++d) {
    const auto* allocated = d < report_.allocated_by_replica.size() ? &report_.allocated_by_replica[d] : nullptr;
    for (size_t r = 0; r < report_.budgets.size(); ++r) {
      const MemoryBudget& b = report_.budgets[r];
      const std::string l = labels(d, r);
      out << "shardlm:rank_memory_bytes{" << l << ",kind=\"weights\",source=\"planned\"} " << b.weight_bytes << "\n"
          << "shardlm:rank_memory_bytes{" << l << ",kind=\"kv_cache\",source=\"planned\"} " << b.kv_cache_bytes << "\n"
          << "shardlm:rank_memory_bytes{" << l << ",kind=\"workspace\",source=\"planned\"} " << b.workspace_bytes << "\n";
      if (allocated && r < allocated->size())
        out << "shardlm:rank_memory_bytes{" << l << ",kind=\"weights\",source=\"measured\"} " << (*allocated)[r].weight_bytes
            << "\n"
            << "shardlm:rank_memory_bytes{" << l << ",kind=\"kv_cache\",source=\"measured\"} "
            << (*allocated)[r].kv_cache_bytes << "\n";
    }
  }
  std::vector<MetricsSnapshot> snaps;
  for (const auto& rep : replicas_) snaps.push_back(rep->engine->metrics().snapshot());
  const auto per_rank = [&](const char* name, const char* help, auto value) {
    out << "# HELP " << name << " " << help << "\n# TYPE " << name << " gauge\n";
    for (size_t d = 0; d < replicas_.size(); ++d)
      for (size_t r = 0; r < report_.budgets.size(); ++r) out << name << "{" << labels(d, r) << "} " << value(d, r) << "\n";
  };
  per_rank("shardlm:kv_blocks", "KV blocks allocated on the rank.", [&](size_t, size_t r) { return report_.budgets[r].n_kv_blocks; });
  per_rank("shardlm:kv_blocks_in_use", "KV blocks in use on the rank (each rank holds its heads of the same tokens).",
           [&](size_t d, size_t) { return snaps[d].kv_blocks_in_use; });
  per_rank("shardlm:kv_blocks_in_use_peak", "The most KV blocks in use on the rank in any step since start.",
           [&](size_t d, size_t) { return snaps[d].kv_blocks_in_use_peak; });
  // The compiled-grammar cache (bounded by --grammar-cache-memory): its
  // tables grow while grammars are used, so this is the bytes they hold now.
  if (grammar_compiler_) {
    const std::string l = str_cat("{model_name=\"", escaped, "\"} ");
    out << "# HELP shardlm:grammar_cache_bytes Bytes held by the compiled grammars cached for reuse.\n"
           "# TYPE shardlm:grammar_cache_bytes gauge\nshardlm:grammar_cache_bytes" << l << grammar_compiler_->cached_bytes()
        << "\n# HELP shardlm:grammar_cache_entries Compiled grammars cached for reuse.\n"
           "# TYPE shardlm:grammar_cache_entries gauge\nshardlm:grammar_cache_entries" << l << grammar_compiler_->n_cached()
        << "\n";
  }
  return out.str();
}

std::string EngineBackend::metrics() const {
  if (replicas_.empty()) return "";
  if (replicas_.size() == 1) return replicas_[0]->engine->render_metrics(options_.model_name) + rank_metrics();
  // One block per replica, labelled; HELP/TYPE lines once.
  std::string out;
  for (size_t d = 0; d < replicas_.size(); ++d) {
    std::istringstream in(replicas_[d]->engine->render_metrics(options_.model_name));
    std::string line;
    const std::string label = "model_name=\"" + options_.model_name + "\"";
    while (std::getline(in, line)) {
      if (line.rfind("#", 0) == 0) {
        if (d == 0) out += line + "\n";
        continue;
      }
      size_t pos = line.find(label);
      if (pos != std::string::npos) line.insert(pos + label.size(), ",replica=\"" + std::to_string(d) + "\"");
      out += line + "\n";
    }
  }
  return out + rank_metrics();
}

}  // namespace shardlm::server
