// Tokenizer pieces on small synthetic inputs: UTF-8 repair, byte-level
// mapping, split behaviours, BPE merge order, added tokens, templates,
// streaming, and the errors bad tokenizer.json files must produce.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace shardlm {
namespace {

using json = nlohmann::json;

// A byte-level BPE over the 256 byte stand-ins plus a few merges.
json tiny_tokenizer(bool list_merges = false) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level::byte_to_char(static_cast<uint8_t>(b))] = b;
  std::vector<std::pair<std::string, std::string>> merges = {
      {"a", "a"}, {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"Ġ", "w"}, {"aa", "a"}};
  int next = 256;
  json merge_list = json::array();
  for (auto& [l, r] : merges) {
    vocab[l + r] = next++;
    if (list_merges)
      merge_list.push_back(json::array({l, r}));
    else
      merge_list.push_back(l + " " + r);
  }
  json t;
  t["version"] = "1.0";
  t["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list}};
  t["normalizer"] = {{"type", "NFC"}};
  t["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  t["decoder"] = {{"type", "ByteLevel"}};
  t["post_processor"] = nullptr;
  t["added_tokens"] = json::array({
      {{"id", 300}, {"content", "<|end|>"}, {"special", true}, {"normalized", false}},
      {{"id", 301}, {"content", "<|end|>x"}, {"special", false}, {"normalized", false}},
      {{"id", 302}, {"content", "<s>"}, {"special", true}, {"lstrip", true}, {"rstrip", true}},
  });
  return t;
}

Tokenizer make(const json& t, const json& config = json()) {
  return Tokenizer::from_json(t.dump(), config.is_null() ? std::string() : config.dump(), "test/tokenizer.json");
}

std::vector<TokenId> byte_ids(std::string_view s) {
  std::vector<TokenId> ids;
  for (char c : s) ids.push_back(static_cast<uint8_t>(c));
  return ids;
}

TEST(Utf8, LossyReplacesMaximalSubparts) {
  EXPECT_EQ(utf8::lossy("ok"), "ok");
  EXPECT_EQ(utf8::lossy("a\xF0\x9F\x98" "b"), "a\xEF\xBF\xBD" "b");   // truncated 4-byte: one U+FFFD
  EXPECT_EQ(utf8::lossy("\xC0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");      // overlong: two
  EXPECT_EQ(utf8::lossy("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  size_t at = 0;
  EXPECT_FALSE(utf8::is_valid("ab\xFF", &at));
  EXPECT_EQ(at, 2u);
  EXPECT_EQ(utf8::incomplete_tail("a\xF0\x9F\x98"), 3u);
  EXPECT_EQ(utf8::incomplete_tail("a\xF0\x9F\x98\x80"), 0u);
  EXPECT_EQ(utf8::incomplete_tail("a\xE2"), 1u);
  EXPECT_EQ(utf8::incomplete_tail("a\xFF"), 0u);  // never completes: not held
}

TEST(ByteLevel, RoundTripsAllBytes) {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  std::string mapped, back;
  byte_level::encode(all, mapped);
  ASSERT_TRUE(byte_level::decode(mapped, back));
  EXPECT_EQ(back, all);
  EXPECT_EQ(byte_level::byte_to_char(' '), "Ġ");
  EXPECT_EQ(byte_level::byte_to_char('\n'), "Ċ");
  EXPECT_FALSE(byte_level::decode("€", back));
}

std::vector<std::string> pieces(const json& config, std::string_view text) {
  PreTokenizer p(config, "test");
  std::vector<std::string> out;
  p.apply(text, out);
  return out;
}

TEST(PreTokenizer, SplitBehaviours) {
  json split = {{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", "Isolated"}, {"invert", false}};
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces(split, "a-b--c"), (V{"a", "-", "b", "-", "-", "c"}));
  split["behavior"] = "Removed";
  EXPECT_EQ(pieces(split, "a-b--c"), (V{"a", "b", "c"}));
  split["behavior"] = "MergedWithPrevious";
  EXPECT_EQ(pieces(split, "a-b--c"), (V{"a-", "b-", "-", "c"}));
  split["behavior"] = "MergedWithNext";
  EXPECT_EQ(pieces(split, "a-b--c"), (V{"a", "-b", "-", "-c"}));
  split["behavior"] = "Contiguous";
  EXPECT_EQ(pieces(split, "a-b--c"), (V{"a", "-", "b", "--", "c"}));
  json regex = {{"type", "Split"}, {"pattern", {{"Regex", "\\p{N}+"}}}, {"behavior", "Removed"}, {"invert", true}};
  EXPECT_EQ(pieces(regex, "ab12cd345"), (V{"12", "345"}));
}

TEST(PreTokenizer, QwenRegexConstructs) {
  json split = {{"type", "Split"},
                {"pattern", {{"Regex", R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}}},
                {"behavior", "Isolated"}};
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces(split, "I'LL go"), (V{"I", "'LL", " go"}));
  EXPECT_EQ(pieces(split, "a   b"), (V{"a", "  ", " b"}));  // \s+(?!\S) leaves the last space to the word
  EXPECT_EQ(pieces(split, "x12"), (V{"x", "1", "2"}));
  EXPECT_EQ(pieces(split, "日本語です"), (V{"日本語です"}));
}

TEST(PreTokenizer, ByteLevelPrefixSpaceAndGpt2Regex) {
  json bl = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces(bl, "Hi there"), (V{"ĠHi", "Ġthere"}));
  bl["use_regex"] = false;
  bl["add_prefix_space"] = false;
  EXPECT_EQ(pieces(bl, "Hi there"), (V{"HiĠthere"}));
}

TEST(PreTokenizer, MetaspacePrependSchemesAndSplit) {
  json ms = {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "always"}, {"split", true}};
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces(ms, "Hi there"), (V{"\u2581Hi", "\u2581there"}));
  EXPECT_EQ(pieces(ms, " Hi  x"), (V{"\u2581Hi", "\u2581", "\u2581x"}));  // a leading space is the prefix
  ms["split"] = false;
  EXPECT_EQ(pieces(ms, "Hi there"), (V{"\u2581Hi\u2581there"}));
  ms["prepend_scheme"] = "never";
  EXPECT_EQ(pieces(ms, "Hi there"), (V{"Hi\u2581there"}));
  ms["prepend_scheme"] = "first";
  PreTokenizer first(ms, "test");
  V out;
  first.apply("a b", out, /*first_section=*/false);  // after an added token: no prefix
  first.apply("a b", out, /*first_section=*/true);
  EXPECT_EQ(out, (V{"a\u2581b", "\u2581a\u2581b"}));
  json bad = {{"type", "Metaspace"}, {"prepend_scheme", "sometimes"}};
  EXPECT_THROW(PreTokenizer(bad, "test"), Error);
}

void expect_error(const json& t, ErrorCode code, std::vector<std::string> needles);

// A SentencePiece-style tokenizer (Llama 2, Mixtral): "▁" normalizer or
// Metaspace pre-tokenizer, byte fallback, Replace/ByteFallback/Fuse/Strip.
json sentencepiece_tokenizer(bool metaspace) {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = 3 + b;
  }
  int next = 259;
  for (const char* t : {"\u2581", "H", "i", "\u2581H", "\u2581Hi", "x", "\u00e9"}) vocab[t] = next++;
  json t;
  t["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({"\u2581 H", "\u2581H i"})},
                {"unk_token", "<unk>"}, {"byte_fallback", true}, {"fuse_unk", true}};
  if (metaspace) {
    t["normalizer"] = nullptr;
    t["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "first"}, {"split", false}};
    t["decoder"] = {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "first"}, {"split", false}};
  } else {
    t["normalizer"] = {{"type", "Sequence"},
                       {"normalizers", json::array({{{"type", "Prepend"}, {"prepend", "\u2581"}},
                                                    {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}})}};
    t["pre_tokenizer"] = nullptr;
    t["decoder"] = {{"type", "Sequence"},
                    {"decoders", json::array({{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                                              {{"type", "ByteFallback"}},
                                              {{"type", "Fuse"}},
                                              {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}};
  }
  t["post_processor"] = nullptr;
  t["added_tokens"] = json::array({{{"id", 1}, {"content", "<s>"}, {"special", true}, {"normalized", false}},
                                   {{"id", 2}, {"content", "</s>"}, {"special", true}, {"normalized", false}}});
  return t;
}

TEST(Tokenizer, SentencePieceByteFallbackAndDecoders) {
  for (bool metaspace : {false, true}) {
    SCOPED_TRACE(metaspace ? "Metaspace" : "Prepend+Replace");
    Tokenizer tok = make(sentencepiece_tokenizer(metaspace));
    const TokenId sp = 259, hi = 263, x = 264, e_acute = 265;
    EXPECT_EQ(tok.encode("Hi x", false), (std::vector<TokenId>{hi, sp, x}));
    // "ü" (C3 BC) is not in the vocabulary: its bytes; "é" is.
    EXPECT_EQ(tok.encode("x\u00fc\u00e9", false), (std::vector<TokenId>{sp, x, 3 + 0xC3, 3 + 0xBC, e_acute}));
    EXPECT_EQ(tok.leading_spaces_stripped(), 1u);
    EXPECT_EQ(tok.token_bytes(hi), " Hi");
    // A Metaspace decoder alone has no ByteFallback step: HF leaves "<0x0A>" as text.
    const std::string text = metaspace ? "Hi x<0xC3><0xBC>" : "Hi x\u00fc";
    EXPECT_EQ(tok.token_bytes(3 + 0x0A), metaspace ? "<0x0A>" : "\n");
    auto ids = tok.encode("Hi x\u00fc", false);
    EXPECT_EQ(tok.decode(ids), text);
    StreamDecoder stream(tok);
    std::string joined;
    for (TokenId id : ids) joined += stream.feed(id);
    EXPECT_EQ(joined + stream.flush(), text);
    // After an added token the text is a new section.
    auto with_eos = tok.encode("Hi</s>Hi", false);
    if (metaspace)  // prepend_scheme "first": no "▁" after </s>
      EXPECT_EQ(with_eos, (std::vector<TokenId>{hi, 2, 260, 261}));
    else  // the Prepend normalizer runs on every section
      EXPECT_EQ(with_eos, (std::vector<TokenId>{hi, 2, hi}));
    EXPECT_EQ(tok.decode(with_eos, true), metaspace ? "HiHi" : "Hi Hi");
  }
  json t = sentencepiece_tokenizer(false);
  t["decoder"]["decoders"][3]["stop"] = 1;
  expect_error(t, ErrorCode::kUnsupported, {"decoder", "stop"});
  t = sentencepiece_tokenizer(false);
  t["decoder"] = {{"type", "WordPiece"}};
  expect_error(t, ErrorCode::kUnsupported, {"decoder", "WordPiece"});
}

TEST(Tokenizer, BpeMergesByRankBothMergeForms) {
  for (bool list_form : {false, true}) {
    Tokenizer tok = make(tiny_tokenizer(list_form));
    EXPECT_EQ(tok.encode("hello"), std::vector<TokenId>({*tok.token_to_id("hello")}));
    // "aa" (rank 0) merges leftmost first, then "aa"+"a" (rank 6).
    EXPECT_EQ(tok.encode("aaaa"), std::vector<TokenId>({*tok.token_to_id("aa"), *tok.token_to_id("aa")}));
    EXPECT_EQ(tok.encode("aaa"), std::vector<TokenId>({*tok.token_to_id("aaa")}));
    EXPECT_EQ(tok.encode(" w"), std::vector<TokenId>({*tok.token_to_id("Ġw")}));
    EXPECT_EQ(tok.encode("hex"), (std::vector<TokenId>{*tok.token_to_id("he"), 'x'}));
  }
}

TEST(Tokenizer, AddedTokensLongestMatchAndStrip) {
  Tokenizer tok = make(tiny_tokenizer());
  auto end = *tok.token_to_id("<|end|>");
  auto endx = *tok.token_to_id("<|end|>x");
  auto s = *tok.token_to_id("<s>");
  EXPECT_EQ(tok.encode("a<|end|>b"), (std::vector<TokenId>{'a', end, 'b'}));
  EXPECT_EQ(tok.encode("<|end|>x"), std::vector<TokenId>({endx}));  // longest wins
  EXPECT_EQ(tok.encode("a  <s>  b"), (std::vector<TokenId>{'a', s, 'b'}));  // lstrip + rstrip
  EXPECT_EQ(tok.encode_ordinary("<s>"), byte_ids("<s>"));
  EXPECT_TRUE(tok.is_special(end));
  EXPECT_FALSE(tok.is_special(endx));
  EXPECT_EQ(tok.decode(std::vector<TokenId>{'a', end, 'b'}, true), "ab");
  EXPECT_EQ(tok.decode(std::vector<TokenId>{'a', end, 'b'}, false), "a<|end|>b");
  EXPECT_EQ(tok.vocab_size(), 303);
}

TEST(Tokenizer, NfcNormalizesBeforeBpe) {
  Tokenizer tok = make(tiny_tokenizer());
  EXPECT_EQ(tok.encode("e\xCC\x81"), byte_ids("\xC3\xA9"));  // e + U+0301 -> é
  EXPECT_EQ(tok.normalize("e\xCC\x81"), "\xC3\xA9");
  EXPECT_THROW(tok.encode("bad \xFF"), Error);
}

TEST(Tokenizer, TemplateProcessingAddsBos) {
  json t = tiny_tokenizer();
  t["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                              {{"SpecialToken", {{"id", "<|end|>"}, {"type_id", 0}}}}})},
      {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {302}}, {"tokens", {"<s>"}}}}}}};
  Tokenizer tok = make(t);
  EXPECT_EQ(tok.encode("a", true), (std::vector<TokenId>{302, 'a', 300}));
  EXPECT_EQ(tok.encode("a", false), (std::vector<TokenId>{'a'}));
  t["post_processor"]["single"] = "<s> $A:0";
  EXPECT_EQ(make(t).encode("a", true), (std::vector<TokenId>{302, 'a'}));
}

