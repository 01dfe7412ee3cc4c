// `shardlm bench`: load-test any OpenAI-compatible server (shardlm, vLLM,
// SGLang, llama.cpp) and report vLLM-compatible serving metrics.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "tokenizer/tokenizer.h"
#include "core/error.h"
#include "loadgen/dataset.h"
#include "loadgen/progress.h"
#include "loadgen/report.h"
#include "loadgen/runner.h"
#include "loadgen/sweep.h"

namespace shardlm::cli {
namespace {

using namespace shardlm::loadgen;

struct BenchOptions {
  std::string base_url = "http://127.0.0.1:8000";
  std::string model;
  std::string endpoint = "chat";
  int64_t n_prompts = 200;
  std::string request_rate = "inf";
  int64_t max_concurrency = 0;
  std::string dataset = "random";
  int64_t input_len = 512;
  int64_t output_len = 128;
  double range_ratio = 0.1;
  int64_t prefix_len = 1024;
  int64_t n_prefixes = 4;
  uint64_t seed = 0;
  std::string percentiles = "50,90,99";
  std::string api_key;
  std::string tokenizer_dir;  // count output tokens with this tokenizer when a response has no usage
  std::string save_result;
  std::string sweep;
  std::string plot;
  bool token_ids = false;
  int64_t vocab_size = 30000;
  bool no_ignore_eos = false;
  std::string extra_body;
  double timeout_s = 600.0;
};

std::atomic<bool> g_stop{false};

extern "C" void on_sigint(int) {
  g_stop.store(true);
  // A second Ctrl-C kills at once.
  signal(SIGINT, SIG_DFL);
}

double parse_rate(const std::string& text) {
  if (text == "inf" || text == "Inf" || text == "INF") return std::numeric_limits<double>::infinity();
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || !(v > 0.0))
    throw CLI::ValidationError("--request-rate", "'" + text + "' must be a positive number of req/s or 'inf'");
  return v;
}

std::vector<SampleRequest> make_dataset(const BenchOptions& o, Endpoint endpoint) {
  if (o.token_ids && endpoint != Endpoint::kCompletions)
    throw CLI::ValidationError("--prompt-token-ids", "needs --endpoint completions (chat messages are text)");
  if (o.dataset == "random") {
    RandomDatasetOptions r;
    r.n_prompts = o.n_prompts;
    r.input_len = o.input_len;
    r.output_len = o.output_len;
    r.range_ratio = o.range_ratio;
    r.seed = o.seed;
    r.token_ids = o.token_ids;
    r.vocab_size = o.vocab_size;
    return make_random_dataset(r);
  }
  if (o.dataset == "shared-prefix") {
    SharedPrefixOptions s;
    s.n_prompts = o.n_prompts;
    s.n_prefixes = o.n_prefixes;
    s.prefix_len = o.prefix_len;
    s.suffix_len = o.input_len;
    s.output_len = o.output_len;
    s.seed = o.seed;
    s.token_ids = o.token_ids;
    s.vocab_size = o.vocab_size;
    return make_shared_prefix_dataset(s);
  }
  return load_jsonl_dataset(o.dataset, o.n_prompts, o.output_len);
}

int run_bench(const BenchOptions& o) {
  BenchConfig config;
  config.base_url = o.base_url;
  config.model = o.model;
  config.endpoint = o.endpoint == "completions" ? Endpoint::kCompletions : Endpoint::kChat;
  config.client.api_key = o.api_key;
  if (config.client.api_key.empty())
    if (const char* env = std::getenv("OPENAI_API_KEY")) config.client.api_key = env;
  config.client.read_timeout_s = o.timeout_s;
  config.request_rate = parse_rate(o.request_rate);
  config.max_concurrency = o.max_concurrency;
  config.seed = o.seed;
  config.percentiles = parse_double_list(o.percentiles, "--percentiles");
  bool synthetic = o.dataset == "random" || o.dataset == "shared-prefix";
  // As vLLM does for random prompts: generate the requested length, not an early EOS.
  config.ignore_eos = synthetic && !o.no_ignore_eos;
  if (!o.tokenizer_dir.empty()) {
    auto tokenizer = std::make_shared<Tokenizer>(Tokenizer::load(o.tokenizer_dir));
    config.count_output_tokens = [tokenizer](const std::string& text) {
      return static_cast<int64_t>(tokenizer->encode(text, /*add_special_tokens=*/false).size());
    };
  }
  if (!o.extra_body.empty()) {
    config.extra_body = nlohmann::json::parse(o.extra_body, nullptr, false);
    if (config.extra_body.is_discarded() || !config.extra_body.is_object())
      throw CLI::ValidationError("--extra-body", "must be a JSON object, e.g. '{\"temperature\": 0}'");
  }
  if (!o.plot.empty() && o.sweep.empty())
    throw CLI::ValidationError("--plot", "needs --sweep-concurrency (it plots the sweep)");
  std::vector<int64_t> sweep;
  if (!o.sweep.empty()) sweep = parse_int_list(o.sweep, "--sweep-concurrency");

  std::vector<SampleRequest> requests = make_dataset(o, config.endpoint);

  struct sigaction sa{};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);

