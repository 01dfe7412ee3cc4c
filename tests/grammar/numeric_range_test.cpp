// JSON schema numeric ranges: integer and number bounds of any width (up to
// 18 integer digits), exclusive bounds and multipleOf. Property tests: every
// string the matcher lets a random walk generate lies in the range, and
// values just outside it (and non-canonical spellings) are rejected.
#include <gtest/gtest.h>

#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "grammar/compiled_grammar.h"
#include "grammar/grammar_compiler.h"

namespace shardlm::grammar {
namespace {

using json = nlohmann::ordered_json;
using Scaled = __int128;

// Single bytes, some multi-digit tokens and a stop token.
std::shared_ptr<const TokenVocabulary> vocab() {
  static const auto v = [] {
    std::vector<std::string> t;
    for (int b = 0; b < 256; ++b) t.push_back(std::string(1, char(b)));
    for (const char* s : {"12", "345", "-0", "00", "99", "0.", ".5", "100", "e5"}) t.push_back(s);
    t.push_back("EOS");
    const int32_t stop = static_cast<int32_t>(t.size()) - 1;
    return std::make_shared<TokenVocabulary>(std::move(t), std::vector<int32_t>{stop});
  }();
  return v;
}

GrammarCompiler& compiler() {
  static GrammarCompiler c(vocab());
  return c;
}

std::shared_ptr<const CompiledGrammar> compile(const json& schema) {
  GrammarSpec s;
  s.kind = GrammarSpec::Kind::kJsonSchema;
  s.schema = schema;
  return compiler().compile(s);
}

bool matches(const std::shared_ptr<const CompiledGrammar>& g, const std::string& text) {
  GrammarMatcher m(g);
  return m.accept_bytes(text) && m.is_complete();
}

// A random walk through the grammar: each step a random allowed token, the
// stop token a third of the time once it is allowed.
std::string sample(const std::shared_ptr<const CompiledGrammar>& g, std::mt19937_64& rng) {
  const auto& v = *vocab();
  const int32_t stop = v.size() - 1;
  GrammarMatcher m(g);
  std::string out;
  std::vector<uint32_t> mask(size_t(v.n_mask_words()));
  for (int step = 0; step < 200; ++step) {
    EXPECT_TRUE(m.fill_next_token_bitmask(mask)) << "no token allowed after '" << out << "'";
    std::vector<int32_t> allowed;
    bool stop_ok = false;
    for (int32_t t = 0; t < v.size(); ++t)
      if ((mask[size_t(t) >> 5] >> (t & 31)) & 1) (t == stop ? stop_ok = true : (allowed.push_back(t), true));
    if (stop_ok && (allowed.empty() || rng() % 3 == 0)) break;
    if (allowed.empty()) break;
    const int32_t t = allowed[rng() % allowed.size()];
    EXPECT_TRUE(m.accept_token(t));
    out += v.bytes(t);
  }
  EXPECT_TRUE(m.is_complete()) << out;
  return out;
}

// An independent reading of a generated decimal: value * 10^15, exactly
// (generated numbers have at most 15 fraction digits and no exponent).
Scaled scaled(const std::string& s) {
  size_t i = 0;
  const bool neg = !s.empty() && s[0] == '-';
  if (neg) ++i;
  Scaled ip = 0, fp = 0;
  int fd = 0;
  for (; i < s.size() && s[i] != '.'; ++i) ip = ip * 10 + (s[i] - '0');
  if (i < s.size()) ++i;
  for (; i < s.size(); ++i, ++fd) fp = fp * 10 + (s[i] - '0');
  for (; fd < 15; ++fd) fp *= 10;
  const Scaled v = ip * Scaled(1'000'000'000'000'000) + fp;
  return neg ? -v : v;
}

bool canonical_integer(const std::string& s) {
  const size_t d = s[0] == '-' ? 1 : 0;
  if (s.size() == d || s.find_first_not_of("0123456789", d) != std::string::npos) return false;
  if (s[d] == '0' && s.size() > d + 1) return false;  // leading zero
  return !(d == 1 && s == "-0");
}

int64_t random_width_value(std::mt19937_64& rng, int max_digits) {
  const int digits = 1 + int(rng() % uint64_t(max_digits));
  int64_t p = 1;
  for (int i = 0; i < digits; ++i) p *= 10;
  const int64_t v = int64_t(rng() % uint64_t(p));
  return rng() % 2 ? -v : v;
}

TEST(NumericRange, IssueExampleFiveDigitIntegers) {
  const auto g = compile(json::parse(R"({"type":"integer","minimum":10000,"maximum":99999})"));
  for (const char* in : {"10000", "99999", "12345", "50000"}) EXPECT_TRUE(matches(g, in)) << in;
  for (const char* out : {"9999", "100000", "0", "-10000", "010000", "1000", "99999.0"}) EXPECT_FALSE(matches(g, out)) << out;
  std::mt19937_64 rng(1);
  for (int i = 0; i < 200; ++i) {
    const std::string s = sample(g, rng);
    ASSERT_TRUE(canonical_integer(s)) << s;
    const int64_t v = std::stoll(s);
    EXPECT_TRUE(v >= 10000 && v <= 99999) << s;
  }
}

// Random ranges of every width, both signs, open and closed sides.
TEST(NumericRange, IntegerSamplesStayInRangeAndOutsideIsRejected) {
  std::mt19937_64 rng(2026);
  for (int r = 0; r < 60; ++r) {
    int64_t lo = random_width_value(rng, 15), hi = random_width_value(rng, 15);
    if (lo > hi) std::swap(lo, hi);
    const int sides = r % 4;  // 0 both, 1 only minimum, 2 only maximum, 3 exclusive both
    json s = {{"type", "integer"}};
    if (sides == 0 || sides == 1) s["minimum"] = lo;
    if (sides == 0 || sides == 2) s["maximum"] = hi;
    if (sides == 3) {
      if (hi - lo < 2) hi = lo + 2;
      s["exclusiveMinimum"] = lo - 1;
      s["exclusiveMaximum"] = hi + 1;
    }
    const bool has_lo = sides != 2, has_hi = sides != 1;
    const auto g = compile(s);
    SCOPED_TRACE(s.dump());
    for (int i = 0; i < 40; ++i) {
      const std::string t = sample(g, rng);
      ASSERT_TRUE(canonical_integer(t)) << t;
      const int64_t v = std::stoll(t);
      if (has_lo) {
        EXPECT_GE(v, lo) << t;
      }
      if (has_hi) {
        EXPECT_LE(v, hi) << t;
      }
    }
    if (has_lo) {
      EXPECT_TRUE(matches(g, std::to_string(lo)));
      EXPECT_FALSE(matches(g, std::to_string(lo - 1)));
      EXPECT_FALSE(matches(g, std::to_string(lo - 1 - int64_t(rng() % 1000000))));
    }
    if (has_hi) {
      EXPECT_TRUE(matches(g, std::to_string(hi)));
      EXPECT_FALSE(matches(g, std::to_string(hi + 1)));
      EXPECT_FALSE(matches(g, std::to_string(hi + 1 + int64_t(rng() % 1000000))));
    }
    const int64_t a = has_lo ? lo : hi - 1000000, b = has_hi ? hi : lo + 1000000;
    for (int i = 0; i < 20; ++i) {
      const int64_t v = a + int64_t(rng() % uint64_t(b - a + 1));
      EXPECT_TRUE(matches(g, std::to_string(v))) << v;
    }
    EXPECT_FALSE(matches(g, "-0"));
    EXPECT_FALSE(matches(g, "01"));
  }
}

// Small ranges checked against every integer near them.
TEST(NumericRange, SmallRangesExhaustively) {
  for (auto [lo, hi] : std::vector<std::pair<int, int>>{{-120, -7}, {-9, 9}, {0, 0}, {7, 7}, {95, 1030}, {-1, 0}}) {
    const auto g = compile(json{{"type", "integer"}, {"minimum", lo}, {"maximum", hi}});
    for (int v = lo - 200; v <= hi + 200; ++v)
      EXPECT_EQ(matches(g, std::to_string(v)), v >= lo && v <= hi) << v << " in [" << lo << ", " << hi << "]";
  }
}

TEST(NumericRange, IntegerWiderThanFifteenDigitsAndNonIntegralBounds) {
  const auto g = compile(json::parse(R"({"type":"integer","minimum":100000000000000000,"maximum":100000000000000005})"));
  EXPECT_TRUE(matches(g, "100000000000000003"));
  EXPECT_FALSE(matches(g, "100000000000000006"));
  const auto h = compile(json::parse(R"({"type":"integer","minimum":2.5,"exclusiveMaximum":7.5})"));
  for (int v = -2; v < 12; ++v) EXPECT_EQ(matches(h, std::to_string(v)), v >= 3 && v <= 7) << v;
  // Draft-4 boolean exclusive bounds modify minimum/maximum.
  const auto d4 = compile(json::parse(R"({"type":"integer","minimum":0,"exclusiveMinimum":true,"maximum":3})"));
  EXPECT_FALSE(matches(d4, "0"));
  EXPECT_TRUE(matches(d4, "1"));
}

TEST(NumericRange, NumberSamplesStayInRange) {
  struct Case {
    const char* schema;
    const char* lo;  // as decimals, for the independent check
    const char* hi;
    bool lo_ex, hi_ex;
  };
  const Case cases[] = {
      {R"({"type":"number","minimum":-2.5,"maximum":3.75})", "-2.5", "3.75", false, false},
      {R"({"type":"number","minimum":0.001,"maximum":0.002})", "0.001", "0.002", false, false},
      {R"({"type":"number","exclusiveMinimum":0,"exclusiveMaximum":1})", "0", "1", true, true},
      {R"({"type":"number","minimum":10000,"maximum":99999.5})", "10000", "99999.5", false, false},
      {R"({"type":"number","minimum":-1e6,"exclusiveMaximum":-0.25})", "-1000000", "-0.25", false, true},
      {R"({"type":"number","minimum":5})", "5", nullptr, false, false},
      {R"({"type":"number","maximum":-5.5})", nullptr, "-5.5", false, false},
      {R"({"type":"number","minimum":0})", "0", nullptr, false, false},
  };
  std::mt19937_64 rng(9);
  for (const auto& c : cases) {
    SCOPED_TRACE(c.schema);
    const auto g = compile(json::parse(c.schema));
    for (int i = 0; i < 150; ++i) {
      const std::string t = sample(g, rng);
      ASSERT_EQ(t.find_first_not_of("-0123456789."), std::string::npos) << t;
      ASSERT_TRUE(json::accept(t)) << t;  // valid JSON (no "-0"-style leading zeros, no bare ".")
      const Scaled v = scaled(t);
      if (c.lo) {
        EXPECT_TRUE(c.lo_ex ? v > scaled(c.lo) : v >= scaled(c.lo)) << t;
      }
      if (c.hi) {
        EXPECT_TRUE(c.hi_ex ? v < scaled(c.hi) : v <= scaled(c.hi)) << t;
      }
    }
  }
}

TEST(NumericRange, NumberBoundsAreExact) {
  const auto unit = compile(json::parse(R"({"type":"number","exclusiveMinimum":0,"exclusiveMaximum":1})"));
  for (const char* in : {"0.5", "0.000000000000001", "0.999999999999999", "0.1000"}) EXPECT_TRUE(matches(unit, in)) << in;
  for (const char* out : {"0", "0.0", "1", "1.0", "-0.5", "1.5", "0.", ".5", "5e-1"}) EXPECT_FALSE(matches(unit, out)) << out;
  const auto r = compile(json::parse(R"({"type":"number","minimum":-2.5,"maximum":3.75})"));
  for (const char* in : {"-2.5", "-2.50", "-2", "0", "3.75", "3.7", "-0.1", "1"}) EXPECT_TRUE(matches(r, in)) << in;
  for (const char* out : {"-2.51", "-3", "3.751", "4", "-0", "-0.0", "3.7500000000000001"})
    EXPECT_FALSE(matches(r, out)) << out;
}

TEST(NumericRange, MultipleOf) {
  const auto g = compile(json::parse(R"({"type":"integer","minimum":-20,"maximum":95,"multipleOf":15})"));
  for (int v = -40; v <= 120; ++v) EXPECT_EQ(matches(g, std::to_string(v)), v >= -20 && v <= 95 && v % 15 == 0) << v;
  const auto one = compile(json::parse(R"({"type":"number","multipleOf":1,"minimum":0,"maximum":3})"));
  EXPECT_TRUE(matches(one, "3"));
  EXPECT_FALSE(matches(one, "2.5"));
  auto refused = [](const char* text) {
    try {
      compile(json::parse(text));
      ADD_FAILURE() << text << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("multipleOf"), std::string::npos) << e.what();
    }
  };
  refused(R"({"type":"integer","multipleOf":3})");                                // unbounded
  refused(R"({"type":"integer","minimum":0,"maximum":1000000,"multipleOf":3})");  // too many multiples
  refused(R"({"type":"number","multipleOf":0.5,"minimum":0,"maximum":2})");
  refused(R"({"type":"number","multipleOf":0.25})");
  refused(R"({"type":"integer","minimum":1,"maximum":2,"multipleOf":5})");        // no multiple fits
}

// Hostile bounds: out of the supported width, not numbers, or empty ranges
// are refused at compile with the keyword named (a 400 through the server),
// never a crash or an unbounded build.
TEST(NumericRange, HostileBoundsAreRefusedNamingTheKeyword) {
  auto refused = [](const char* text, const char* keyword) {
    try {
      compile(json::parse(text));
      ADD_FAILURE() << text << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(keyword), std::string::npos) << text << ": " << e.what();
    }
  };
  refused(R"({"type":"integer","minimum":1e30})", "minimum");
  refused(R"({"type":"number","maximum":-1e300})", "maximum");
  refused(R"({"type":"integer","minimum":"5"})", "minimum");
  refused(R"({"type":"integer","minimum":10,"maximum":3})", "minimum");
}

// A number's multipleOf 0.1, 0.01, ...: at most that many fraction digits,
// with or without bounds.
TEST(NumericRange, NumberMultipleOfAPowerOfTenLimitsFractionDigits) {
  const auto price = compile(json::parse(R"({"type":"number","multipleOf":0.01,"minimum":0,"exclusiveMaximum":100})"));
  for (const char* in : {"0", "0.5", "19.99", "99.99", "7.10"}) EXPECT_TRUE(matches(price, in)) << in;
  for (const char* out : {"19.999", "100", "100.00", "-0.01", "1e1", "0.001"}) EXPECT_FALSE(matches(price, out)) << out;
  const auto tenth = compile(json::parse(R"({"type":"number","multipleOf":0.1})"));
  for (const char* in : {"-3.5", "12", "0.1"}) EXPECT_TRUE(matches(tenth, in)) << in;
  for (const char* out : {"0.15", "1e2", "-0"}) EXPECT_FALSE(matches(tenth, out)) << out;
  std::mt19937_64 rng(5);
  for (int i = 0; i < 100; ++i) {
    const std::string t = sample(price, rng);
    const size_t dot = t.find('.');
    EXPECT_TRUE(dot == std::string::npos || t.size() - dot - 1 <= 2) << t;
    const Scaled v = scaled(t);
    EXPECT_TRUE(v >= 0 && v < scaled("100")) << t;
  }
}

TEST(NumericRange, EmptyAndTooWideRangesAreRefused) {
  auto error_code = [](const char* text) -> std::optional<ErrorCode> {
    try {
      compile(json::parse(text));
    } catch (const Error& e) {
      return e.code();
    }
    return std::nullopt;
  };
  EXPECT_EQ(error_code(R"({"type":"integer","minimum":5,"maximum":4})"), ErrorCode::kInvalidArgument);
  EXPECT_EQ(error_code(R"({"type":"integer","exclusiveMinimum":4,"exclusiveMaximum":5})"), ErrorCode::kInvalidArgument);
  EXPECT_EQ(error_code(R"({"type":"number","minimum":1e30})"), ErrorCode::kUnsupported);
  EXPECT_EQ(error_code(R"({"type":"integer","minimum":1000000000000000000})"), ErrorCode::kUnsupported);
  EXPECT_EQ(error_code(R"({"type":"integer","maximum":-1000000000000000000})"), ErrorCode::kUnsupported);
  EXPECT_EQ(error_code(R"({"type":"integer","minimum":"3"})"), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardlm::grammar
