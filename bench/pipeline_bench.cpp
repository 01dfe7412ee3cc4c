// pipeline_bench MODEL_DIR [--pp P] [--requests R] [--prompt N] [--decode M]:
// serving throughput of a PP-stage pipeline (ranks as threads, one backend
// thread each) with one batch at a time versus PP micro-batches in flight,
// measured side by side in one run (A, B, A, B; best of each). The ratio is
// what keeping every stage busy buys; on a machine with fewer cores than
// stages it cannot exceed cores / 1.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/local_group_executor.h"
#include "model/weight_source.h"
#include "loader/model_spec.h"

using namespace shardlm;

namespace {

struct Args {
  std::string model;
  int pp = 2;
  int requests = 8;
  int prompt = 32;
  int decode = 32;
};

// Tokens/s of R greedy requests (prompt + decode each), all submitted at once.
double run_once(const ModelSpec& spec, LocalGroupExecutor& executor, const Args& a, int in_flight, int64_t n_blocks,
                int64_t* overlapped) {
  EngineConfig cfg;
  cfg.scheduler.n_blocks = static_cast<int32_t>(n_blocks);
  cfg.scheduler.block_size = 16;
  cfg.scheduler.max_model_len = a.prompt + a.decode;
  cfg.scheduler.max_num_batched_tokens = 2048;
  cfg.scheduler.enable_prefix_caching = false;  // every run computes everything
  cfg.max_batches_in_flight = in_flight;
  Engine engine(cfg, executor);
  int64_t n_tokens = 0;
  for (int r = 0; r < a.requests; ++r) {
    EngineRequest q;
    q.request_id = std::to_string(r);
    for (int k = 0; k < a.prompt; ++k) q.prompt_token_ids.push_back(static_cast<int32_t>((k * 131 + r * 17 + 5) % spec.vocab_size));
    q.sampling.temperature = 0.0;
    q.stop.max_tokens = a.decode;
    q.stop.ignore_eos = true;
    engine.submit(q, {[&](const SequenceOutput& o) { n_tokens += static_cast<int64_t>(o.new_token_ids.size()); }});
  }
  const auto t0 = std::chrono::steady_clock::now();
  engine.run_until_idle();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  *overlapped = engine.metrics().snapshot().pipeline_overlapped_batches_total;
  return static_cast<double>(n_tokens + int64_t(a.requests) * a.prompt) / s;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    auto next = [&] {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", argv[i]);
        std::exit(2);
      }
      return std::atoi(argv[++i]);
    };
    if (!std::strcmp(argv[i], "--pp")) a.pp = next();
    else if (!std::strcmp(argv[i], "--requests")) a.requests = next();
    else if (!std::strcmp(argv[i], "--prompt")) a.prompt = next();
    else if (!std::strcmp(argv[i], "--decode")) a.decode = next();
    else if (a.model.empty()) a.model = argv[i];
    else {
      std::fprintf(stderr, "usage: pipeline_bench MODEL_DIR [--pp P] [--requests R] [--prompt N] [--decode M]\n");
      return 2;
    }
  }
  if (a.model.empty() || a.pp < 1 || a.requests < 1 || a.prompt < 1 || a.decode < 1) {
    std::fprintf(stderr, "usage: pipeline_bench MODEL_DIR [--pp P] [--requests R] [--prompt N] [--decode M]\n");
    return 2;
  }
  try {
    const ModelSpec spec = load_model_config(std::filesystem::path(a.model) / "config.json");
    LocalGroupOptions o;
    o.layout.pp = a.pp;
    o.block_size = 16;
    o.n_blocks = int64_t(a.requests) * ((a.prompt + a.decode + 15) / 16 + 1);
    o.kv_dtype = spec.dtype;
    o.n_threads_per_rank = 1;
    LocalGroupExecutor executor(spec, open_checkpoint(a.model), o);
    double best[2] = {0, 0};
    int64_t overlapped[2] = {0, 0};
    for (int round = 0; round < 2; ++round)
      for (int mode = 0; mode < 2; ++mode) {
        const double tok_s = run_once(spec, executor, a, mode == 0 ? 1 : 0, o.n_blocks, &overlapped[mode]);
        best[mode] = std::max(best[mode], tok_s);
      }
    std::printf("model %s, PP %d (one thread per stage), %d requests x (%d prompt + %d decode) tokens\n",
                a.model.c_str(), a.pp, a.requests, a.prompt, a.decode);
    std::printf("one batch at a time      : %10.1f tok/s\n", best[0]);
    std::printf("%d micro-batches in flight: %10.1f tok/s (%lld batches overlapped)\n", a.pp, best[1],
                static_cast<long long>(overlapped[1]));
    std::printf("ratio in flight / one at a time: %.2f\n", best[1] / best[0]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pipeline_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
