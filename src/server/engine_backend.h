// ServingBackend over the real engine: tokenizer + chat template + one
// Engine per data-parallel replica, each over a LocalGroupExecutor (its
// TP × PP ranks as threads). Requests go to a replica by RoutingPolicy.
#pragma once

#include <atomic>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/local_group_executor.h"
#include "grammar/grammar_compiler.h"
#include "loader/model_spec.h"
#include "plan/memory_budget.h"
#include "plan/sharding.h"
#include "server/routing_policy.h"
#include "server/serving_backend.h"
#include "tokenizer/chat_template/model_template.h"
#include "tokenizer/tokenizer.h"

namespace shardlm::server {

struct EngineBackendOptions {
  std::filesystem::path model_dir;
  std::string model_name;            // for metrics labels
  Layout layout;                     // tp × pp per replica, dp replicas
  int64_t max_model_len = 0;         // 0: what the KV cache holds, capped by the model's context
  int64_t max_num_seqs = 256;
  int64_t max_num_batched_tokens = 2048;
  bool enable_prefix_caching = true;
  int64_t block_size = 16;
  KvCacheDType kv_cache_dtype = KvCacheDType::kAuto;
  // KV cache sizing, per rank: either explicit bytes, or a fraction of this
  // machine's memory minus the weights (as plan computes for a device).
  int64_t kv_cache_memory_bytes = 0;     // > 0: exactly this much KV cache per rank
  double memory_utilization = 0.0;       // > 0: fraction of system RAM (like --gpu-memory-utilization);
                                         // on a GPU: of the device's total memory (vLLM's meaning, default 0.9)
  Device device;                         // cpu, or this process's GPU
  bool ranks_share_device = true;        // GPU: every rank of every replica is a thread on `device`
                                         // (false under mpirun: one process per GPU)
  // Decode steps through CUDA graphs (--cuda-graphs; backend::parse_cuda_graphs_flag):
  // buckets up to min(max_num_seqs, kDefaultGraphMaxBatch), contexts up to max model len.
  bool cuda_graphs = false;
  // --batch-invariant: every rank's backend on its batch-invariant kernels
  // (LocalGroupOptions::batch_invariant), so a request's tokens and logprobs
  // do not depend on what else runs or how its prefill is chunked.
  bool batch_invariant = false;
  // --speculative-config (engine/speculation.h): needs batch_invariant.
  SpeculativeOptions speculative;
  // Per-request budgets (issue 21; serve's flags): a grammar's automaton
  // tables (--grammar-table-memory), the compiled-grammar cache
  // (--grammar-cache-memory), a compile's wall time (--grammar-compile-timeout),
  // and what one chat template render may cost (--chat-template-max-*).
  grammar::GrammarCompilerOptions grammar;
  double grammar_compile_timeout_s = 10.0;
  chat_template::Limits chat_template_limits;
  int64_t max_waiting_requests = 1024;   // more live requests than this: 429
  int32_t max_executor_restarts = 3;     // per replica; then fatal() (serve exits non-zero)
  // --burst-window-ms (EngineConfig::burst_window_ms): an idle engine holds
  // a burst's first submissions this long at most while the rest arrive.
  double burst_window_ms = 20.0;
  // Test hook (--debug-fail-rank-at-batch): rank fail_rank of replica 0
  // throws at its batch fail_at_batch, once.
  int fail_rank = -1;
  int64_t fail_at_batch = -1;
  // Builds a replica's executor; unset: a LocalGroupExecutor (ranks as
  // threads). serve under mpirun sets an MpiGroupExecutor (ranks as
  // processes). Fills *allocated with what each rank of the replica holds.
  std::function<std::unique_ptr<ModelExecutor>(const ModelSpec& spec, const LocalGroupOptions& options,
                                               std::vector<LocalGroupExecutor::RankMemory>* allocated)>
      make_executor;
};

// What was decided and allocated at load: printed at startup, exposed for tests.
struct LoadReport {
  ModelSpec spec;
  std::vector<MemoryBudget> budgets;   // plan's prediction per rank of one replica
  std::vector<LocalGroupExecutor::RankMemory> allocated;  // what replica 0's ranks hold
  std::vector<std::vector<LocalGroupExecutor::RankMemory>> allocated_by_replica;  // [dp][rank]: every replica's
  int64_t n_kv_blocks = 0;
  int64_t kv_tokens = 0;               // per replica
  int64_t max_model_len = 0;
  int64_t sliding_window = 0;          // plan's cache_sliding_window: blocks that leave it are released
  int64_t local_window = 0;            // plan's local_pool_window: the local layers' own pool (Gemma 3)
  int64_t n_local_kv_blocks = 0;       // its blocks per rank (MemoryBudget::n_local_kv_blocks)
  int64_t kv_tokens_per_seq = 0;       // plan's kv_tokens_per_sequence at max_model_len
  double measured_tolerance = 0.0;     // allowed |measured − plan| / plan: 0 on the CPU, 1% on a GPU
  std::string graphs;                  // replica 0's "CUDA graphs: ..." line ("" when not asked for)
  // --speculative-config "model": the draft beside each replica's driver,
  // measured as loaded (0 without one).
  std::string draft_dir;
  int64_t draft_weight_bytes = 0;      // per replica
  int64_t draft_kv_bytes = 0;          // per replica
  int64_t draft_workspace_bytes = 0;   // per replica: its step buffers, reserved at load (measured)
  int64_t draft_kv_tokens = 0;         // tokens its KV cache holds: the target's, and a block
  std::string text() const;            // the startup log
};

class EngineBackend final : public ServingBackend {
 public:
  explicit EngineBackend(EngineBackendOptions options);
  ~EngineBackend() override;

