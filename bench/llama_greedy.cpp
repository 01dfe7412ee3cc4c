// llama_greedy MODEL.gguf IDS N THREADS [EXPECT]: greedy generation with llama.cpp from the
// prompt token ids IDS (comma-separated), N tokens, for bench/llama_cpp_compare.sh's token
// agreement check against `shardlm generate --prompt-ids`. Not part of shardlm's build: the
// script compiles it against the llama.cpp it builds under build/llama.cpp.
//
// The KV cache is F32 (shardlm's CPU default) so the two engines differ only in their
// kernels. Argmax takes the lowest id on ties, as shardlm's greedy sampler does, and it does
// not stop at an end-of-generation id (the caller compares as many tokens as shardlm gave).
// Prints "ids: a,b,c" and, per step, the chosen id and its margin over the runner-up. With
// EXPECT (shardlm's ids), it also prints the first step where they differ, with llama.cpp's
// logits of both candidates: "divergence: step S llama ID (LOGIT) shardlm ID (LOGIT) gap G".
// Last, "system_info: ..." (llama_print_system_info: the CPU features ggml uses).
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "llama.h"

namespace {

std::vector<llama_token> parse_ids(const std::string& s) {
  std::vector<llama_token> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(static_cast<llama_token>(std::stol(item)));
  }
  return out;
}

void quiet_log(enum ggml_log_level level, const char* text, void*) {
  if (level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: llama_greedy MODEL.gguf IDS N THREADS [EXPECT_IDS]\n");
    return 2;
  }
  const std::vector<llama_token> prompt = parse_ids(argv[2]);
  const int n_predict = std::atoi(argv[3]);
  const int n_threads = std::atoi(argv[4]);
  const std::vector<llama_token> expect = argc > 5 ? parse_ids(argv[5]) : std::vector<llama_token>{};
  if (prompt.empty() || n_predict < 1 || n_threads < 1) {
    std::fprintf(stderr, "llama_greedy: need prompt ids, N >= 1 and THREADS >= 1\n");
    return 2;
  }
  llama_log_set(quiet_log, nullptr);
  ggml_backend_load_all();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) {
    std::fprintf(stderr, "llama_greedy: cannot load %s\n", argv[1]);
    return 1;
  }
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  for (llama_token t : prompt) {
    if (t < 0 || t >= n_vocab) {
      std::fprintf(stderr, "llama_greedy: prompt id %d outside the vocabulary of %d\n", t, n_vocab);
      return 2;
    }
  }
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<uint32_t>(prompt.size() + n_predict + 8);
  cp.n_batch = static_cast<uint32_t>(prompt.size());
  cp.n_ubatch = cp.n_batch;
  cp.n_threads = n_threads;
  cp.n_threads_batch = n_threads;
  cp.type_k = GGML_TYPE_F32;
  cp.type_v = GGML_TYPE_F32;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) {
    std::fprintf(stderr, "llama_greedy: cannot create a context\n");
    return 1;
  }
  std::vector<llama_token> input = prompt, out;
  bool diverged = false;
  std::string steps;
  for (int step = 0; step < n_predict; ++step) {
    llama_batch batch = llama_batch_get_one(input.data(), static_cast<int32_t>(input.size()));
    if (llama_decode(ctx, batch) != 0) {
      std::fprintf(stderr, "llama_greedy: llama_decode failed at step %d\n", step);
      return 1;
    }
    const float* logits = llama_get_logits_ith(ctx, -1);
    int best = 0, second = -1;
    for (int v = 1; v < n_vocab; ++v) {
      if (logits[v] > logits[best]) {
        second = best;
        best = v;
      } else if (second < 0 || logits[v] > logits[second]) {
        second = v;
      }
    }
    char buf[96];
    std::snprintf(buf, sizeof buf, "step %d: %d margin %.4f\n", step, best, logits[best] - logits[second]);
    steps += buf;
    if (!diverged && step < static_cast<int>(expect.size()) && expect[step] != best) {
      diverged = true;
      const int e = expect[step];
      const float le = (e >= 0 && e < n_vocab) ? logits[e] : 0.0f;
      std::printf("divergence: step %d llama %d (%.4f) shardlm %d (%.4f) gap %.4f\n", step, best, logits[best], e, le,
                  logits[best] - le);
    }
    out.push_back(best);
    input.assign(1, best);
  }
  std::printf("ids: ");
  for (size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? "," : "", out[i]);
  std::printf("\n%s", steps.c_str());
  // The CPU features ggml was built for and found ("CPU : ... AVX512_BF16 = 1 | AMX_INT8 = 1 | ... REPACK = 1"):
  // bench/llama_cpp_paths.py reads its kernel paths from them.
  std::printf("system_info: %s\n", llama_print_system_info());
  llama_free(ctx);
  llama_model_free(model);
  return 0;
}