  ProgressBar bar(stderr, isatty(fileno(stderr)) != 0);
  RunHooks hooks;
  hooks.stop = &g_stop;
  hooks.on_progress = [&bar](const ProgressSnapshot& s) { bar.update(s); };

  auto print_header = [&](int64_t conc) {
    std::printf("Traffic request rate: %s\n", o.request_rate == "inf" ? "inf" : o.request_rate.c_str());
    std::printf("Burstiness factor: 1.0 (Poisson process)\n");
    if (conc > 0)
      std::printf("Maximum request concurrency: %lld\n", static_cast<long long>(conc));
    else
      std::printf("Maximum request concurrency: None\n");
    std::fflush(stdout);
  };
  auto print_result = [&](const BenchmarkResult& r) {
    bar.finish();
    std::fputs(format_notes(r).c_str(), stdout);
    std::fputs(format_result_table(r).c_str(), stdout);
    std::fflush(stdout);
  };

  if (sweep.empty()) {
    std::string model = resolve_model(config);
    config.model = model;
    std::printf("Model: %s  Endpoint: %s%s  Prompts: %zu\n", model.c_str(), o.base_url.c_str(),
                endpoint_path(config.endpoint), requests.size());
    print_header(config.max_concurrency);
    BenchmarkResult r = run_benchmark(config, requests, hooks);
    print_result(r);
    if (!o.save_result.empty()) {
      save_result_json(r, o.save_result);
      std::printf("Saved results to %s\n", o.save_result.c_str());
    }
    if (r.interrupted) return 130;
    if (r.metrics.completed == 0 && !r.outputs.empty())
      fail(ErrorCode::kIo, "all ", r.outputs.size(), " requests failed; first error: ", r.outputs.front().error);
    return 0;
  }

  // Each point of a synthetic sweep draws its own prompts (seed + point), so
  // that a later point does not replay an earlier one's prompts and measure
  // the server's prefix cache; a dataset file is replayed as it is.
  auto point_requests = [&](size_t point) {
    if (point == 0 || !synthetic) return requests;
    BenchOptions p = o;
    p.seed = o.seed + point;
    return make_dataset(p, config.endpoint);
  };
  std::vector<SweepPoint> points = run_sweep(
      config, point_requests, sweep, hooks,
      [&](int64_t conc) {
        std::printf("\n### concurrency %lld\n", static_cast<long long>(conc));
        print_header(conc);
      },
      [&](const SweepPoint& p) { print_result(p.result); });
  std::printf("\n");
  std::fputs(format_sweep_table(points).c_str(), stdout);
  if (!o.save_result.empty()) {
    nlohmann::ordered_json all = nlohmann::ordered_json::array();
    for (const auto& p : points) all.push_back(result_to_json(p.result));
    std::FILE* f = std::fopen(o.save_result.c_str(), "wb");
    if (f == nullptr) fail(ErrorCode::kIo, "cannot write --save-result file ", o.save_result);
    std::string text = all.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
    std::printf("Saved %zu sweep results to %s\n", points.size(), o.save_result.c_str());
  }
  if (!o.plot.empty() && !points.empty()) {
    std::string title = "shardlm bench: " + points.front().result.model + ", concurrency sweep";
    write_sweep_plot(points, o.plot, title);
    std::printf("Wrote plot %s\n", o.plot.c_str());
  }
  return g_stop.load() ? 130 : 0;
}

