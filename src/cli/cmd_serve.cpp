// shardlm serve MODEL: the OpenAI-compatible server. Flags follow vLLM's
// names so commands carry over.
#include <pthread.h>
#include <signal.h>

#include <cstdlib>
#include <iostream>
#include <thread>

#include "backend/device/device_choice.h"
#include "backend/device/decode_graphs.h"
#include "plan/memory_budget.h"
#include "plan/tensor_split.h"
#include "cli/auto_layout_flag.h"
#include "cli/device_flag.h"
#include "cli/command.h"
#include "cli/default_model.h"
#include "cli/serve_mpi.h"
#include "cli/speculative_config_flag.h"
#include "core/error.h"
#include "core/units.h"
#include "server/engine_backend.h"
#include "server/http_server.h"
#include "server/listener.h"

namespace shardlm::cli {
namespace {

// --api-key '' (an unset variable in a unit file) would turn authentication
// off without a word: refuse it as a usage error.
CLI::Validator non_empty_api_key() {
  return CLI::Validator(
      [](std::string& key) {
        return key.empty() ? std::string("an empty key would turn authentication off (an unset variable?); "
                                         "give a key, or leave out --api-key to serve without one")
                           : std::string();
      },
      "KEY", "non-empty");
}

struct ServeOptions {
  std::string model;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::vector<std::string> served_model_names;
  std::string api_key;
  int64_t max_model_len = 0;
  int64_t max_num_seqs = 256;
  int64_t max_num_batched_tokens = 2048;
  std::string kv_cache_memory;
  double gpu_memory_utilization = 0.0;
  bool enable_prefix_caching = true;
  std::string tp = "1";  // a degree, or auto
  int pp = 1;
  bool enable_expert_parallel = false;
  int dp = 1;
  std::vector<int64_t> pp_layer_partition;
  std::string tensor_split;  // --tensor-split W0,W1,...
  int64_t block_size = 16;
  std::string kv_cache_dtype = "auto";
  std::string device = "cpu";
  std::string cuda_graphs;  // --cuda-graphs on|off ("" = the device's default)
  std::string quant_activations;  // --quant-activations int8|f32 ("" = the environment's, else int8)
  std::string dense_activations;  // --dense-activations f32|bf16 ("" = the environment's, else f32)
  int64_t max_pending_requests = 1024;
  int64_t max_waiting_requests = -1;  // >= 0: live bound = max_num_seqs + this
  int max_executor_restarts = 3;
  double burst_window_ms = 20.0;
  std::string debug_fail = "";  // RANK:BATCH (test hook)
  int http_threads = 0;         // 0: sized from max-num-seqs and max-pending-requests
  size_t max_body_bytes = 8u << 20;
  server::RequestLimits limits;  // --max-logprobs, --max-n, --max-stop-strings, ...
  std::string grammar_table_memory = "64MiB";
  std::string grammar_cache_memory = "256MiB";
  double grammar_compile_timeout_s = 10.0;
  chat_template::Limits chat_template_limits;  // --chat-template-max-*
  int request_start_timeout_s = 60;
  size_t max_header_bytes = 64 * 1024;
  std::string tool_call_parser;   // "": from the chat template
  std::string reasoning_parser;
  std::string generation_config = "auto";
  std::vector<std::string> allowed_origins;
  double shutdown_grace_s = 5.0;
  bool no_web_ui = false;
  bool batch_invariant = false;
  std::string speculative_config;  // --speculative-config JSON (cli/speculative_config_flag.h)
  size_t responses_store_max_count = 1000;   // /v1/responses kept for GET and previous_response_id
  size_t responses_store_max_bytes = 64u << 20;
};

// Each rank's own KV capacity (its memory less its weights: under
// --tensor-split the ranks differ) and the rank whose capacity binds the
// replica, which holds the minimum.
std::string kv_binding_text(const std::vector<MemoryBudget>& budgets) {
  if (budgets.size() < 2) return "";
  size_t bind = 0;
  std::string out = "KV capacity per rank (blocks):";
  for (size_t r = 0; r < budgets.size(); ++r) {
    out += (r ? ", " : " ") + with_commas(budgets[r].n_kv_blocks_capacity);
    if (budgets[r].n_kv_blocks_capacity < budgets[bind].n_kv_blocks_capacity) bind = r;
  }
  return out + "; the replica holds the minimum: rank " + std::to_string(bind) + " (tp " +
         std::to_string(budgets[bind].tp_rank) + ", pp " + std::to_string(budgets[bind].pp_rank) + ") binds\n";
}

int run_serve(const ServeOptions& given) {
  apply_quant_activations(given.quant_activations);
  apply_dense_activations(given.dense_activations, given.device);
  ServeOptions o = given;
  const bool default_model = o.model.empty();
  o.model = resolve_model_dir(o.model, "serve");
  if (default_model && o.served_model_names.empty()) o.served_model_names.push_back(kDefaultModelName);
  const int tp = parse_tp_flag(o.tp);
  check_auto_alone(tp == kAutoDegree, o.pp, o.dp, !o.pp_layer_partition.empty() || !o.tensor_split.empty());
  Layout requested{tp, o.pp, o.dp, o.pp_layer_partition, o.enable_expert_parallel};
  if (!o.tensor_split.empty()) requested.tensor_split = parse_tensor_split(o.tensor_split);
  if (!std::filesystem::is_directory(o.model))
    fail(ErrorCode::kNotFound, "MODEL '", o.model, "' is not a directory; give a Hugging Face model directory (config.json, ",
         "*.safetensors, tokenizer.json); `shardlm make-model` writes a synthetic one");
  // -tp auto: plan's throughput objective over the ranks this run has.
  auto choose_layout = [&]() {
    const ModelSpec spec = load_model_config(std::filesystem::path(o.model) / "config.json");
    PlanOptions po;
    po.objective = Objective::kThroughput;
    po.max_model_len = o.max_model_len;
    if (o.gpu_memory_utilization > 0.0) po.budget.gpu_memory_utilization = o.gpu_memory_utilization;
    po.budget.max_num_seqs = o.max_num_seqs;
    po.budget.max_num_batched_tokens = o.max_num_batched_tokens;
    po.budget.block_size = o.block_size;
    if (!parse_kv_cache_dtype(o.kv_cache_dtype, &po.budget.kv_cache_dtype))
      fail(ErrorCode::kInvalidArgument, "--kv-cache-dtype '", o.kv_cache_dtype, "': use auto, bf16, f16, f32 or fp8");
    po.expert_parallel = o.enable_expert_parallel;
    // Speculation's bytes as serve will allocate them (a draft on each replica's rank 0).
    const SpeculativeOptions so = parse_speculative_config(o.speculative_config);
    if (so.enabled()) {
      ModelSpec draft;
      if (so.uses_draft_model()) draft = load_model_config(std::filesystem::path(so.draft_model) / "config.json");
      add_speculation(po.budget, so.num_speculative_tokens, so.uses_draft_model() ? &draft : nullptr);
    }
    const AutoLayoutChoice c = plan_auto_layout(spec, run_ranks(), po, /*max_dp=*/1024);
    std::cerr << "shardlm serve: " << c.reason << std::endl;
    return c.layout;
  };
  backend::parse_device_flag(o.device);  // a bad --device fails before anything starts
  // Under mpirun the ranks are processes: only each replica's driver serves.
  if (o.enable_expert_parallel) {
    const ModelSpec spec = load_model_config(std::filesystem::path(o.model) / "config.json");
    if (!spec.is_moe())
      fail(ErrorCode::kInvalidArgument, "--enable-expert-parallel: ", spec.architecture,
           " is a dense model without experts; drop the flag (it applies to mixture-of-experts models)");
  }
  if (tp != kAutoDegree)  // a bad --tensor-split / --pp-layer-partition fails before anything starts
    validate_layout(load_model_config(std::filesystem::path(o.model) / "config.json"), requested);
  ServeMpi mpi(o.model, requested, o.host, o.port, choose_layout);
  try {
  // Under mpirun each process drives one GPU (local rank % GPUs); without
  // it, every rank of every replica is a thread sharing one GPU.
  const Device device = mpi.active() ? device_for_mpi_process(o.device)
                                     : device_for_thread_ranks(o.device, mpi.layout().tp * mpi.layout().pp *
                                                                             std::max(1, mpi.layout().dp));
  mpi.set_device(device);
  // Every process checks --cuda-graphs, so that a refusal stops them all.
  const bool cuda_graphs = backend::parse_cuda_graphs_flag(o.cuda_graphs, !device.is_cpu());
  if (cuda_graphs && mpi.active() && o.cuda_graphs == "on")
    fail(ErrorCode::kUnsupported, "--cuda-graphs on: under mpirun the ranks' steps run eagerly (graphs are wired "
         "into the threads path at TP = PP = 1); drop the flag");
  if (!mpi.is_driver()) return mpi.run_worker();
  server::EngineBackendOptions bo;
  bo.model_dir = o.model;
  std::vector<std::string> names = o.served_model_names;
  if (names.empty()) names.push_back(o.model);
  bo.model_name = names[0];
  bo.layout = mpi.layout();
  bo.device = device;
  bo.ranks_share_device = !mpi.active();
  bo.cuda_graphs = cuda_graphs;
  bo.batch_invariant = o.batch_invariant;
  bo.speculative = parse_speculative_config(o.speculative_config);
  if (bo.speculative.enabled()) {
    // Verification rows must equal 1-row decode steps bit for bit.
    if (!device.is_cpu())
      fail(ErrorCode::kUnsupported, "--speculative-config: verification needs the batch-invariant kernels, which the ",
           device.to_string(), " backend lacks; run without it, or on --device cpu");
    bo.batch_invariant = true;
  }
  bo.max_model_len = o.max_model_len;
  bo.max_num_seqs = o.max_num_seqs;
  bo.max_num_batched_tokens = o.max_num_batched_tokens;
  bo.enable_prefix_caching = o.enable_prefix_caching;
  bo.block_size = o.block_size;
  if (!parse_kv_cache_dtype(o.kv_cache_dtype, &bo.kv_cache_dtype))
    fail(ErrorCode::kInvalidArgument, "--kv-cache-dtype '", o.kv_cache_dtype, "': use auto, bf16, f16, f32 or fp8");
  if (o.kv_cache_dtype == "fp8_e5m2")
    fail(ErrorCode::kUnsupported, "--kv-cache-dtype fp8_e5m2: shardlm's FP8 KV cache is E4M3; use fp8 (or fp8_e4m3)");
  if (!o.kv_cache_memory.empty()) bo.kv_cache_memory_bytes = parse_bytes(o.kv_cache_memory, "--kv-cache-memory");
  bo.memory_utilization = o.gpu_memory_utilization;
  bo.grammar.max_table_bytes = size_t(parse_bytes(o.grammar_table_memory, "--grammar-table-memory"));
  bo.grammar.max_cache_bytes = size_t(parse_bytes(o.grammar_cache_memory, "--grammar-cache-memory"));
  if (bo.grammar.max_table_bytes < (size_t(64) << 10))
    fail(ErrorCode::kInvalidArgument, "--grammar-table-memory ", o.grammar_table_memory,
         ": give at least 64KiB");
  bo.grammar_compile_timeout_s = o.grammar_compile_timeout_s;
  bo.chat_template_limits = o.chat_template_limits;
  bo.max_waiting_requests = o.max_waiting_requests >= 0 ? o.max_num_seqs + o.max_waiting_requests : o.max_pending_requests;
  bo.max_executor_restarts = o.max_executor_restarts;
  bo.burst_window_ms = o.burst_window_ms;
  if (!o.debug_fail.empty()) {
    const size_t colon = o.debug_fail.find(':');
    char* end = nullptr;
    if (colon != std::string::npos) {
      bo.fail_rank = static_cast<int>(std::strtol(o.debug_fail.c_str(), &end, 10));
      if (end != o.debug_fail.c_str() + colon) bo.fail_rank = -1;
      bo.fail_at_batch = std::strtoll(o.debug_fail.c_str() + colon + 1, &end, 10);
      if (*end != '\0') bo.fail_rank = -1;
    }
    if (colon == std::string::npos || bo.fail_rank < 0 || bo.fail_at_batch < 0)
      fail(ErrorCode::kInvalidArgument, "--debug-fail-rank-at-batch '", o.debug_fail,
           "': expected RANK:BATCH with non-negative integers, e.g. 1:5");
  }
  mpi.attach(&bo);

  std::string api_key = o.api_key;
  if (api_key.empty()) {
    if (const char* env = std::getenv("SHARDLM_API_KEY")) {
      // Set but empty (an unset variable in a unit file): refusing beats serving without authentication.
      if (*env == '\0')
        fail(ErrorCode::kInvalidArgument, "$SHARDLM_API_KEY is set but empty, which would turn authentication off; "
                                          "set a key, or unset the variable to serve without one");
      api_key = env;
    }
  }

  server::EngineBackend backend(bo);
  server::ServerOptions so;
  so.host = o.host;
  so.port = mpi.port();
  so.served_model_names = names;
  so.api_key = api_key;
  so.max_body_bytes = o.max_body_bytes;
  so.limits = o.limits;
  so.request_start_timeout_s = o.request_start_timeout_s;
  so.max_header_bytes = o.max_header_bytes;
  // An HTTP thread serves one request at a time (connections between
  // requests wait on the gate's poller), so every request the engine may
  // hold (running + waiting) needs one, plus a few for /health, /metrics and
  // the 429s beyond the bound.
  so.n_http_threads = o.http_threads > 0 ? o.http_threads
                                         : static_cast<int>(std::min<int64_t>(bo.max_waiting_requests, 1 << 16) + 16);
  so.version = SHARDLM_VERSION;
  so.api.tool_call_parser = o.tool_call_parser;
  so.api.reasoning_parser = o.reasoning_parser;
  so.api.generation_config = o.generation_config == "auto";
  so.allowed_origins = o.allowed_origins;
  so.web_ui = !o.no_web_ui;
  so.responses_store_max_count = o.responses_store_max_count;
  so.responses_store_max_bytes = o.responses_store_max_bytes;
  server::HttpServer http(backend, so);

  // SIGINT/SIGTERM are handled by this thread with sigwait; every other
  // thread (HTTP, engine, ranks) inherits the blocked mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  const long n_files = server::raise_open_file_limit();
  if (n_files > 0 && n_files < so.n_http_threads + 64)
    std::cerr << "shardlm serve: warning: the open-file limit is " << n_files << ", below the " << so.n_http_threads
              << " connections --threads-http allows; raise it (ulimit -n)" << std::endl;
  http.bind();  // fail before loading when the port is taken
  std::thread http_thread([&] { http.run(); });
  std::cerr << "shardlm serve: loading " << o.model << " (" << bo.layout.to_string() << "); answering 503 on http://"
            << o.host << ":" << http.port() << " until ready" << std::endl;
  try {
    backend.load();
  } catch (...) {
    http.stop(std::chrono::milliseconds(0));
    http_thread.join();
    throw;
  }
  std::cerr << backend.report().text() << "\n" << kv_binding_text(backend.report().budgets)
            << "shardlm serve: listening on http://" << o.host << ":" << http.port() << " as model '" << names[0]
            << "'" << (api_key.empty() ? "" : " (API key required)") << std::endl;

  // Wait for a signal; meanwhile, a backend that is down for good (a rank
  // failed and the executor cannot restart) ends the process non-zero.
  int sig = 0;
  for (;;) {
    timespec tick{0, 100 * 1000 * 1000};
    sig = sigtimedwait(&signals, nullptr, &tick);
    if (sig > 0) break;
    if (backend.fatal()) {
      const std::string why = backend.health_error();
      std::cerr << "shardlm serve: exiting: " << why << std::endl;
      http.stop(std::chrono::milliseconds(0));
      http_thread.join();
      backend.shutdown(/*drain=*/false);
      fail(ErrorCode::kDistributed, "the model executor failed and cannot recover: ", why);
    }
  }
  std::cerr << "shardlm serve: " << (sig == SIGINT ? "SIGINT" : "SIGTERM") << ": finishing in-flight requests for up to "
            << o.shutdown_grace_s << " s, then stopping" << std::endl;
  http.stop(std::chrono::milliseconds(static_cast<int64_t>(o.shutdown_grace_s * 1000)));
  http_thread.join();
  backend.shutdown(/*drain=*/false);
  std::cerr << "shardlm serve: stopped" << std::endl;
  return 0;
  } catch (const std::exception& e) {
    // Under mpirun, ~ServeMpi aborts the world (the workers wait in a
    // collective), which kills this process before main could print why.
    if (mpi.active()) std::cerr << "shardlm serve: rank " << mpi.world_rank() << ": " << e.what() << std::endl;
    throw;
  }
}

void setup(CLI::App& app) {
  auto* sub = app.add_subcommand("serve", "Serve a model with an OpenAI-compatible HTTP API");
  auto o = std::make_shared<ServeOptions>();
  sub->add_option("model", o->model, "Model directory (Hugging Face layout); default: the demo model, served as 'shardlm-demo'");
  sub->add_option("--host", o->host, "Address to bind (loopback unless you say otherwise)")->capture_default_str();
  sub->add_option("--port", o->port, "Port")->capture_default_str()->check(CLI::Range(0, 65535));
  sub->add_option("--served-model-name", o->served_model_names, "Name(s) clients use for the model (default: the path, or shardlm-demo for the demo model)");
  sub->add_option("--api-key", o->api_key, "Require 'Authorization: Bearer KEY' (also $SHARDLM_API_KEY)")
      ->check(non_empty_api_key());
  sub->add_option("--max-model-len", o->max_model_len, "Context length (default: what the KV cache holds, capped by the model)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  sub->add_option("--max-num-seqs", o->max_num_seqs, "Sequences per step")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  sub->add_option("--max-num-batched-tokens", o->max_num_batched_tokens, "Tokens per step (chunked prefill budget)")
      ->capture_default_str()->check(CLI::Range(1, 1 << 24));
  auto* kvm = sub->add_option("--kv-cache-memory", o->kv_cache_memory, "KV cache per rank, e.g. 4GiB (default: 4 GiB over all ranks)");
  auto* gmu = sub->add_option("--gpu-memory-utilization", o->gpu_memory_utilization,
                              "Fraction of memory for weights + activations + KV cache: of each GPU's total memory "
                              "(as in vLLM; default 0.9 there), of system RAM on the CPU")
                  ->check(CLI::Range(0.01, 1.0));
  kvm->excludes(gmu);
  sub->add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", o->enable_prefix_caching,
                "Reuse KV blocks across requests that share a prefix (default on)");
  sub->add_option("--tensor-parallel-size,--tp", o->tp,
                  "Tensor-parallel ranks, any degree up to the Q heads (also -tp); auto: the TP x PP x DP plan "
                  "recommends for the ranks mpirun started (one rank without mpirun)")
      ->capture_default_str();
  sub->add_option("--pipeline-parallel-size,--pp", o->pp, "Pipeline stages, any layer split (also -pp)")->capture_default_str()->check(CLI::Range(1, 4096));
  sub->add_option("--data-parallel-size,--dp", o->dp, "Replicas behind the built-in router (also -dp)")->capture_default_str()->check(CLI::Range(1, 1024));
  sub->add_flag("--enable-expert-parallel", o->enable_expert_parallel,
                "MoE: experts go whole to the TP ranks of each stage (EP = TP), as vLLM's flag; attention stays tensor-parallel");
  sub->add_option("--pp-layer-partition", o->pp_layer_partition, "Layers per stage, e.g. 10,9,9 (default: balanced by bytes)")
      ->delimiter(',');
  sub->add_option("--tensor-split", o->tensor_split, "Relative shares of the TP ranks (mixed devices): one weight per TP rank, or TP × PP stage-major, e.g. 3,1 (default: even)");
  sub->add_option("--block-size", o->block_size, "KV block size in tokens")->capture_default_str()->check(CLI::IsMember({8, 16, 32, 64, 128}));
  sub->add_option("--kv-cache-dtype", o->kv_cache_dtype, "auto (the weights' dtype), bf16, f16, f32, fp8 (E4M3)")->capture_default_str();
  add_device_option(sub, &o->device);
  add_cuda_graphs_option(sub, &o->cuda_graphs);
  add_quant_activations_option(sub, &o->quant_activations);
  add_dense_activations_option(sub, &o->dense_activations);
  auto* pending = sub->add_option("--max-pending-requests", o->max_pending_requests, "Live requests beyond this get 429")
                      ->capture_default_str()->check(CLI::Range(1, 1 << 24));
  sub->add_option("--max-waiting-requests", o->max_waiting_requests,
                  "Requests queued beyond the --max-num-seqs running ones; more get 429 (instead of --max-pending-requests)")
      ->check(CLI::Range(0, 1 << 24))
      ->excludes(pending);
  sub->add_option("--max-executor-restarts", o->max_executor_restarts,
                  "Times a failed rank group is restarted in process; then serve exits non-zero")
      ->capture_default_str()->check(CLI::Range(0, 1 << 20));
  sub->add_option("--burst-window-ms", o->burst_window_ms,
                  "An idle engine holds the first requests of a burst up to this long while the HTTP server is still "
                  "reading and parsing the rest, so that the burst is prefilled together; a lone request is not held "
                  "(0: off)")
      ->capture_default_str()->check(CLI::Range(0.0, 3600000.0));
  sub->add_option("--threads-http", o->http_threads,
                  "HTTP worker threads, one per open request (default: --max-pending-requests + 16)")
      ->check(CLI::Range(2, 1 << 16));
  sub->add_option("--debug-fail-rank-at-batch", o->debug_fail, "Test hook: RANK:BATCH makes that rank fail once")
      ->group("");
  sub->add_option("--max-request-body-bytes", o->max_body_bytes, "Larger bodies get 413")->capture_default_str();
  sub->add_option("--max-logprobs", o->limits.max_top_logprobs,
                  "Most logprobs / top_logprobs / prompt_logprobs a request may ask for (vLLM's flag); more get 400")
      ->capture_default_str()->check(CLI::Range(0, 1 << 16));
  sub->add_option("--max-n", o->limits.max_n, "Most choices (n) one request may ask for; more get 400")
      ->capture_default_str()->check(CLI::Range(1, 1 << 12));
  sub->add_option("--max-stop-strings", o->limits.max_stop_strings,
                  "Most stop strings (and stop_token_ids) one request may give; more get 400")
      ->capture_default_str()->check(CLI::Range(0, 1 << 12));
  sub->add_option("--max-stop-length", o->limits.max_stop_length, "Longest stop string, in bytes; longer get 400")
      ->capture_default_str()->check(CLI::Range(size_t{1}, size_t{1} << 16));
  sub->add_option("--max-prompts", o->limits.max_prompts,
                  "Most prompts in one /v1/completions list; more get 400")
      ->capture_default_str()->check(CLI::Range(1, 1 << 16));
  sub->add_option("--max-logit-bias", o->limits.max_logit_bias, "Most logit_bias entries one request may give; more get 400 "
                  "(at most 2048: any larger JSON object is refused while the body is parsed)")
      ->capture_default_str()->check(CLI::Range(0, 2048));
  sub->add_option("--grammar-table-memory", o->grammar_table_memory,
                  "Automaton tables one structured-output grammar may build (compiling and while it is used); "
                  "a grammar past it gets 400")
      ->capture_default_str();
  sub->add_option("--grammar-cache-memory", o->grammar_cache_memory,
                  "Compiled grammars kept for reuse, by the bytes they hold; the least recently used go first")
      ->capture_default_str();
  sub->add_option("--grammar-compile-timeout", o->grammar_compile_timeout_s,
                  "Seconds one grammar (json_schema, regex, choice, tools) may take to compile; longer gets 400")
      ->capture_default_str()->check(CLI::Range(0.001, 3600.0));
  sub->add_option("--chat-template-max-steps", o->chat_template_limits.max_steps,
                  "Evaluation steps one chat template render may take (about 0.5 s per 10 M); more gets 400")
      ->capture_default_str()->check(CLI::Range(size_t{1000}, size_t{1} << 40));
  sub->add_option("--chat-template-max-loop-iterations", o->chat_template_limits.max_loop_iterations,
                  "Loop iterations in one render; more gets 400")
      ->capture_default_str()->check(CLI::Range(size_t{100}, size_t{1} << 40));
  sub->add_option("--chat-template-max-list-items", o->chat_template_limits.max_list_items,
                  "Items of any one list a render builds; more gets 400")
      ->capture_default_str()->check(CLI::Range(size_t{100}, size_t{1} << 32));
  sub->add_option("--chat-template-max-bytes", o->chat_template_limits.max_output_bytes,
                  "Bytes of the rendered prompt, and of any one string a render builds; more gets 400")
      ->capture_default_str()->check(CLI::Range(size_t{4096}, size_t{1} << 32));
  sub->add_option("--max-header-bytes", o->max_header_bytes, "Request line and headers larger than this get 431")
      ->capture_default_str()->check(CLI::Range(size_t{1024}, size_t{1} << 24));
  sub->add_option("--responses-store-max-count", o->responses_store_max_count,
                  "Stored /v1/responses kept in memory (store: true, the default) for GET and previous_response_id; "
                  "past this the oldest are evicted; 0 stores none. Lost on restart")
      ->capture_default_str();
  sub->add_option("--responses-store-max-bytes", o->responses_store_max_bytes,
                  "Bytes of stored /v1/responses (their JSON text) kept in memory; past this the oldest are evicted")
      ->capture_default_str();
  sub->add_option("--request-start-timeout", o->request_start_timeout_s,
                  "Seconds a new connection may stay silent before it gets 408")
      ->capture_default_str()->check(CLI::Range(1, 86400));
  sub->add_option("--shutdown-grace-seconds", o->shutdown_grace_s, "On SIGINT/SIGTERM, time in-flight requests get to finish")
      ->capture_default_str()->check(CLI::Range(0.0, 3600.0));
  sub->add_option("--tool-call-parser", o->tool_call_parser,
                  "hermes (Qwen2.5/Qwen3 <tool_call>), llama3_json (Llama 3.1) or qwen3_coder (Qwen3-Coder <function=...>); default: from the chat template")
      ->check(CLI::IsMember({"hermes", "llama3_json", "qwen3_coder"}));
  sub->add_option("--reasoning-parser", o->reasoning_parser, "qwen3: <think>...</think> goes to reasoning_content")
      ->check(CLI::IsMember({"qwen3"}));
  sub->add_option("--generation-config", o->generation_config,
                  "auto: generation_config.json's sampling values are request defaults; vllm: OpenAI's defaults")
      ->capture_default_str()->check(CLI::IsMember({"auto", "vllm"}));
  sub->add_option("--allowed-origins", o->allowed_origins, "CORS origins allowed (\"*\" for any); default: none")
      ->delimiter(',');
  sub->add_option("--speculative-config", o->speculative_config, kSpeculativeConfigHelp);
  sub->add_flag("--batch-invariant", o->batch_invariant,
                "Batch-invariant kernels: a request's tokens and logprobs do not depend on the other requests of "
                "its step or on how its prefill is chunked (costs speed; refused by a backend without them)");
  sub->add_flag("--no-web-ui", o->no_web_ui, "Do not serve the web page (chat, deployment, live metrics) at /");
  set_command_action(sub, [o] { return run_serve(*o); });
}

}  // namespace
SHARDLM_REGISTER_COMMAND(setup);
}  // namespace shardlm::cli