TEST(Tokenizer, ConfigSpecialTokens) {
  json config = {{"bos_token", {{"content", "<s>"}, {"__type", "AddedToken"}}}, {"eos_token", "<|end|>"}, {"pad_token", nullptr}};
  Tokenizer tok = make(tiny_tokenizer(), config);
  EXPECT_EQ(tok.bos_id(), 302);
  EXPECT_EQ(tok.eos_id(), 300);
  EXPECT_EQ(tok.pad_id(), std::nullopt);
  config["eos_token"] = "<nope>";
  try {
    make(tiny_tokenizer(), config);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer_config.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("eos_token"), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, UnknownIdsDecodeToNothing) {
  Tokenizer tok = make(tiny_tokenizer());
  EXPECT_EQ(tok.decode(std::vector<TokenId>{'a', 5000, -3, 303, 'b'}), "ab");
  EXPECT_EQ(tok.id_to_token(5000), std::nullopt);
  EXPECT_EQ(tok.token_bytes(-1), "");
  StreamDecoder stream(tok);
  EXPECT_EQ(stream.feed(999999), "");
}

TEST(StreamDecoder, HoldsSplitCharactersUntilComplete) {
  Tokenizer tok = make(tiny_tokenizer());
  std::string emoji = "\xF0\x9F\x91\x8D";  // U+1F44D, one byte per token here
  StreamDecoder stream(tok);
  EXPECT_EQ(stream.feed('x'), "x");
  EXPECT_EQ(stream.feed(0xF0), "");
  EXPECT_EQ(stream.feed(0x9F), "");
  EXPECT_EQ(stream.feed(0x91), "");
  EXPECT_EQ(stream.n_pending_bytes(), 3u);
  EXPECT_EQ(stream.feed(0x8D), emoji);
  // An invalid byte is replaced at once; a truncated sequence at flush.
  EXPECT_EQ(stream.feed(0xFF), utf8::kReplacement);
  EXPECT_EQ(stream.feed(0xE2), "");
  EXPECT_EQ(stream.feed('a'), std::string(utf8::kReplacement) + "a");
  EXPECT_EQ(stream.feed(0xE2), "");
  EXPECT_EQ(stream.flush(), utf8::kReplacement);
  EXPECT_EQ(stream.n_pending_bytes(), 0u);
}

void expect_error(const json& t, ErrorCode code, std::vector<std::string> needles) {
  try {
    make(t);
    FAIL() << "expected an error for " << t.dump().substr(0, 200);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

TEST(TokenizerErrors, BadFilesNameFileAndField) {
  json t = tiny_tokenizer();
  t["model"]["type"] = "WordPiece";
  expect_error(t, ErrorCode::kUnsupported, {"test/tokenizer.json", "model", "WordPiece"});
  t = tiny_tokenizer();
  t["model"]["merges"].push_back("zz qq");
  expect_error(t, ErrorCode::kCorruptFile, {"merges[7]", "zz"});
  t = tiny_tokenizer();
  t.erase("model");
  expect_error(t, ErrorCode::kCorruptFile, {"field model"});
  t = tiny_tokenizer();
  t["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  expect_error(t, ErrorCode::kUnsupported, {"pre_tokenizer", "(unclosed"});
  t = tiny_tokenizer();
  t["normalizer"] = {{"type", "Precompiled"}};
  expect_error(t, ErrorCode::kUnsupported, {"normalizer", "Precompiled"});
  t = tiny_tokenizer();
  t["added_tokens"].push_back({{"content", "x"}});
  expect_error(t, ErrorCode::kCorruptFile, {"added_tokens[3]"});
  try {
    Tokenizer::from_json("{not json", "", "dir/tokenizer.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruptFile);
    EXPECT_NE(std::string(e.what()).find("dir/tokenizer.json"), std::string::npos);
  }
  auto dir = std::filesystem::temp_directory_path() / "shardlm_tokenizer_missing";
  std::filesystem::create_directories(dir);
  try {
    Tokenizer::load(dir);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
    EXPECT_NE(std::string(e.what()).find("tokenizer.json"), std::string::npos);
  }
}

// Issue 21: a pre-tokenizer regex that backtracks exponentially is refused
// at load when short probes already show it, and otherwise stops at PCRE2's
// match limits on the input that triggers it, with an error naming them.
TEST(TokenizerErrors, BacktrackingRegexesAreBounded) {
  json t = tiny_tokenizer();
  t["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(a+)+$"}}}, {"behavior", "Isolated"}};
  expect_error(t, ErrorCode::kUnsupported, {"test/tokenizer.json: field pre_tokenizer", "backtracks without bound", "(a+)+$"});
  t["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(x+x+)+[yz]"}}}, {"behavior", "Isolated"}};
  Tokenizer tok = make(t);  // the probes do not meet this one
  EXPECT_FALSE(tok.encode("xy xxy", false).empty());
  try {
    tok.encode(std::string(40, 'x'), false);
    FAIL() << "exponential backtracking was not bounded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("the tokenizer's regex limits"), std::string::npos) << e.what();
  }
}

