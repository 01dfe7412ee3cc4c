// Unit tests of the grammar layer: regex and JSON schema languages, masks
// against a brute-force check of every token, the matcher's stop / rollback
// rules, and the errors for what it does not support.
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "grammar/compiled_grammar.h"
#include "grammar/grammar_compiler.h"

namespace shardlm::grammar {
namespace {

using json = nlohmann::ordered_json;

// 256 single-byte tokens, some multi-byte ones, an empty (special) id and a stop id.
std::shared_ptr<const TokenVocabulary> small_vocab() {
  std::vector<std::string> t;
  for (int b = 0; b < 256; ++b) t.push_back(std::string(1, char(b)));
  for (const char* s : {"{\"", "\": ", "\", \"", "true", "fa", "lse", "null", "12", "345", "\"}", "ab", "abc", "-0",
                        "<tool_call>", "\n{\"name\": \"", "name", "\xe4\xbd", "\xa0"})
    t.push_back(s);
  t.push_back("");     // a special token: never allowed
  t.push_back("EOS");  // bytes of a stop token are irrelevant
  const int32_t stop = static_cast<int32_t>(t.size()) - 1;
  return std::make_shared<TokenVocabulary>(std::move(t), std::vector<int32_t>{stop});
}

std::shared_ptr<const CompiledGrammar> compile(const GrammarSpec& spec) {
  static GrammarCompiler compiler(small_vocab());
  return compiler.compile(spec);
}

GrammarSpec regex(const std::string& re) {
  GrammarSpec s;
  s.kind = GrammarSpec::Kind::kRegex;
  s.text = re;
  return s;
}

GrammarSpec schema(const std::string& text, bool compact = true) {
  GrammarSpec s;
  s.kind = GrammarSpec::Kind::kJsonSchema;
  s.schema = json::parse(text);
  s.json.compact = compact;
  return s;
}

bool matches(const GrammarSpec& spec, const std::string& text) {
  GrammarMatcher m(compile(spec));
  return m.accept_bytes(text) && m.is_complete();
}

TEST(Regex, FullMatchOfCommonConstructs) {
  EXPECT_TRUE(matches(regex("a(b|c)*d"), "abccbd"));
  EXPECT_FALSE(matches(regex("a(b|c)*d"), "abxd"));
  EXPECT_FALSE(matches(regex("a(b|c)*d"), "abc"));  // prefix only: not complete
  EXPECT_TRUE(matches(regex("^\\d{3}-\\d{2,4}$"), "123-4567"));
  EXPECT_FALSE(matches(regex("\\d{3}-\\d{2,4}"), "123-45678"));
  EXPECT_TRUE(matches(regex("[^a-c]+"), "xyz"));
  EXPECT_FALSE(matches(regex("[^a-c]+"), "xaz"));
  EXPECT_TRUE(matches(regex("(?:ab)?c?"), ""));
  EXPECT_TRUE(matches(regex("\\w+@\\w+\\.com"), "joe_1@mail.com"));
  EXPECT_TRUE(matches(regex("[\\s,]+"), " ,\t"));
  EXPECT_TRUE(matches(regex("."), "\xe4\xbd\xa0"));           // one code point, three bytes
  EXPECT_FALSE(matches(regex("."), "\xe4\xbd"));              // an incomplete character
  EXPECT_FALSE(matches(regex("."), "\xed\xa0\x80"));          // a surrogate is not UTF-8
  EXPECT_TRUE(matches(regex("[\\u4e00-\\u9fff]{2}"), "\xe4\xbd\xa0\xe5\xa5\xbd"));
  EXPECT_TRUE(matches(regex("a{2,}?"), "aaaa"));
  EXPECT_TRUE(matches(regex("x{"), "x{"));  // a literal brace, as Python reads it
}

TEST(Regex, RefusesWhatItCannotMatchExactly) {
  for (const char* re : {"(a)\\1", "(?=a)a", "\\bword", "a^b", "(?i)abc", "a++"}) {
    try {
      compile(regex(re));
      ADD_FAILURE() << re << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << re << ": " << e.what();
    }
  }
  for (const char* re : {"(ab", "ab)", "[abc", "*a", "a{3,1}"}) {
    try {
      compile(regex(re));
      ADD_FAILURE() << re << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << re << ": " << e.what();
    }
  }
}

TEST(JsonSchema, ObjectsWithRequiredAndOptionalProperties) {
  const auto s = schema(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"},
                            "c":{"type":"boolean"}},"required":["b"],"additionalProperties":false})");
  EXPECT_TRUE(matches(s, R"({"b": "x"})"));
  EXPECT_TRUE(matches(s, R"({"a": -12, "b": "x", "c": true})"));
  EXPECT_TRUE(matches(s, R"({"b": "", "c": false})"));
  EXPECT_FALSE(matches(s, R"({"a": 1})"));             // b is required
  EXPECT_FALSE(matches(s, R"({"b": "x","c": true})"));  // compact layout is exact
  EXPECT_FALSE(matches(s, R"({"c": true, "b": "x"})")); // schema order
  EXPECT_FALSE(matches(s, R"({"b": "x", "d": 1})"));
  const auto loose = schema(R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]})", false);
  EXPECT_TRUE(matches(loose, "{\n  \"a\" :\t7\n}"));
  EXPECT_FALSE(matches(loose, "{\"a\":7" + std::string(9, ' ') + "}"));  // whitespace is bounded
}

