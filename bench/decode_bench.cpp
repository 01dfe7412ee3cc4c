// decode_bench MODEL_DIR [--prompt N] [--decode M] [--tp T] [--no-bandwidth]: prefill and
// decode tokens/s of `shardlm generate`'s path on this CPU, and decode speed
// as a fraction of the memory-bandwidth roofline, measured in the same run:
//   roofline tok/s = read bandwidth (B/s) / weight bytes streamed per token
// where the bytes per token are every weight the step reads (all layer
// matrices and the lm_head; of the embedding only one row, unless tied, when
// the lm_head is the embedding). Bandwidth: bench/bandwidth.h's streaming
// read (sum) and triad probes (1 GiB in all, best 16 MiB pass after a
// warm-up; --no-bandwidth skips it, for callers that measure it once themselves, and then
// prints no roofline lines). Before the timed run, one short untimed generation warms the
// weights' pages, the caches and the thread pool.
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bandwidth.h"
#include "core/error.h"
#include "model/generate.h"
#include "plan/sharding.h"

using namespace shardlm;


int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: decode_bench MODEL_DIR [--prompt N] [--decode M] [--tp T] [--no-bandwidth]\n");
    return 2;
  }
  std::string dir = argv[1];
  int64_t n_prompt = 128, n_decode = 64;
  int tp = 1;
  bool measure_bw = true;
  for (int i = 2; i < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--no-bandwidth") {
      measure_bw = false;
      --i;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "option %s needs a value\n", a.c_str());
      return 2;
    }
    if (a == "--prompt") n_prompt = std::stoll(argv[i + 1]);
    else if (a == "--decode") n_decode = std::stoll(argv[i + 1]);
    else if (a == "--tp") tp = std::stoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  try {
    const ModelSpec spec = load_model_config(std::filesystem::path(dir) / "config.json");
    auto weights = open_checkpoint(dir);
    // Bytes one decode step streams (TP=1 view of the whole model).
    Layout one;
    int64_t step_bytes = 0;
    for (const TensorShard& t : rank_tensors(spec, one, 0, 0)) {
      if (t.name == "model.embed_tokens.weight" && !spec.tie_word_embeddings)
        step_bytes += t.bytes / t.full_shape[0];  // one row
      else
        step_bytes += t.bytes;
    }
    const bench::Bandwidth bw = measure_bw ? bench::measure_bandwidth() : bench::Bandwidth{};
    std::vector<int32_t> prompt(static_cast<size_t>(n_prompt));
    for (int64_t i = 0; i < n_prompt; ++i) prompt[i] = static_cast<int32_t>((i * 7919 + 13) % spec.vocab_size);
    GenerateOptions opt;
    opt.layout.tp = tp;
    opt.max_tokens = n_decode + 1;
    opt.kv_dtype = DType::kBF16;
    {  // warm-up, untimed: page in every weight, settle the thread pool
      GenerateOptions warm = opt;
      warm.max_tokens = 2;
      std::vector<int32_t> short_prompt(prompt.begin(), prompt.begin() + std::min<int64_t>(n_prompt, 8));
      generate_local(spec, weights, short_prompt, warm);
    }
    GenerateResult r = generate_local(spec, weights, prompt, opt);
    const double prefill_tps = n_prompt / r.prefill_seconds;
    const double decode_tps = (r.tokens.size() - 1) / r.decode_seconds;
    const double roofline = bw.read / static_cast<double>(step_bytes);
    const double roofline_triad = bw.triad / static_cast<double>(step_bytes);
    std::printf("model: %s %s, %lld layers, hidden %lld, vocab %lld, %s; threads %d, TP=%d\n", dir.c_str(),
                spec.architecture.c_str(), static_cast<long long>(spec.n_layers),
                static_cast<long long>(spec.hidden_size), static_cast<long long>(spec.vocab_size),
                dtype_torch_name(spec.dtype), omp_get_max_threads(), tp);
    if (measure_bw)
      std::printf("bandwidth: read %.2f GB/s, triad %.2f GB/s (best 16 MiB pass over 1 GiB)\n", bw.read / 1e9,
                  bw.triad / 1e9);
    std::printf("weight bytes per decode token: %.1f MB\n", step_bytes / 1e6);
    std::printf("prefill: %lld tokens in %.3f s = %.1f tok/s\n", static_cast<long long>(n_prompt), r.prefill_seconds,
                prefill_tps);
    std::printf("decode: %zu tokens in %.3f s = %.2f tok/s\n", r.tokens.size() - 1, r.decode_seconds, decode_tps);
    if (measure_bw) {
      std::printf("roofline (read): %.2f tok/s; decode / roofline = %.3f\n", roofline, decode_tps / roofline);
      std::printf("roofline (triad): %.2f tok/s; decode / roofline = %.3f\n", roofline_triad,
                  decode_tps / roofline_triad);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
