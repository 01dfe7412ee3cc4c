// bf16_activations_bench MODEL_DIR [--context N] [--steps M] [--rounds R]:
// what --dense-activations bf16 buys (backend/cpu/bf16_dot_gemm.h), side by
// side in one run: prefill of one N-token prompt (default 512) and decode at
// batch 1 and 16 (each sequence holding N cached tokens), with the exact f32
// activations (off) and the bf16 ones (on). Each round loads the model once
// per mode and times both; the order of the modes alternates by round, so
// both see the same machine load. Prints the median tokens/s of each cell
// over the rounds, the median of the per-round ratios on / off (1.50 = 50%
// more tokens/s with bf16 activations), the CPU and the load average before
// and after. It reports; it never fails on a timing (exit 0 whatever the
// ratios; where the CPU lacks AVX512_BF16 it says so and exits 0).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "backend/cpu/bf16_dot_gemm.h"
#include "core/cpu_isa.h"
#include "backend/cpu/ops.h"
#include "core/error.h"
#include "model/decode_bench.h"
#include "model/weight_source.h"

using namespace shardlm;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string loadavg() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bf16_activations_bench MODEL_DIR [--context N] [--steps M] [--rounds R]\n");
    return 2;
  }
  const std::string dir = argv[1];
  int64_t context = 512, steps = 16;
  int rounds = 5;
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
  std::printf("CPU: %s (kernels: %s)\n", cpu_model_name().c_str(),
              cpu_isa_name(active_cpu_isa()));
  if (!backend::bf16_dot_gemm_runs()) {
    std::printf("bf16 activations cannot run here: %s\n", backend::bf16_dot_gemm_missing());
    return 0;
  }
  try {
    const ModelSpec spec = load_model_config(std::filesystem::path(dir) / "config.json");
    auto weights = open_checkpoint(dir);
    const std::vector<int64_t> batches = {1, 16};
    // tps[mode][cell]: cell 0 prefill, 1 + b decode at batches[b]; one entry per round.
    std::vector<std::vector<std::vector<double>>> tps(2, std::vector<std::vector<double>>(1 + batches.size()));
    std::vector<std::vector<double>> ratio(1 + batches.size());
    const std::string load_before = loadavg();
    for (int round = 0; round < rounds; ++round) {
      for (int k = 0; k < 2; ++k) {
        const int mode = (k + round) % 2;  // alternate which mode runs first (page cache, frequency)
        backend::set_default_dense_activations(mode == 1 ? backend::DenseActivations::kBf16
                                                         : backend::DenseActivations::kF32);
        DecodeBenchOptions d;
        d.context = context;
        d.n_steps = steps;
        d.kv_dtype = DType::kF32;
        const std::vector<DecodeBenchResult> r = decode_bench_batches(spec, weights, d, batches);
        tps[mode][0].push_back(r[0].prefill_tokens_per_second());
        for (size_t b = 0; b < batches.size(); ++b) tps[mode][1 + b].push_back(r[b].tokens_per_second);
      }
      for (size_t c = 0; c < ratio.size(); ++c) ratio[c].push_back(tps[1][c].back() / std::max(1e-9, tps[0][c].back()));
      std::printf("round %d: prefill on/off %.3f, decode b1 %.3f, b16 %.3f\n", round, ratio[0].back(),
                  ratio[1].back(), ratio[2].back());
    }
    backend::set_default_dense_activations(backend::DenseActivations::kF32);
    std::printf("load average before %s, after %s\n", load_before.c_str(), loadavg().c_str());
    std::printf("--dense-activations bf16 vs f32 (context %lld, %lld decode steps, median of %d interleaved rounds)\n",
                static_cast<long long>(context), static_cast<long long>(steps), rounds);
    std::printf("%-22s %12s %12s %16s\n", "cell", "f32 tok/s", "bf16 tok/s", "ratio bf16/f32");
    for (size_t c = 0; c < ratio.size(); ++c) {
      const std::string name = c == 0 ? "prefill " + std::to_string(context)
                                      : "decode batch " + std::to_string(batches[c - 1]);
      std::printf("%-22s %12.1f %12.1f %15.3fx\n", name.c_str(), median(tps[0][c]), median(tps[1][c]),
                  median(ratio[c]));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bf16_activations_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