TEST(JsonSchema, ScalarsArraysEnumsAndRefs) {
  EXPECT_TRUE(matches(schema(R"({"type":"number"})"), "-0.5e+12"));
  EXPECT_FALSE(matches(schema(R"({"type":"number"})"), "01"));
  EXPECT_FALSE(matches(schema(R"({"type":"integer"})"), "1.0"));
  EXPECT_FALSE(matches(schema(R"({"type":"integer"})"), "1234567890123456"));  // digits are bounded
  EXPECT_TRUE(matches(schema(R"({"type":"integer","minimum":3,"maximum":12})"), "12"));
  EXPECT_FALSE(matches(schema(R"({"type":"integer","minimum":3,"maximum":12})"), "13"));
  EXPECT_FALSE(matches(schema(R"({"type":"integer","minimum":0})"), "-1"));
  EXPECT_TRUE(matches(schema(R"({"type":"string","maxLength":2})"), "\"\\n\xe4\xbd\xa0\""));
  EXPECT_FALSE(matches(schema(R"({"type":"string","maxLength":2})"), "\"abc\""));
  EXPECT_FALSE(matches(schema(R"({"type":"string"})"), "\"a\nb\""));  // raw control character
  EXPECT_FALSE(matches(schema(R"({"type":"string"})"), "\"\\ud800\""));  // lone surrogate escape
  EXPECT_TRUE(matches(schema(R"({"type":"array","items":{"type":"null"},"minItems":1,"maxItems":2})"), "[null, null]"));
  EXPECT_FALSE(matches(schema(R"({"type":"array","items":{"type":"null"},"minItems":1,"maxItems":2})"), "[]"));
  EXPECT_TRUE(matches(schema(R"({"enum":["a",1,{"k":[true]}]})"), R"({"k": [true]})"));
  EXPECT_TRUE(matches(schema(R"({"const":"x\"y"})"), R"("x\"y")"));
  EXPECT_TRUE(matches(schema(R"({"type":["string","null"]})"), "null"));
  EXPECT_TRUE(matches(schema(R"({"type":"string","format":"date"})"), "\"2024-02-28\""));
  EXPECT_FALSE(matches(schema(R"({"type":"string","format":"date"})"), "\"2024-13-01\""));
  EXPECT_TRUE(matches(schema(R"({"type":"string","pattern":"^[A-Z]{2}\"$"})"), R"("AB\"")"));
  const auto tree = schema(R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
      "kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v","kids"],
      "additionalProperties":false}},"$ref":"#/$defs/node"})");
  EXPECT_TRUE(matches(tree, R"({"v": 1, "kids": [{"v": 2, "kids": []}, {"v": 3, "kids": []}]})"));
  EXPECT_TRUE(matches(schema(R"({"anyOf":[{"type":"integer"},{"type":"array","items":{"type":"integer"}}]})"), "[1, 2]"));
}

TEST(JsonSchema, UnsupportedKeywordIsNamed) {
  auto expect_unsupported = [](const std::string& text, const std::string& word) {
    try {
      compile(schema(text));
      ADD_FAILURE() << text << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
      EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
    }
  };
  expect_unsupported(R"({"type":"object","properties":{"a":{"type":"string","contentEncoding":"base64"}}})",
                     "'contentEncoding'");
  expect_unsupported(R"({"oneOf":[{"type":"string"}]})", "'oneOf'");
  expect_unsupported(R"({"type":"number","multipleOf":2})", "multipleOf is supported only as 1, 0.1, 0.01");
  expect_unsupported(R"({"type":"string","format":"hostname"})", "hostname");
  expect_unsupported(R"({"type":"array","uniqueItems":true})", "uniqueItems");
  expect_unsupported(R"({"type":"string","maxLength":100000})", "maxLength");
  try {
    compile(schema(R"({"type":"object","properties":{"a":false},"required":["a"]})"));
    ADD_FAILURE() << "an unsatisfiable schema was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
  }
}

