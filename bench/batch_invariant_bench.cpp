// batch_invariant_bench MODEL_DIR [--context N] [--steps M] [--rounds R]:
// what --batch-invariant costs, decode at batch 1, 16 and 64, side by side
// in one run. Each round times both modes (default kernels, then the
// batch-invariant ones) over one load of the model each, at both batches;
// the best round of each cell is kept (the least disturbed by a shared
// machine); the order of the modes alternates by round. Prints tokens/s per cell and the ratio invariant / default time
// per token: 1.05 means invariance costs 5%. It reports; it never fails on a
// timing (exit 0 whatever the ratios).
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/error.h"
#include "model/decode_bench.h"
#include "model/weight_source.h"

using namespace shardlm;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: batch_invariant_bench MODEL_DIR [--context N] [--steps M] [--rounds R]\n");
    return 2;
  }
  const std::string dir = argv[1];
  int64_t context = 128, steps = 16;
  int rounds = 3;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--context") context = std::stoll(argv[i + 1]);
    else if (a == "--steps") steps = std::stoll(argv[i + 1]);
    else if (a == "--rounds") rounds = std::max(1, std::stoi(argv[i + 1]));
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  try {
    const ModelSpec spec = load_model_config(std::filesystem::path(dir) / "config.json");
    auto weights = open_checkpoint(dir);
    const std::vector<int64_t> batches = {1, 16, 64};  // 64: past the packed-GEMM threshold (32 rows; 8 with AMX)
    // best[mode][batch index]: tokens/s
    std::vector<std::vector<double>> best(2, std::vector<double>(batches.size(), 0.0));
    for (int round = 0; round < rounds; ++round) {
      for (int k = 0; k < 2; ++k) {
        const int mode = (k + round) % 2;  // alternate which mode runs first (page cache, frequency)
        DecodeBenchOptions d;
        d.context = context;
        d.n_steps = steps;
        d.kv_dtype = DType::kF32;
        d.batch_invariant = mode == 1;
        const std::vector<DecodeBenchResult> r = decode_bench_batches(spec, weights, d, batches);
        for (size_t b = 0; b < batches.size(); ++b) best[mode][b] = std::max(best[mode][b], r[b].tokens_per_second);
      }
    }
    backend::set_batch_invariant(false);
    std::printf("batch-invariant cost, decode (context %lld, %lld steps, best of %d rounds)\n",
                static_cast<long long>(context), static_cast<long long>(steps), rounds);
    std::printf("%-8s %14s %16s %22s\n", "batch", "default tok/s", "invariant tok/s", "cost (invariant/default)");
    for (size_t b = 0; b < batches.size(); ++b)
      std::printf("%-8lld %14.1f %16.1f %21.3fx\n", static_cast<long long>(batches[b]), best[0][b], best[1][b],
                  best[0][b] / std::max(1e-9, best[1][b]));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "batch_invariant_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