void setup(CLI::App& app) {
  auto* sub = app.add_subcommand("bench", "Load-test an OpenAI-compatible server; vLLM-compatible serving metrics");
  auto o = std::make_shared<BenchOptions>();
  sub->add_option("--base-url", o->base_url, "Server URL (scheme://host:port)")->capture_default_str();
  sub->add_option("--model", o->model, "Model name (default: first of GET /v1/models)");
  sub->add_option("--endpoint", o->endpoint, "chat (/v1/chat/completions) or completions (/v1/completions)")
      ->check(CLI::IsMember({"chat", "completions"}))
      ->capture_default_str();
  sub->add_option("--num-prompts", o->n_prompts, "Requests to send")->check(CLI::PositiveNumber)->capture_default_str();
  sub->add_option("--request-rate", o->request_rate, "Poisson arrival rate in req/s, or inf (all at once)")
      ->capture_default_str();
  sub->add_option("--max-concurrency", o->max_concurrency, "Most requests in flight (default: unlimited)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--dataset", o->dataset, "random, shared-prefix, or a FILE.jsonl")->capture_default_str();
  sub->add_option("--input-len", o->input_len, "Prompt tokens (random) / suffix tokens (shared-prefix)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  sub->add_option("--output-len", o->output_len, "Max output tokens per request")
      ->check(CLI::PositiveNumber)->capture_default_str();
  sub->add_option("--range-ratio", o->range_ratio, "Random lengths vary uniformly within len*(1±ratio)")
      ->check(CLI::Range(0.0, 0.999))->capture_default_str();
  sub->add_option("--prefix-len", o->prefix_len, "Shared prefix tokens (shared-prefix)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  sub->add_option("--num-prefixes", o->n_prefixes, "Distinct prefixes (shared-prefix)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  sub->add_option("--seed", o->seed, "Seed for prompts and arrival times (a synthetic sweep's point i draws its prompts with seed + i)")->capture_default_str();
  sub->add_option("--percentiles", o->percentiles, "Percentiles to report, e.g. 50,90,99")->capture_default_str();
  sub->add_option("--api-key", o->api_key, "Bearer token (default: $OPENAI_API_KEY)");
  sub->add_option("--tokenizer", o->tokenizer_dir,
                  "Model directory whose tokenizer.json counts output tokens when a server sends no usage");
  sub->add_option("--save-result", o->save_result, "Write results JSON (vLLM's keys) to FILE");
  sub->add_option("--sweep-concurrency", o->sweep, "Run once per max concurrency, e.g. 1,2,4,8,16");
  sub->add_option("--plot", o->plot, "With --sweep-concurrency: PNG of throughput vs p99 TTFT/TPOT (gnuplot)");
  sub->add_flag("--prompt-token-ids", o->token_ids,
                "Send random token-id prompts (exact lengths; --endpoint completions only)");
  sub->add_option("--vocab-size", o->vocab_size, "Token ids are drawn below this (--prompt-token-ids)")
      ->capture_default_str();
  sub->add_flag("--no-ignore-eos", o->no_ignore_eos,
                "Do not send ignore_eos:true (sent by default for random/shared-prefix)");
  sub->add_option("--extra-body", o->extra_body, "JSON object merged into each request, e.g. '{\"temperature\":0}'");
  sub->add_option("--timeout", o->timeout_s, "Seconds of server silence before a request fails")
      ->check(CLI::PositiveNumber)->capture_default_str();
  set_command_action(sub, [o] { return run_bench(*o); });
}

}  // namespace

SHARDLM_REGISTER_COMMAND(setup);

}  // namespace shardlm::cli