// The mask must allow exactly the tokens whose bytes the grammar accepts.
TEST(Matcher, MaskEqualsBruteForceAlongRandomWalks) {
  const auto vocab = small_vocab();
  for (const auto& spec : {schema(R"({"type":"object","properties":{"name":{"type":"string","maxLength":3},
                                      "ok":{"type":"boolean"},"n":{"type":"integer"}},"required":["name","ok"]})"),
                           regex("(ab|abc|-0)+x?"), schema(R"({"type":"array","items":{"type":"null"}})", false)}) {
    const auto g = compile(spec);
    std::mt19937 rng(7);
    for (int walk = 0; walk < 20; ++walk) {
      GrammarMatcher m(g);
      for (int step = 0; step < 30 && !m.is_terminated(); ++step) {
        std::vector<uint32_t> mask(size_t(vocab->n_mask_words()));
        const bool any = m.fill_next_token_bitmask(mask);
        std::vector<int32_t> allowed;
        for (int32_t t = 0; t < vocab->size(); ++t) {
          const bool bit = (mask[size_t(t) >> 5] >> (t & 31)) & 1;
          GrammarMatcher probe = m;
          ASSERT_EQ(bit, probe.accept_token(t)) << "token " << t << " '" << vocab->bytes(t) << "' at step " << step;
          if (bit) allowed.push_back(t);
        }
        ASSERT_EQ(any, !allowed.empty());
        if (allowed.empty()) break;
        ASSERT_TRUE(m.accept_token(allowed[rng() % allowed.size()]));
      }
    }
  }
}

TEST(Matcher, StopTokenOnlyWhenCompleteAndRollback) {
  const auto vocab = small_vocab();
  const int32_t stop = vocab->stop_ids()[0];
  GrammarMatcher m(compile(regex("ab(c)?")));
  EXPECT_FALSE(m.accept_token(stop));
  EXPECT_TRUE(m.accept_bytes("ab"));
  EXPECT_TRUE(m.is_complete());
  EXPECT_FALSE(m.is_terminated());  // "c" may still follow
  EXPECT_TRUE(m.accept_bytes("c"));
  EXPECT_TRUE(m.is_terminated());   // nothing may follow
  m.rollback(1);
  EXPECT_FALSE(m.is_terminated());
  EXPECT_TRUE(m.accept_token(stop));
  EXPECT_TRUE(m.is_terminated());
  EXPECT_FALSE(m.accept_bytes("c"));
  m.rollback(2);
  EXPECT_EQ(m.n_tokens(), 0);
  EXPECT_FALSE(m.is_complete());
  EXPECT_THROW(m.rollback(1), Error);
  // The special (empty) token is never allowed.
  EXPECT_FALSE(m.accept_token(vocab->size() - 2));
}

TEST(Matcher, ShortestCompletionCompletes) {
  GrammarMatcher m(compile(schema(R"({"type":"object","properties":{"a":{"type":"array","items":{"type":"integer"},
                                      "minItems":2}},"required":["a"]})")));
  ASSERT_TRUE(m.accept_bytes("{\"a\": [12"));
  const std::string rest = m.shortest_completion();
  EXPECT_EQ(rest, ", 0]}");
  EXPECT_TRUE(m.accept_bytes(rest));
  EXPECT_TRUE(m.is_terminated());
}

TEST(ToolCalls, HermesSyntaxWithArgumentsFromTheSchema) {
  GrammarSpec spec;
  spec.kind = GrammarSpec::Kind::kToolCalls;
  spec.tools = {{"get_weather", json::parse(R"({"type":"object","properties":{"city":{"type":"string"}},
                                                "required":["city"],"additionalProperties":false})")},
                {"now", json::parse(R"({"type":"object","properties":{}})")}};
  const std::string one = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  const std::string two = "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
  EXPECT_TRUE(matches(spec, one));
  EXPECT_TRUE(matches(spec, one + "\n" + two));
  EXPECT_FALSE(matches(spec, "<tool_call>\n{\"name\": \"other\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(matches(spec, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>"));
  spec.parallel_tool_calls = false;
  EXPECT_FALSE(matches(spec, one + "\n" + two));
}

TEST(Choice, ExactlyOneOfTheChoices) {
  GrammarSpec spec;
  spec.kind = GrammarSpec::Kind::kChoice;
  spec.choices = {"yes", "no", "not sure"};
  EXPECT_TRUE(matches(spec, "not sure"));
  EXPECT_FALSE(matches(spec, "not"));
  EXPECT_FALSE(matches(spec, "yesno"));
}

TEST(JsonObject, AnyObjectButNothingElse) {
  GrammarSpec spec;
  spec.kind = GrammarSpec::Kind::kJsonObject;
  spec.json.compact = false;
  EXPECT_TRUE(matches(spec, R"({"a": [1, {"b": null}], "c": "d"})"));
  EXPECT_TRUE(matches(spec, "{ }"));
  EXPECT_FALSE(matches(spec, "[1]"));
  EXPECT_FALSE(matches(spec, R"({"a": })"));
}