TEST(TokenizerErrors, WrongTypesNameFileAndField) {
  // Fields the readers take without a shape check of their own: nlohmann's
  // bare "type must be boolean, but is string" named neither file nor field.
  json t = tiny_tokenizer();
  t["pre_tokenizer"]["add_prefix_space"] = "yes";
  expect_error(t, ErrorCode::kCorruptFile, {"test/tokenizer.json: field pre_tokenizer: a value has the wrong type"});
  t = tiny_tokenizer();
  t["model"]["vocab"]["a"] = "x";
  expect_error(t, ErrorCode::kCorruptFile, {"test/tokenizer.json: field model"});
  t = tiny_tokenizer();
  t["model"]["byte_fallback"] = "x";
  expect_error(t, ErrorCode::kCorruptFile, {"test/tokenizer.json: field model: a value has the wrong type"});
  t = tiny_tokenizer();
  t["normalizer"] = {{"type", 7}};
  expect_error(t, ErrorCode::kCorruptFile, {"test/tokenizer.json: field normalizer"});
}

TEST(TokenizerErrors, OversizedFileIsRefusedBeforeReading) {
  auto dir = std::filesystem::temp_directory_path() / ("shardlm_tokenizer_huge_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  {
    std::ofstream(dir / "tokenizer.json") << "{}";
  }
  std::filesystem::resize_file(dir / "tokenizer.json", (size_t(256) << 20) + 1);  // sparse: no disk, no time
  try {
    Tokenizer::load(dir);
    FAIL() << "a 256 MiB + 1 tokenizer.json was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("256 MiB"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace shardlm
