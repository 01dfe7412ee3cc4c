// speculative_bench MODEL_DIR [--max-tokens N] [--rounds R] [--batches 1,4,8,16]:
// what n-gram speculative decoding buys through the engine, by decode batch.
// For each batch B, B greedy requests with self-repeating prompts run
// together through one Engine over a LocalGroupExecutor (ranks as threads,
// batch-invariant kernels in both modes, as serve --speculative-config runs
// them), with speculation off and on (auto-off disabled); the best round of
// each cell is kept. Prints generated tokens/s, the acceptance rate and the
// speed-up (on / off): the data behind EngineConfig::speculative_max_decodes.
// It reports; it never fails on a timing.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/local_group_executor.h"
#include "loader/model_spec.h"
#include "model/weight_source.h"

using namespace shardlm;

namespace {

struct Cell {
  double tokens_per_second = 0.0;
  double acceptance = 0.0;  // accepted / drafted tokens
  double tokens_per_step = 0.0;
};

Cell run_batch(const ModelSpec& spec, std::shared_ptr<const WeightSource> weights, int64_t batch, int32_t max_tokens,
               bool speculate) {
  const int32_t n_blocks = 1024, block_size = 16;
  LocalGroupOptions gopt;
  gopt.n_blocks = n_blocks;
  gopt.block_size = block_size;
  gopt.kv_dtype = DType::kF32;
  gopt.n_threads_per_rank = std::max(1u, std::thread::hardware_concurrency());
  gopt.batch_invariant = true;
  LocalGroupExecutor executor(spec, weights, gopt);
  EngineConfig cfg;
  cfg.scheduler.n_blocks = n_blocks;
  cfg.scheduler.block_size = block_size;
  cfg.scheduler.max_model_len = 1024;
  cfg.scheduler.enable_prefix_caching = false;
  if (speculate) cfg.speculative = {4, 2, 4};
  cfg.speculative_max_decodes = 1 << 20;  // measure drafting at every batch
  Engine engine(cfg, executor);
  for (int64_t i = 0; i < batch; ++i) {
    EngineRequest r;
    r.request_id = std::to_string(i);
    for (int rep = 0; rep < 4; ++rep)
      for (int k = 0; k < 12; ++k) r.prompt_token_ids.push_back(int32_t((k * 53 + i * 97 + 5) % spec.vocab_size));
    r.sampling.temperature = 0.0;
    r.stop.max_tokens = max_tokens;
    r.stop.ignore_eos = true;
    engine.submit(r, {[](const SequenceOutput&) {}});
  }
  const auto t0 = std::chrono::steady_clock::now();
  int64_t n_steps = 0;
  while (engine.run_step()) ++n_steps;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const MetricsSnapshot m = engine.metrics().snapshot();
  Cell c;
  c.tokens_per_second = double(m.generation_tokens_total) / s;
  c.acceptance = m.spec_decode_num_draft_tokens_total > 0
                     ? double(m.spec_decode_num_accepted_tokens_total) / double(m.spec_decode_num_draft_tokens_total)
                     : 0.0;
  c.tokens_per_step = double(m.generation_tokens_total) / double(std::max<int64_t>(1, n_steps)) / double(batch);
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: speculative_bench MODEL_DIR [--max-tokens N] [--rounds R] [--batches 1,4,8,16]\n");
    return 2;
  }
  const std::string dir = argv[1];
  int32_t max_tokens = 48;
  int rounds = 2;
  std::vector<int64_t> batches = {1, 4, 8, 16};
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--max-tokens") max_tokens = std::stoi(argv[i + 1]);
    else if (a == "--rounds") rounds = std::max(1, std::stoi(argv[i + 1]));
    else if (a == "--batches") {
      batches.clear();
      std::stringstream in(argv[i + 1]);
      for (std::string b; std::getline(in, b, ',');) batches.push_back(std::stoll(b));
    } else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  try {
    const ModelSpec spec = load_model_config(std::filesystem::path(dir) / "config.json");
    auto weights = open_checkpoint(dir);
    // best[mode][batch]
    std::vector<std::vector<Cell>> best(2, std::vector<Cell>(batches.size()));
    for (int round = 0; round < rounds; ++round)
      for (size_t b = 0; b < batches.size(); ++b)
        for (int k = 0; k < 2; ++k) {
          const int mode = (k + round) % 2;  // alternate which mode runs first
          const Cell c = run_batch(spec, weights, batches[b], max_tokens, mode == 1);
          if (c.tokens_per_second > best[mode][b].tokens_per_second) best[mode][b] = c;
        }
    backend::set_batch_invariant(false);
    std::printf("n-gram speculation (k=4, lookup 2..4), %d generated tokens per request, best of %d rounds\n",
                max_tokens, rounds);
    std::printf("%-6s %12s %12s %11s %15s %9s\n", "batch", "off tok/s", "on tok/s", "accepted", "tokens/row-step",
                "on/off");
    for (size_t b = 0; b < batches.size(); ++b)
      std::printf("%-6lld %12.1f %12.1f %10.0f%% %15.2f %8.2fx\n", static_cast<long long>(batches[b]),
                  best[0][b].tokens_per_second, best[1][b].tokens_per_second, 100.0 * best[1][b].acceptance,
                  best[1][b].tokens_per_step, best[1][b].tokens_per_second / std::max(1e-9, best[0][b].tokens_per_second));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "speculative_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