// --- Issue 21: bounded compile work, cancellation, a cache bounded by bytes ---

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a shardlm::Error";
  return "";
}

// The nested repetition tracks thousands of NFA states per DFA state: the
// compile-time probe meets the table budget (small here to stay fast) and
// the grammar is refused naming it.
TEST(Budget, ExplodingRegexIsRefusedAtCompile) {
  GrammarCompilerOptions o;
  o.max_table_bytes = size_t(1) << 20;
  GrammarCompiler compiler(small_vocab(), o);
  std::string e = error_of([&] { compiler.compile(regex("^(.{1,50}){30,80}$")); });
  EXPECT_NE(e.find("needs more than 1 MiB of automaton tables (the grammar table budget, serve --grammar-table-memory)"), std::string::npos) << e;
  EXPECT_EQ(compiler.n_cached(), 0u);
  // Ordinary grammars fit the same budget.
  EXPECT_NO_THROW(compiler.compile(regex("[a-z]{1,4000}")));
  EXPECT_NO_THROW(compiler.compile(regex("(\\w+\\s?){1,100}")));
  GrammarSpec any;
  any.kind = GrammarSpec::Kind::kJsonObject;
  EXPECT_NO_THROW(compiler.compile(any));
}

// Without the probe, the budget holds while decoding: the mask fails with the
// limit's name (the engine fails that request), and can_continue never throws.
TEST(Budget, TableBudgetHoldsWhileDecoding) {
  GrammarCompilerOptions o;
  o.max_table_bytes = size_t(1) << 20;
  o.probe_bytes = 0;
  GrammarCompiler compiler(small_vocab(), o);
  GrammarMatcher m(compiler.compile(regex("^(.{1,50}){30,80}$")));
  std::vector<uint32_t> mask(size_t(compiler.vocabulary().n_mask_words()));
  std::string e = error_of([&] {
    for (int i = 0; i < 4000; ++i) {
      m.fill_next_token_bitmask(mask);
      ASSERT_TRUE(m.accept_token('a'));
      m.is_terminated();
    }
  });
  EXPECT_NE(e.find("the grammar table budget"), std::string::npos) << e;
  // What it holds beyond its NFA stays within the budget (plus masks).
  GrammarCompiler fresh(small_vocab(), o);
  const size_t nfa_only = fresh.compile(regex("^(.{1,50}){30,80}$"))->memory_bytes();
  EXPECT_LE(m.grammar().memory_bytes(), nfa_only + (size_t(2) << 20));
  EXPECT_GT(m.grammar().memory_bytes(), nfa_only + (size_t(1) << 19));
}

TEST(Budget, CompilationStopsWhenCancelled) {
  GrammarCompiler compiler(small_vocab());
  int polls = 0;
  // Building a 120,000-state NFA polls twice before it is done.
  std::string e = error_of([&] { compiler.compile(regex(".{4000}"), [&] { return ++polls >= 1; }); });
  EXPECT_NE(e.find("grammar compilation was cancelled"), std::string::npos) << e;
  EXPECT_EQ(polls, 1);
  // The warm-up polls too: a small NFA, cancelled at the start mask's walk.
  polls = 0;
  e = error_of([&] { compiler.compile(regex("[ab]+"), [&] { return ++polls >= 1; }); });
  EXPECT_NE(e.find("cancelled"), std::string::npos) << e;
  EXPECT_EQ(compiler.n_cached(), 0u);
  EXPECT_NO_THROW(compiler.compile(regex("[ab]+"), [] { return false; }));
}

TEST(Budget, CacheIsAnLruBoundedByBytes) {
  GrammarCompilerOptions o;
  o.max_cache_bytes = size_t(3) << 20;
  GrammarCompiler compiler(small_vocab(), o);
  auto big = [](int i) { return regex("x" + std::to_string(i) + "[a-z]{1,2000}[0-9]{1,2000}"); };
  const auto first = compiler.compile(big(0));
  const size_t one = first->memory_bytes();
  ASSERT_GT(one, size_t(300) << 10);  // each holds several hundred KiB
  for (int i = 1; i < 40; ++i) {
    compiler.compile(big(i));
    EXPECT_EQ(compiler.compile(big(0)), first) << "the most recently used grammar stays cached";
    EXPECT_LE(compiler.cached_bytes(), o.max_cache_bytes + one);
  }
  EXPECT_LT(compiler.n_cached(), 40u / 2);
  // What was evicted is compiled afresh.
  const auto again = compiler.compile(big(1));
  EXPECT_NE(again, nullptr);
}

}  // namespace
}  // namespace shardlm::grammar
