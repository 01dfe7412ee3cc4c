// grammar_bench MODEL_DIR [--tokenizer DIR] [--decode M] [--threads T]:
// what constrained decoding costs per decode step, as a share of the step,
// at batch 1 and batch 16. Each batch runs greedy requests of M decode
// tokens twice over the same model: unconstrained, and constrained by a JSON
// schema (an array of at least 200 small objects, so the grammar cannot
// complete within M tokens and both runs decode exactly M tokens per
// sequence). Share = (t_grammar - t_plain) / t_grammar, best of 2 runs
// each; "cold" is the first grammar run with empty mask caches (a new
// schema), "warm" reuses the compiled grammar (the same schema again).
// The vocabulary is the tokenizer's (--tokenizer: e.g. the real Qwen3
// tokenizer, so masks cover 151k tokens). Prints; never fails on speed.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/local_group_executor.h"
#include "grammar/grammar_compiler.h"
#include "loader/model_spec.h"
#include "model/weight_source.h"
#include "sampling/token_mask.h"
#include "tokenizer/tokenizer.h"

using namespace shardlm;

namespace {

const char* const kSchema = R"({"type":"object","properties":{"items":{"type":"array","minItems":200,
  "items":{"type":"object","properties":{"name":{"type":"string","maxLength":8},
  "qty":{"type":"integer","minimum":0,"maximum":99},"ok":{"type":"boolean"},
  "when":{"type":"string","format":"date"}},"required":["name","qty","ok","when"],"additionalProperties":false}}},
  "required":["items"],"additionalProperties":false})";

