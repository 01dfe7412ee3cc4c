// Sampler microbenchmark (issue 10, "sampling, off the hot path"): time per
// sampled token on a Qwen2.5-sized vocabulary (151,936), batch 1 and 16.
// Batch 16 is timed serially and with one OpenMP thread per core over the
// sequences (what the engine does for large batches).
//   sampler_bench [--vocab N] [--reps N]
// Prints microseconds per step (medians): thread CPU time for the serial
// columns (robust on a shared machine), wall time for the parallel one.
// Never fails on timing.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "sampling/sampler.h"

using namespace shardlm;

namespace {

struct Config {
  const char* name;
  SamplingParams params;
};

std::vector<Config> configs() {
  auto make = [](double t, double top_p, int32_t top_k, double min_p, int32_t logprobs, bool logprob, double rep) {
    SamplingParams p;
    p.temperature = t;
    p.top_p = top_p;
    p.top_k = top_k;
    p.min_p = min_p;
    p.logprobs = logprobs;
    p.repetition_penalty = rep;
    p.seed = 1;
#ifndef SHARDLM_SAMPLER_BENCH_OLD
    p.return_logprob = logprob;  // the engine asks for it only when a request returns logprobs
#else
    (void)logprob;
#endif
    return p;
  };
  return {
      {"greedy", make(0.0, 1.0, -1, 0.0, 0, false, 1.0)},
      {"greedy+logprobs5", make(0.0, 1.0, -1, 0.0, 5, true, 1.0)},
      {"t1", make(1.0, 1.0, -1, 0.0, 0, false, 1.0)},
      {"t0.7_top_p0.9", make(0.7, 0.9, -1, 0.0, 0, false, 1.0)},
      {"t0.7_top_k50_top_p0.95", make(0.7, 0.95, 50, 0.0, 0, false, 1.0)},
      {"t1_min_p0.05", make(1.0, 1.0, -1, 0.05, 0, false, 1.0)},
      {"t1.5_top_p0.95_flat", make(1.5, 0.95, -1, 0.0, 0, false, 1.0)},
      {"t0.7_top_p0.9_rep1.1", make(0.7, 0.9, -1, 0.0, 0, false, 1.1)},
  };
}

double cpu_us() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int64_t vocab = 151936;
  int reps = 30;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--vocab")) vocab = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "sampler_bench: unknown flag %s (flags: --vocab N --reps N)\n", argv[i]);
      return 2;
    }
  }
  const int batch = 16;
  // LM-like rows: a normal body (std 2.5) with a few strong candidates.
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.0f, 2.5f);
  std::vector<float> logits(size_t(batch) * vocab);
  for (float& x : logits) x = normal(rng);
  for (int b = 0; b < batch; ++b)
    for (int j = 0; j < 8; ++j) logits[size_t(b) * vocab + rng() % vocab] += 12.0f - j;
  std::vector<int32_t> prompt(64);
  for (auto& t : prompt) t = int32_t(rng() % vocab);

  std::printf("sampler_bench: vocab %lld, %d reps, %d OpenMP threads; microseconds per step (median)\n",
              static_cast<long long>(vocab), reps, omp_get_max_threads());
  std::printf("%-26s %12s %14s %14s\n", "config", "batch 1 cpu", "batch 16 cpu", "batch 16 par wall");
  for (const Config& c : configs()) {
    std::vector<std::unique_ptr<Sampler>> s;
    for (int b = 0; b < batch; ++b) s.push_back(std::make_unique<Sampler>(c.params, prompt, vocab));
    auto row = [&](int b) { return std::span<const float>(logits.data() + size_t(b) * vocab, size_t(vocab)); };
    volatile int32_t sink = 0;
    for (int w = 0; w < 3; ++w) sink = sink + s[0]->sample(row(0)).token;  // warm-up (scratch, caches)
    std::vector<double> t1, t16, t16p;
    for (int r = 0; r < reps; ++r) {
      const double a = cpu_us();
      sink = sink + s[0]->sample(row(0)).token;
      const double b = cpu_us();
      for (int k = 0; k < batch; ++k) sink = sink + s[k]->sample(row(k)).token;
      const double c1 = cpu_us();
      auto c2 = std::chrono::steady_clock::now();
#pragma omp parallel for schedule(dynamic)
      for (int k = 0; k < batch; ++k) s[k]->sample(row(k));
      auto d = std::chrono::steady_clock::now();
      t1.push_back(b - a);
      t16.push_back(c1 - b);
      t16p.push_back(std::chrono::duration<double, std::micro>(d - c2).count());
    }
    std::printf("%-26s %12.1f %14.1f %14.1f\n", c.name, median(t1), median(t16), median(t16p));
  }
  return 0;
}
