// Every schema of tests/grammar/schema_corpus.json, over the real Qwen3
// vocabulary when the tokenizer cache has it (else the synthetic one):
// random walks choose uniformly among the tokens the mask allows, then
// finish along the grammar's shortest completion spelled in single-byte
// tokens, each checked against the mask too. Every text must then validate
// against its schema in an independent validator (python3-jsonschema).
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "grammar/compiled_grammar.h"
#include "grammar/grammar_compiler.h"
#include "loader/synthetic_tokenizer.h"
#include "support/process.h"
#include "tokenizer/tokenizer.h"

namespace shardlm::grammar {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

struct TestVocab {
  std::shared_ptr<const TokenVocabulary> vocab;
  std::string name;
};

TestVocab load_vocab() {
  const fs::path qwen = fs::path(testing::env_or("SHARDLM_BINARY_DIR", ".")) / ".cache/tokenizers/qwen3";
  std::optional<Tokenizer> tok;
  std::string name;
  if (fs::exists(qwen / "tokenizer.json")) {
    tok.emplace(Tokenizer::load(qwen));
    name = "qwen3";
  } else {
    const SyntheticTokenizer st = build_synthetic_tokenizer(1024);
    tok.emplace(Tokenizer::from_json(synthetic_tokenizer_json(st).dump(),
                                     synthetic_tokenizer_config_json(st, 4096).dump()));
    name = "synthetic";
  }
  std::vector<std::string> bytes(size_t(tok->vocab_size()));
  for (int32_t id = 0; id < tok->vocab_size(); ++id)
    if (!tok->is_special(id)) bytes[size_t(id)] = std::string(tok->token_bytes(id));
  std::vector<int32_t> stops;
  if (tok->eos_id()) stops.push_back(*tok->eos_id());
  return {std::make_shared<TokenVocabulary>(std::move(bytes), stops), name};
}

bool bit(const std::vector<uint32_t>& mask, int32_t t) { return (mask[size_t(t) >> 5] >> (t & 31)) & 1; }

TEST(SchemaCorpus, RandomWalksValidateAgainstPythonJsonschema) {
  const fs::path src = testing::env_or("SHARDLM_SOURCE_DIR", ".");
  std::ifstream in(src / "tests/grammar/schema_corpus.json");
  ASSERT_TRUE(in) << "missing tests/grammar/schema_corpus.json";
  const json corpus = json::parse(in);
  ASSERT_GE(corpus.size(), 30u);

  const TestVocab tv = load_vocab();
  const TokenVocabulary& v = *tv.vocab;
  std::vector<int32_t> byte_token(256, -1);
  for (int32_t t = 0; t < v.size(); ++t)
    if (v.bytes(t).size() == 1 && byte_token[uint8_t(v.bytes(t)[0])] < 0) byte_token[uint8_t(v.bytes(t)[0])] = t;
  for (int b = 0; b < 256; ++b) ASSERT_GE(byte_token[size_t(b)], 0) << "the vocabulary has no token for byte " << b;

  GrammarCompiler compiler(tv.vocab);
  const fs::path out_path = fs::temp_directory_path() / ("shardlm_schema_corpus_" + std::to_string(getpid()) + ".jsonl");
  std::ofstream out(out_path);
  std::mt19937_64 rng(20261201);
  std::vector<uint32_t> mask(size_t(v.n_mask_words()));
  int64_t n_masks = 0;
  double mask_s = 0;
  const int kWalks = 4, kRandomTokens = 24;
  for (const auto& c : corpus) {
    const std::string name = c["name"];
    GrammarSpec spec;
    spec.kind = GrammarSpec::Kind::kJsonSchema;
    spec.schema = c["schema"];
    std::shared_ptr<const CompiledGrammar> g;
    ASSERT_NO_THROW(g = compiler.compile(spec)) << name;
    for (int w = 0; w < kWalks; ++w) {
      GrammarMatcher m(g);
      std::string text;
      bool ended = false;
      for (int step = 0; step < kRandomTokens && !m.is_terminated(); ++step) {
        const auto t0 = std::chrono::steady_clock::now();
        ASSERT_TRUE(m.fill_next_token_bitmask(mask)) << name << ": no token allowed after '" << text << "'";
        mask_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        ++n_masks;
        std::vector<int32_t> allowed;
        for (int32_t t = 0; t < v.size(); ++t)
          if (bit(mask, t)) allowed.push_back(t);
        const int32_t pick = allowed[rng() % allowed.size()];
        ASSERT_TRUE(m.accept_token(pick)) << name << ": the mask allowed token " << pick << " but accept refused it";
        if (v.is_stop(pick)) {
          ended = true;
          break;
        }
        text += v.bytes(pick);
      }
      if (!ended) {
        for (char ch : m.shortest_completion()) {
          const int32_t t = byte_token[uint8_t(ch)];
          m.fill_next_token_bitmask(mask);
          ASSERT_TRUE(bit(mask, t)) << name << ": completion byte " << int(uint8_t(ch)) << " not in the mask";
          ASSERT_TRUE(m.accept_token(t));
          text += ch;
        }
      }
      ASSERT_TRUE(m.is_complete()) << name << ": " << text;
      m.fill_next_token_bitmask(mask);
      for (int32_t s : v.stop_ids()) EXPECT_TRUE(bit(mask, s)) << name << ": EOS not allowed at the end";
      out << json{{"name", name}, {"schema", c["schema"]}, {"text", text}}.dump() << "\n";
    }
  }
  out.close();
  std::printf("vocabulary %s (%d tokens): %lld masks, %.3f ms each on average\n", tv.name.c_str(), v.size(),
              static_cast<long long>(n_masks), 1e3 * mask_s / double(std::max<int64_t>(n_masks, 1)));
  const auto r = testing::run_command("/usr/bin/python3 " + testing::shell_quote((src / "tests/grammar/validate.py").string()) +
                                       " " + testing::shell_quote(out_path.string()),
                                   /*merge_stderr=*/true);
  EXPECT_EQ(r.rc, 0) << r.out;
  std::printf("%s", r.out.c_str());
  if (r.rc == 0) fs::remove(out_path);
}

}  // namespace
}  // namespace shardlm::grammar