double run(const ModelSpec& spec, LocalGroupExecutor& executor, int64_t n_blocks, int batch, int decode,
           std::shared_ptr<const grammar::CompiledGrammar> g, int64_t* n_tokens,
           std::vector<std::vector<int32_t>>* tokens = nullptr) {
  EngineConfig cfg;
  cfg.scheduler.n_blocks = static_cast<int32_t>(n_blocks);
  cfg.scheduler.block_size = 16;
  cfg.scheduler.max_model_len = 8 + decode;
  cfg.scheduler.max_num_batched_tokens = 2048;
  cfg.scheduler.enable_prefix_caching = false;
  Engine engine(cfg, executor);
  *n_tokens = 0;
  if (tokens) tokens->assign(size_t(batch), {});
  for (int r = 0; r < batch; ++r) {
    EngineRequest q;
    q.request_id = std::to_string(r);
    for (int k = 0; k < 8; ++k) q.prompt_token_ids.push_back(static_cast<int32_t>((k * 131 + r * 17 + 5) % spec.vocab_size));
    q.sampling.temperature = 0.0;
    q.stop.max_tokens = decode;
    q.stop.ignore_eos = true;
    q.grammar = g;
    engine.submit(q, {[&, r](const SequenceOutput& o) {
                    *n_tokens += static_cast<int64_t>(o.new_token_ids.size());
                    if (tokens) (*tokens)[size_t(r)].insert((*tokens)[size_t(r)].end(), o.new_token_ids.begin(),
                                                            o.new_token_ids.end());
                  }});
  }
  const auto t0 = std::chrono::steady_clock::now();
  engine.run_until_idle();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The grammar work of the engine's steps alone, replayed on one thread (the
// engine fills a batch's masks in parallel, so this is an upper bound):
// per step and sequence, fill the mask, apply it to a logits row, accept
// the token. Seconds per step.
double replay(std::shared_ptr<const grammar::CompiledGrammar> g, const std::vector<std::vector<int32_t>>& tokens,
              int64_t vocab, int decode) {
  std::vector<grammar::GrammarMatcher> m;
  for (size_t i = 0; i < tokens.size(); ++i) m.emplace_back(g);
  std::vector<uint32_t> mask(size_t(g->vocabulary().n_mask_words()));
  std::vector<float> logits(size_t(vocab), 0.5f);
  const auto t0 = std::chrono::steady_clock::now();
  for (int s = 0; s < decode; ++s)
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (size_t(s) >= tokens[i].size()) continue;
      m[i].fill_next_token_bitmask(mask);
      apply_token_bitmask(logits, mask);
      if (!m[i].accept_token(tokens[i][size_t(s)])) fail(ErrorCode::kInternal, "replay: token not accepted");
    }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / decode;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model, tok_dir;
  int decode = 32, threads = 0;
  for (int i = 1; i < argc; ++i) {
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", argv[i]);
        std::exit(2);
      }
      return argv[++i];
    };
    if (!std::strcmp(argv[i], "--tokenizer")) tok_dir = value();
    else if (!std::strcmp(argv[i], "--decode")) decode = std::atoi(value());
    else if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(value());
    else if (model.empty()) model = argv[i];
    else model.clear(), i = argc;
  }
  if (model.empty() || decode < 1) {
    std::fprintf(stderr, "usage: grammar_bench MODEL_DIR [--tokenizer DIR] [--decode M] [--threads T]\n");
    return 2;
  }
  try {
    const ModelSpec spec = load_model_config(std::filesystem::path(model) / "config.json");
    const Tokenizer tok = Tokenizer::load(tok_dir.empty() ? model : tok_dir);
    std::vector<std::string> bytes(size_t(spec.vocab_size));
    for (int32_t id = 0; id < std::min<int64_t>(spec.vocab_size, tok.vocab_size()); ++id)
      if (!tok.is_special(id)) bytes[size_t(id)] = std::string(tok.token_bytes(id));
    std::vector<int32_t> stops;
    if (tok.eos_id() && *tok.eos_id() < spec.vocab_size) stops.push_back(*tok.eos_id());
    auto vocab = std::make_shared<grammar::TokenVocabulary>(std::move(bytes), stops);
    grammar::GrammarSpec gs;
    gs.kind = grammar::GrammarSpec::Kind::kJsonSchema;
    gs.schema = nlohmann::ordered_json::parse(kSchema);

    const int max_batch = 16;
    LocalGroupOptions o;
    o.block_size = 16;
    o.n_blocks = int64_t(max_batch) * ((8 + decode + 15) / 16 + 1);
    o.kv_dtype = spec.dtype;
    o.n_threads_per_rank = threads > 0 ? threads : 0;
    LocalGroupExecutor executor(spec, open_checkpoint(model), o);
    std::printf("model %s (vocab %lld), grammar vocabulary %d tokens, %d decode tokens per sequence\n", model.c_str(),
                static_cast<long long>(spec.vocab_size), vocab->size(), decode);
    for (int batch : {1, 16}) {
      int64_t n = 0;
      const auto t_compile0 = std::chrono::steady_clock::now();
      auto g = std::make_shared<const grammar::CompiledGrammar>(grammar::build_nfa(gs), vocab, "json_schema");
      const double compile_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_compile0).count();
      double plain = 1e30, cold = 0, warm = 1e30;
      std::vector<std::vector<int32_t>> tokens;
      for (int round = 0; round < 2; ++round) {
        plain = std::min(plain, run(spec, executor, o.n_blocks, batch, decode, nullptr, &n));
        const double t = run(spec, executor, o.n_blocks, batch, decode, g, &n, &tokens);
        if (round == 0) cold = t;
        else warm = std::min(warm, t);
        if (n != int64_t(batch) * decode)
          std::printf("  (grammar run produced %lld tokens, expected %d)\n", static_cast<long long>(n), batch * decode);
      }
      auto fresh = std::make_shared<const grammar::CompiledGrammar>(grammar::build_nfa(gs), vocab, "json_schema");
      const double replay_cold = replay(fresh, tokens, spec.vocab_size, decode);
      const double replay_warm = replay(fresh, tokens, spec.vocab_size, decode);
      const double step = plain / decode;
      std::printf("batch %2d: decode step %.2f ms unconstrained (%.2f ms cold / %.2f ms warm with the grammar, wall "
                  "clock; noisy on a shared machine)\n", batch, 1e3 * step, 1e3 * cold / decode, 1e3 * warm / decode);
      std::printf("          grammar work per step, one thread: %.3f ms cold (new schema), %.3f ms warm = "
                  "%.1f%% / %.1f%% of the step (target < 10%%); compile %.1f ms, %zu DFA states\n",
                  1e3 * replay_cold, 1e3 * replay_warm, 100.0 * replay_cold / (step + replay_cold),
                  100.0 * replay_warm / (step + replay_warm), 1e3 * compile_s, g->n_dfa_states());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "grammar_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