  // Loads tokenizer, template and model replicas, starts the engines. Until
  // it returns, ready() is false and the server answers 503. Throws Error.
  void load();
  const LoadReport& report() const { return report_; }
  // Stops the engines: drain finishes in-flight requests, else aborts them.
  void shutdown(bool drain);

  bool ready() const override { return ready_; }
  std::string health_error() const override;
  bool fatal() const override;
  int64_t max_model_len() const override { return report_.max_model_len; }
  std::vector<int32_t> tokenize(const std::string& text, bool add_special_tokens) const override;
  std::string detokenize(const std::vector<int32_t>& ids) const override;
  std::vector<std::string> token_strings(const std::vector<int32_t>& ids) const override;
  std::string render_chat(const ordered_json& messages, const ordered_json& tools, bool add_generation_prompt,
                          const ordered_json& template_kwargs) const override;
  std::unique_ptr<RequestStream> submit(const GenerateParams& params) override;
  std::string metrics() const override;
  std::string chat_template_source() const override { return chat_template_ ? chat_template_->source : ""; }
  int64_t vocab_size() const override { return report_.spec.vocab_size; }
  SamplingDefaults sampling_defaults() const override { return sampling_defaults_; }
  Deployment deployment() const override;
  std::shared_ptr<const grammar::CompiledGrammar> compile_grammar(const grammar::GrammarSpec& spec) const override;
  std::shared_ptr<Arrivals> arrivals() const override { return arrivals_; }

 private:
  struct Replica;
  std::string rank_metrics() const;  // shardlm:rank_memory_bytes, shardlm:kv_blocks* per rank, the grammar cache
  EngineBackendOptions options_;
  // Shared by every replica's engine: a burst is one, wherever it is routed.
  std::shared_ptr<Arrivals> arrivals_ = std::make_shared<Arrivals>();
  LoadReport report_;
  std::optional<Tokenizer> tokenizer_;
  std::optional<chat_template::ModelChatTemplate> chat_template_;
  std::unique_ptr<Detokenizer> detokenizer_;
  std::vector<std::unique_ptr<Replica>> replicas_;
  std::unique_ptr<RoutingPolicy> routing_;
  SamplingDefaults sampling_defaults_;
  std::unique_ptr<grammar::GrammarCompiler> grammar_compiler_;  // built at load, for the model's vocabulary
  std::atomic<bool> ready_{false};
};

// Renders a model's chat template for a request, on the HTTP thread that
// serves it: the render stops when that client hangs up, and template errors
// and budget hits (chat_template::Limits) become ApiException(400) naming
// 'messages' and the limit.
std::string render_chat_or_400(const chat_template::ModelChatTemplate& tmpl, const chat_template::ChatInputs& inputs);

}  // namespace shardlm::server
