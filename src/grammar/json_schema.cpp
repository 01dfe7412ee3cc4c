#include "grammar/json_schema.h"

#include <charconv>
#include <cmath>
#include <functional>
#include <optional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "grammar/regex.h"

namespace shardlm::grammar {
namespace {

using json = nlohmann::ordered_json;

// Hard limit on object/array nesting of a schema itself (not recursion).
constexpr int kMaxSchemaNesting = 64;
constexpr int kMaxSchemaWalk = 256;  // value() calls open at once: bounds the C++ stack

const std::set<std::string>& annotation_keywords() {
  static const std::set<std::string> k = {"title",      "description", "default",  "examples", "$schema",
                                          "$id",        "$comment",    "deprecated", "readOnly", "writeOnly",
                                          "$defs",      "definitions", "strict"};
  return k;
}

const std::set<std::string>& handled_keywords() {
  static const std::set<std::string> k = {
      "type",      "properties", "required",  "additionalProperties", "enum",      "const",     "anyOf",
      "allOf",     "$ref",       "items",     "minItems",             "maxItems",  "minLength", "maxLength",
      "pattern",   "format",     "minimum",   "maximum",              "exclusiveMinimum", "exclusiveMaximum",
      "multipleOf", "uniqueItems"};
  return k;
}

// Serialises a value with the grammar's separators.
void dump_value(const json& v, bool compact, std::string* out) {
  if (v.is_object()) {
    out->push_back('{');
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!first) *out += compact ? ", " : ",";
      first = false;
      *out += json(it.key()).dump();
      *out += compact ? ": " : ":";
      dump_value(it.value(), compact, out);
    }
    out->push_back('}');
  } else if (v.is_array()) {
    out->push_back('[');
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) *out += compact ? ", " : ",";
      dump_value(v[i], compact, out);
    }
    out->push_back(']');
  } else {
    *out += v.dump();
  }
}

class Converter {
 public:
  Converter(NfaBuilder& b, const json& root, const JsonOptions& o) : b_(b), root_(root), o_(o) {}

  int32_t ws(int32_t next) {
    if (o_.compact) return next;
    ByteSet s;
    for (char c : {' ', '\n', '\t', '\r'}) s.add(uint8_t(c));
    return b_.repeat([&](int32_t n) { return b_.byte_of(s, n); }, 0, o_.max_whitespace, next, "whitespace");
  }
  int32_t comma(int32_t next) { return o_.compact ? b_.literal(", ", next) : ws(b_.literal(",", ws(next))); }
  int32_t colon(int32_t next) { return o_.compact ? b_.literal(": ", next) : ws(b_.literal(":", ws(next))); }

  int32_t literal_value(const json& v, int32_t next) {
    std::string s;
    dump_value(v, o_.compact, &s);
    return b_.literal(s, next);
  }

  // One character of a JSON string's content.
  int32_t string_char(int32_t next) {
    std::vector<int32_t> starts;
    starts.push_back(b_.codepoint_range(0x20, 0x21, next));
    starts.push_back(b_.codepoint_range(0x23, 0x5B, next));
    starts.push_back(b_.codepoint_range(0x5D, 0x10FFFF, next));
    ByteSet simple;
    for (char c : {'"', '\\', '/', 'b', 'f', 'n', 'r', 't'}) simple.add(uint8_t(c));
    ByteSet bs;
    bs.add('\\');
    starts.push_back(b_.byte_of(bs, b_.byte_of(simple, next)));
    // \uXXXX without surrogates: [0-9a-cA-C]hhh | [dD][0-7]hh | [eEfF]hhh
    ByteSet hex, lead1, d, lo7, lead3;
    hex.add_range('0', '9'), hex.add_range('a', 'f'), hex.add_range('A', 'F');
    lead1.add_range('0', '9'), lead1.add_range('a', 'c'), lead1.add_range('A', 'C');
    d.add('d'), d.add('D');
    lo7.add_range('0', '7');
    lead3.add_range('e', 'f'), lead3.add_range('E', 'F');
    const int32_t h2 = b_.byte_of(hex, b_.byte_of(hex, next));
    const int32_t h3 = b_.byte_of(hex, h2);
    const int32_t u_alts[3] = {b_.byte_of(lead1, h3), b_.byte_of(d, b_.byte_of(lo7, h2)), b_.byte_of(lead3, h3)};
    starts.push_back(b_.literal("\\u", b_.alt(u_alts)));
    return b_.alt(starts);
  }

  int32_t any_string(int64_t min_len, int64_t max_len, int32_t next, const std::string& path) {
    const int32_t close = b_.literal("\"", next);
    const int32_t body = b_.repeat([&](int32_t n) { return string_char(n); }, min_len, max_len, close, path);
    return b_.literal("\"", body);
  }

  int32_t regex_string(std::string_view pattern, int32_t next, const std::string& path) {
    RegexOptions ro;
    ro.json_string = true;
    ro.what = path;
    return b_.literal("\"", compile_regex(b_, pattern, b_.literal("\"", next), ro));
  }

  // JSON list: open, between min and max elements (max < 0: unbounded), close.
  int32_t list(const char* open, const char* close, const std::function<int32_t(int32_t)>& elem, int64_t min,
               int64_t max, int32_t next, const std::string& path) {
    const int32_t closing = ws(b_.literal(close, next));
    if (max == 0) return b_.literal(open, closing);
    if (max < 0 && min <= 1) {
      // One shared element: loop -> closing | comma element -> loop.
      const int32_t loop = b_.add_state();
      const int32_t e = elem(loop);
      if (e == kEmpty) return min == 0 ? b_.literal(open, closing) : kEmpty;
      b_.add_eps(loop, closing);
      b_.add_eps(loop, comma(e));
      const int32_t pair[2] = {e, min == 0 ? closing : kEmpty};
      return b_.literal(open, ws(b_.alt(pair)));
    }
    const int32_t tail = b_.repeat([&](int32_t n) { return comma(elem(n)); }, std::max<int64_t>(min - 1, 0),
                                   max < 0 ? -1 : max - 1, closing, path);
    const int32_t first = elem(tail);
    int32_t content = first;
    if (min == 0) {
      const int32_t pair[2] = {first, closing};
      content = b_.alt(pair);
    }
    return b_.literal(open, ws(content));
  }

  int32_t any_value(int depth, int32_t next) {
    std::vector<int32_t> starts;
    starts.push_back(any_string(0, -1, next, "string"));
    starts.push_back(number(next, true));
    for (const char* lit : {"true", "false", "null"}) starts.push_back(b_.literal(lit, next));
    if (depth < o_.max_depth) {
      starts.push_back(any_object(depth + 1, next));
      starts.push_back(list("[", "]", [&](int32_t n) { return any_value(depth + 1, n); }, 0, -1, next, "array"));
    }
    return b_.alt(starts);
  }

  int32_t any_object(int depth, int32_t next) {
    auto member = [&](int32_t n) { return any_string(0, -1, colon(any_value(depth, n)), "key"); };
    return list("{", "}", member, 0, -1, next, "object");
  }

  int32_t number(int32_t next, bool allow_negative) {
    return compile_regex(b_, std::string(allow_negative ? "-?" : "") +
                                 "(0|[1-9][0-9]{0,14})(\\.[0-9]{1,15})?([eE][+-]?[0-9]{1,2})?",
                         next);
  }

  [[noreturn]] void unsupported(const std::string& path, const std::string& what) {
    fail(ErrorCode::kUnsupported, "JSON schema ", path, ": ", what);
  }
  [[noreturn]] void invalid(const std::string& path, const std::string& what) {
    fail(ErrorCode::kInvalidArgument, "JSON schema ", path, ": ", what);
  }

  const json& resolve(const std::string& ref, const std::string& path) {
    if (ref == "#") return root_;
    if (ref.rfind("#/", 0) != 0)
      unsupported(path + "/$ref", "only local references (\"#\", \"#/$defs/...\") are supported, got '" + ref + "'");
    const json* cur = &root_;
    size_t pos = 2;
    while (pos <= ref.size()) {
      size_t end = ref.find('/', pos);
      if (end == std::string::npos) end = ref.size();
      std::string token = ref.substr(pos, end - pos);
      std::string key;
      for (size_t i = 0; i < token.size(); ++i) {
        if (token[i] == '~' && i + 1 < token.size()) {
          key.push_back(token[i + 1] == '1' ? '/' : '~');
          ++i;
        } else {
          key.push_back(token[i]);
        }
      }
      if (!cur->is_object() || !cur->contains(key))
        invalid(path + "/$ref", "the reference '" + ref + "' does not resolve (no '" + key + "')");
      cur = &(*cur)[key];
      pos = end + 1;
    }
    return *cur;
  }

  // --- Numeric ranges --------------------------------------------------
  // Bounds are exact decimals scaled by 10^kMaxFractionDigits (int128), so an
  // exclusive bound is the inclusive one a unit of the last fraction digit in:
  // generated numbers never have more fraction digits than that.
  using Scaled = __int128;
  static constexpr int64_t kScale = 1'000'000'000'000'000;  // 10^kMaxFractionDigits
  static_assert(kMaxFractionDigits == 15 && kMaxIntegerDigits == 15);
  static constexpr int64_t kMaxBoundInt = 999'999'999'999'999'999;  // 18 digits: fits int64

  // The bound as a scaled decimal, rounded towards the inside of the range
  // (up for a lower bound, down for an upper one).
  Scaled scaled_bound(const json& v, bool lower, const std::string& path) {
    if (!v.is_number()) invalid(path, "must be a number");
    const double d = v.get<double>();
    if (!std::isfinite(d) || std::fabs(d) > double(kMaxBoundInt))
      unsupported(path, "bounds beyond 18 integer digits are not supported");
    std::string text;
    if (v.is_number_integer()) {
      text = v.dump();
    } else {
      char buf[512];
      auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::fixed);
      text.assign(buf, r.ptr);
    }
    const bool neg = !text.empty() && text[0] == '-';
    if (neg) text.erase(0, 1);
    const size_t dot = text.find('.');
    const std::string ip = text.substr(0, dot);
    std::string fp = dot == std::string::npos ? "" : text.substr(dot + 1);
    Scaled m = 0;
    for (char c : ip) m = m * 10 + (c - '0');
    Scaled f = 0;
    for (int i = 0; i < kMaxFractionDigits; ++i) f = f * 10 + (i < int(fp.size()) ? fp[i] - '0' : 0);
    bool inexact = false;
    for (size_t i = kMaxFractionDigits; i < fp.size(); ++i) inexact |= fp[i] != '0';
    if (m > kMaxBoundInt) unsupported(path, "bounds beyond 18 integer digits are not supported");
    m = m * kScale + f;
    Scaled r = neg ? -m : m;
    // Truncation moved r towards zero; step into the range if that left it.
    if (inexact && lower && !neg) r += 1;
    if (inexact && !lower && neg) r -= 1;
    return r;
  }

  // [lo, hi] scaled from minimum/maximum/exclusiveMinimum/exclusiveMaximum
  // (numbers; draft-4 booleans modify minimum/maximum). Unset: nullopt.
  void scaled_range(const json& s, const std::string& path, std::optional<Scaled>* lo, std::optional<Scaled>* hi) {
    auto tighten = [](std::optional<Scaled>* b, Scaled v, bool lower) {
      if (!*b || (lower ? v > **b : v < **b)) *b = v;
    };
    const bool ex_min_flag = s.contains("exclusiveMinimum") && s["exclusiveMinimum"].is_boolean() &&
                             s["exclusiveMinimum"].get<bool>();
    const bool ex_max_flag = s.contains("exclusiveMaximum") && s["exclusiveMaximum"].is_boolean() &&
                             s["exclusiveMaximum"].get<bool>();
    if (s.contains("minimum")) {
      const Scaled v = scaled_bound(s["minimum"], true, path + "/minimum");
      tighten(lo, ex_min_flag ? v + 1 : v, true);
    }
    if (s.contains("maximum")) {
      const Scaled v = scaled_bound(s["maximum"], false, path + "/maximum");
      tighten(hi, ex_max_flag ? v - 1 : v, false);
    }
    if (s.contains("exclusiveMinimum") && !s["exclusiveMinimum"].is_boolean())
      tighten(lo, scaled_bound(s["exclusiveMinimum"], true, path + "/exclusiveMinimum") + 1, true);
    if (s.contains("exclusiveMaximum") && !s["exclusiveMaximum"].is_boolean())
      tighten(hi, scaled_bound(s["exclusiveMaximum"], false, path + "/exclusiveMaximum") - 1, false);
  }

  static int n_digits(int64_t v) {
    int n = 1;
    while (v >= 10) v /= 10, ++n;
    return n;
  }
  static int64_t pow10(int n) {
    int64_t p = 1;
    while (n-- > 0) p *= 10;
    return p;
  }
  static Scaled floor_div(Scaled a, Scaled b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
  static Scaled ceil_div(Scaled a, Scaled b) { return -floor_div(-a, b); }

  int32_t digit_range(char lo, char hi, int32_t next) {
    ByteSet set;
    set.add_range(uint8_t(lo), uint8_t(hi));
    return b_.byte_of(set, next);
  }
  // Exactly n digits, then next.
  int32_t any_digits(int n, int32_t next) {
    for (int i = 0; i < n; ++i) next = digit_range('0', '9', next);
    return next;
  }
  // Digit strings of xs's length between xs and ys (equal lengths, xs <= ys):
  // the first digit splits the interval into its bounded ends and a middle
  // where every later digit is free.
  int32_t same_length_range(std::string_view xs, std::string_view ys, int32_t next) {
    if (xs.empty()) return next;
    if (xs[0] == ys[0]) return b_.literal(xs.substr(0, 1), same_length_range(xs.substr(1), ys.substr(1), next));
    const size_t rest = xs.size() - 1;
    const bool lo_free = xs.substr(1).find_first_not_of('0') == std::string_view::npos;
    const bool hi_free = ys.substr(1).find_first_not_of('9') == std::string_view::npos;
    char lo_d = xs[0], hi_d = ys[0];
    std::vector<int32_t> starts;
    if (!lo_free) {
      const std::string nines(rest, '9');
      starts.push_back(b_.literal(xs.substr(0, 1), same_length_range(xs.substr(1), nines, next)));
      ++lo_d;
    }
    if (!hi_free) {
      const std::string zeros(rest, '0');
      starts.push_back(b_.literal(ys.substr(0, 1), same_length_range(zeros, ys.substr(1), next)));
      --hi_d;
    }
    if (lo_d <= hi_d) starts.push_back(digit_range(lo_d, hi_d, any_digits(int(rest), next)));
    return b_.alt(starts);
  }
  // The canonical decimal forms (no leading zeros) of the integers in [a, b], 0 <= a <= b.
  int32_t unsigned_range(int64_t a, int64_t b, int32_t next) {
    std::vector<int32_t> starts;
    for (int len = n_digits(a); len <= n_digits(b); ++len) {
      const int64_t x = std::max(a, len == 1 ? 0 : pow10(len - 1));
      const int64_t y = std::min(b, pow10(len) - 1);
      if (x <= y) starts.push_back(same_length_range(std::to_string(x), std::to_string(y), next));
    }
    return b_.alt(starts);
  }
  // Integers in [lo, hi] ("-0" is not one).
  int32_t integer_range(int64_t lo, int64_t hi, int32_t next) {
    std::vector<int32_t> starts;
    if (lo < 0) starts.push_back(b_.literal("-", unsigned_range(std::max<int64_t>(-hi, 1), -lo, next)));
    if (hi >= 0) starts.push_back(unsigned_range(std::max<int64_t>(lo, 0), hi, next));
    return b_.alt(starts);
  }

  // Fraction digit strings D (at most k digits) compared as 0.D with the
  // trimmed digit strings lo / hi; need_one: D must not be empty (it follows
  // a '.'). kind: 'g' 0.D >= lo, 'l' 0.D <= hi, 'b' both, 'a' any.
  int32_t fraction(char kind, std::string_view lo, std::string_view hi, int k, bool need_one, int32_t next) {
    if (kind == 'b' && lo.empty()) kind = 'l';
    if (kind == 'g' && lo.empty()) kind = 'a';
    std::vector<int32_t> starts;
    const bool empty_ok = !need_one && (kind == 'a' || kind == 'l');
    if (empty_ok) starts.push_back(next);
    if (k > 0) {
      const char lo0 = (kind == 'g' || kind == 'b') ? lo[0] : '0';
      const char hi0 = (kind == 'l' || kind == 'b') ? (hi.empty() ? '0' : hi[0]) : '9';
      auto tail = [&](char sub, std::string_view l, std::string_view h) { return fraction(sub, l, h, k - 1, false, next); };
      const std::string_view lo_rest = lo.empty() ? lo : lo.substr(1);
      const std::string_view hi_rest = hi.empty() ? hi : hi.substr(1);
      const bool lo_tight = kind == 'g' || kind == 'b';
      const bool hi_tight = kind == 'l' || kind == 'b';
      if (lo_tight && hi_tight && lo0 == hi0) {
        starts.push_back(digit_range(lo0, lo0, tail('b', lo_rest, hi_rest)));
      } else {
        char a = lo0, z = hi0;
        if (lo_tight) starts.push_back(digit_range(lo0, lo0, tail('g', lo_rest, {}))), ++a;
        if (hi_tight && !(hi.empty())) starts.push_back(digit_range(hi0, hi0, tail('l', {}, hi_rest))), --z;
        else if (hi_tight) starts.push_back(digit_range('0', '0', tail('l', {}, {}))), --z;  // hi = 0: zeros only
        if (a <= z) starts.push_back(digit_range(a, z, tail('a', {}, {})));
      }
    }
    return b_.alt(starts);
  }
  // An optional ".digits" part whose value as 0.D satisfies kind/lo/hi.
  int32_t fraction_part(char kind, std::string_view lo, std::string_view hi, int32_t next) {
    if (kind == 'b' && lo.empty()) kind = 'l';
    if (kind == 'g' && lo.empty()) kind = 'a';
    const bool empty_ok = kind == 'a' || kind == 'l';
    const int32_t alts[2] = {empty_ok ? next : kEmpty,
                             b_.literal(".", fraction(kind, lo, hi, fraction_digits_, true, next))};
    return b_.alt(alts);
  }
  static std::string fraction_digits(Scaled v) {  // v % kScale as trimmed digits
    std::string f(kMaxFractionDigits, '0');
    int64_t r = int64_t(v % kScale);
    for (int i = kMaxFractionDigits - 1; i >= 0; --i) f[i] = char('0' + r % 10), r /= 10;
    while (!f.empty() && f.back() == '0') f.pop_back();
    return f;
  }
  // Plain decimals (no exponent) whose value lies in [a, b], scaled, 0 <= a <= b.
  int32_t magnitude_range(Scaled a, Scaled b, int32_t next) {
    const int64_t ai = int64_t(a / kScale), bi = int64_t(b / kScale);
    const std::string af = fraction_digits(a), bf = fraction_digits(b);
    if (ai == bi) return unsigned_range(ai, ai, fraction_part('b', af, bf, next));
    std::vector<int32_t> starts;
    starts.push_back(unsigned_range(ai, ai, fraction_part('g', af, {}, next)));
    if (ai + 1 <= bi - 1) starts.push_back(unsigned_range(ai + 1, bi - 1, fraction_part('a', {}, {}, next)));
    starts.push_back(unsigned_range(bi, bi, fraction_part('l', {}, bf, next)));
    return b_.alt(starts);
  }

  // multipleOf m on an integer type: integral m over a range of at most
  // kMaxEnumeratedRange multiples is enumerated; m = 1 changes nothing.
  int64_t integer_multiple(const json& s, const std::string& path) {
    if (!s.contains("multipleOf")) return 1;
    const json& m = s["multipleOf"];
    if (!m.is_number() || !(m.get<double>() > 0)) invalid(path + "/multipleOf", "must be a number above 0");
    const double d = m.get<double>();
    if (d != std::floor(d) || d > double(kMaxBoundInt))
      unsupported(path + "/multipleOf", "multipleOf is supported only as a whole number on an integer");
    return int64_t(d);
  }

  int32_t integer(const json& s, const std::string& path, int32_t next) {
    std::optional<Scaled> slo, shi;
    scaled_range(s, path, &slo, &shi);
    const int64_t cap = pow10(kMaxIntegerDigits) - 1;  // an unbounded side: at most 15 digits
    int64_t lo = slo ? int64_t(ceil_div(*slo, kScale)) : 0;
    int64_t hi = shi ? int64_t(floor_div(*shi, kScale)) : 0;
    if (!slo) lo = -std::max(cap, shi && hi < 0 ? pow10(n_digits(-hi)) - 1 : cap);
    if (!shi) hi = std::max(cap, lo > 0 ? pow10(n_digits(lo)) - 1 : cap);
    if (hi < lo) invalid(path, "maximum is below minimum: no integer fits");
    const int64_t m = integer_multiple(s, path);
    if (m == 1) return integer_range(lo, hi, next);
    const int64_t first = int64_t(ceil_div(lo, m)), last = int64_t(floor_div(hi, m));
    if (!slo || !shi || last - first + 1 > kMaxEnumeratedRange)
      unsupported(path + "/multipleOf", str_cat("multipleOf is supported only with minimum and maximum at most ",
                                                kMaxEnumeratedRange, " multiples apart"));
    if (last < first) invalid(path + "/multipleOf", "no multiple of multipleOf lies between minimum and maximum");
    std::vector<int32_t> starts;
    for (int64_t k = first; k <= last; ++k) starts.push_back(b_.literal(std::to_string(k * m), next));
    return b_.alt(starts);
  }

  int32_t number_type(const json& s, const std::string& path, int32_t next) {
    int digits = kMaxFractionDigits;
    if (s.contains("multipleOf")) {
      const json& m = s["multipleOf"];
      if (!m.is_number() || !(m.get<double>() > 0)) invalid(path + "/multipleOf", "must be a number above 0");
      if (m.get<double>() == 1) return integer(s, path, next);  // a number that is a multiple of 1 is an integer
      // 0.1, 0.01, ...: at most that many fraction digits.
      digits = 0;
      for (int k = 1; k <= kMaxFractionDigits && !digits; ++k)
        if (std::fabs(m.get<double>() * double(pow10(k)) - 1) < 1e-9) digits = k;
      if (!digits)
        unsupported(path + "/multipleOf", "a number's multipleOf is supported only as 1, 0.1, 0.01, ... (down to 1e-15)");
    }
    std::optional<Scaled> lo, hi;
    scaled_range(s, path, &lo, &hi);
    if (!lo && !hi && digits == kMaxFractionDigits) return number(next, true);
    if (!lo && !hi) lo = -(Scaled(pow10(kMaxIntegerDigits)) * kScale - 1);  // an exponent is no multiple: plain decimals
    struct Digits {  // fraction_part's digit limit while this number is built
      int* d;
      int old;
      ~Digits() { *d = old; }
    } restore{&fraction_digits_, fraction_digits_};
    fraction_digits_ = digits;
    // Bounded numbers are plain decimals (no exponent), so that the range is exact.
    const Scaled cap = Scaled(pow10(kMaxIntegerDigits)) * kScale - 1;
    auto widen = [&](Scaled v) {  // an unbounded side reaches as many digits as the other bound has
      const Scaled mag = v < 0 ? -v : v;
      return std::max(cap, Scaled(pow10(n_digits(int64_t(mag / kScale)))) * kScale - 1);
    };
    const Scaled l = lo ? *lo : -widen(*hi);
    const Scaled h = hi ? *hi : widen(*lo);
    if (h < l) invalid(path, "maximum is below minimum: no number fits");
    std::vector<int32_t> starts;
    if (l < 0) starts.push_back(b_.literal("-", magnitude_range(std::max<Scaled>(-h, 1), -l, next)));
    if (h >= 0) starts.push_back(magnitude_range(std::max<Scaled>(l, 0), h, next));
    return b_.alt(starts);
  }

  int32_t string_type(const json& s, const std::string& path, int32_t next) {
    const bool has_len = s.contains("minLength") || s.contains("maxLength");
    if (s.contains("pattern")) {
      if (has_len || s.contains("format"))
        unsupported(path + "/pattern", "pattern together with minLength/maxLength or format is not supported");
      if (!s["pattern"].is_string()) invalid(path + "/pattern", "must be a string");
      return regex_string(s["pattern"].get<std::string>(), next, path + "/pattern");
    }
    if (s.contains("format")) {
      if (has_len) unsupported(path + "/format", "format together with minLength/maxLength is not supported");
      const std::string f = s["format"].is_string() ? s["format"].get<std::string>() : "";
      static const std::string date = "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])";
      static const std::string time = "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])";
      static const std::string label = "[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?";
      static const std::string octet = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";
      std::string re;
      if (f == "date") re = date;
      else if (f == "time") re = time;
      else if (f == "date-time") re = date + "T" + time;
      else if (f == "email") re = "[a-z0-9]([a-z0-9._+-]{0,20}[a-z0-9])?@" + label + "(\\." + label + "){0,2}\\.[a-z]{2,6}";
      else if (f == "uuid") re = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}";
      else if (f == "ipv4") re = "(" + octet + "\\.){3}" + octet;
      else unsupported(path + "/format", "format '" + f + "' is not supported (date, time, date-time, email, uuid, ipv4 are)");
      return regex_string(re, next, path + "/format");
    }
    int64_t min_len = 0, max_len = -1;
    if (s.contains("minLength")) min_len = s["minLength"].get<int64_t>();
    if (s.contains("maxLength")) max_len = s["maxLength"].get<int64_t>();
    return any_string(min_len, max_len, next, path + "/maxLength");
  }

  int32_t object_type(const json& s, const std::string& path, int32_t next) {
    const json* props = s.contains("properties") ? &s["properties"] : nullptr;
    if (props && !props->is_object()) invalid(path + "/properties", "must be an object");
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) invalid(path + "/required", "must be a list of property names");
      for (const auto& r : s["required"]) {
        if (!r.is_string()) invalid(path + "/required", "must be a list of property names");
        if (!props || !props->contains(r.get<std::string>()))
          unsupported(path + "/required", "required property '" + r.get<std::string>() +
                                              "' is not listed in properties (only listed properties can be generated)");
        required.insert(r.get<std::string>());
      }
    }
    const json* extra = s.contains("additionalProperties") ? &s["additionalProperties"] : nullptr;
    const bool no_props = !props || props->empty();
    if (no_props) {
      if (extra && extra->is_boolean() && !extra->get<bool>()) return b_.literal("{", ws(b_.literal("}", next)));
      if (extra && !extra->is_boolean()) {
        auto member = [&](int32_t n) { return any_string(0, -1, colon(value(*extra, path + "/additionalProperties", n)), "key"); };
        return list("{", "}", member, 0, -1, next, path);
      }
      return any_object(depth_, next);
    }
    if (extra && !(extra->is_boolean() && !extra->get<bool>()))
      unsupported(path + "/additionalProperties",
                  "additionalProperties other than false is supported only for objects without 'properties'");
    // T[i]: the rest after at least one property, from property i on;
    // H[i]: the first emitted property is i or a later one.
    std::vector<std::string> names;
    for (auto it = props->begin(); it != props->end(); ++it) names.push_back(it.key());
    const size_t n = names.size();
    const int32_t close = ws(b_.literal("}", next));
    int32_t t = close, h = close;
    for (size_t i = n; i-- > 0;) {
      const bool optional = !required.count(names[i]);
      const std::string key = json(names[i]).dump();
      const int32_t p = b_.literal(key, colon(value((*props)[names[i]], path + "/properties/" + names[i], t)));
      const int32_t t_alts[2] = {comma(p), optional ? t : kEmpty};
      const int32_t h_alts[2] = {p, optional ? h : kEmpty};
      t = b_.alt(t_alts);
      h = b_.alt(h_alts);
      if (p == kEmpty && !optional) return kEmpty;
    }
    return b_.literal("{", ws(h));
  }

  int32_t array_type(const json& s, const std::string& path, int32_t next) {
    if (s.contains("uniqueItems") && s["uniqueItems"].is_boolean() && s["uniqueItems"].get<bool>())
      unsupported(path + "/uniqueItems", "uniqueItems true is not supported");
    int64_t min = s.contains("minItems") ? s["minItems"].get<int64_t>() : 0;
    int64_t max = s.contains("maxItems") ? s["maxItems"].get<int64_t>() : -1;
    const json any = true;
    const json& items = s.contains("items") ? s["items"] : any;
    if (items.is_array()) unsupported(path + "/items", "a list of item schemas (tuple validation) is not supported");
    return list("[", "]", [&](int32_t nx) { return value(items, path + "/items", nx); }, min, max, next, path + "/maxItems");
  }

  int32_t typed(const std::string& type, const json& s, const std::string& path, int32_t next) {
    if (type == "string") return string_type(s, path, next);
    if (type == "integer") return integer(s, path, next);
    if (type == "number") return number_type(s, path, next);
    if (type == "boolean") {
      const int32_t a[2] = {b_.literal("true", next), b_.literal("false", next)};
      return b_.alt(a);
    }
    if (type == "null") return b_.literal("null", next);
    if (type == "object") {
      Nest nest(this, path);
      return object_type(s, path, next);
    }
    if (type == "array") {
      Nest nest(this, path);
      return array_type(s, path, next);
    }
    invalid(path + "/type", "unknown type '" + type + "'");
  }

  struct Nest {
    Converter* c;
    Nest(Converter* conv, const std::string& path) : c(conv) {
      if (++c->depth_ > kMaxSchemaNesting) c->unsupported(path, "the schema nests too deeply");
    }
    ~Nest() { --c->depth_; }
  };

  int32_t value(const json& s, const std::string& path, int32_t next) {
    if (next == kEmpty) return kEmpty;
    // Every schema walk recurses here: through $ref chains over many
    // definitions and anyOf inside anyOf too, which Nest does not count.
    struct Walk {
      int* n;
      Walk(int* count, Converter* c, const std::string& p) : n(count) {
        if (++*n > kMaxSchemaWalk) c->unsupported(p, str_cat("the schema nests more than ", kMaxSchemaWalk,
                                                             " subschemas deep (through $ref, anyOf, properties, items)"));
      }
      ~Walk() { --*n; }
    } walk(&walk_depth_, this, path);
    if (s.is_boolean()) return s.get<bool>() ? any_value(depth_, next) : kEmpty;
    if (!s.is_object()) invalid(path, "a schema must be an object or a boolean");
    for (auto it = s.begin(); it != s.end(); ++it)
      if (!handled_keywords().count(it.key()) && !annotation_keywords().count(it.key()))
        unsupported(path, "the keyword '" + it.key() + "' is not supported");
    auto only = [&](const char* kw) {
      for (auto it = s.begin(); it != s.end(); ++it)
        if (it.key() != kw && !annotation_keywords().count(it.key()))
          unsupported(path, std::string("'") + kw + "' together with '" + it.key() + "' is not supported");
    };
    if (s.contains("$ref")) {
      only("$ref");
      const std::string ref = s["$ref"].is_string() ? s["$ref"].get<std::string>() : "";
      int& count = ref_depth_[ref];
      if (count >= o_.max_depth) return kEmpty;
      ++count;
      const int32_t r = value(resolve(ref, path), ref, next);
      --count;
      return r;
    }
    if (s.contains("anyOf") || s.contains("allOf")) {
      const char* kw = s.contains("anyOf") ? "anyOf" : "allOf";
      only(kw);
      const json& list = s[kw];
      if (!list.is_array() || list.empty()) invalid(path + "/" + kw, "must be a non-empty list of schemas");
      if (std::string(kw) == "allOf" && list.size() != 1)
        unsupported(path + "/allOf", "allOf with more than one schema is not supported");
      std::vector<int32_t> starts;
      for (size_t i = 0; i < list.size(); ++i)
        starts.push_back(value(list[i], path + "/" + kw + "/" + std::to_string(i), next));
      return b_.alt(starts);
    }
    if (s.contains("const")) return literal_value(s["const"], next);
    if (s.contains("enum")) {
      if (!s["enum"].is_array() || s["enum"].empty()) invalid(path + "/enum", "must be a non-empty list");
      std::vector<int32_t> starts;
      for (const auto& v : s["enum"]) starts.push_back(literal_value(v, next));
      return b_.alt(starts);
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const json& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array()) {
        for (const auto& x : t) {
          if (!x.is_string()) invalid(path + "/type", "must be a type name or a list of them");
          types.push_back(x.get<std::string>());
        }
      } else {
        invalid(path + "/type", "must be a type name or a list of them");
      }
    } else if (s.contains("properties") || s.contains("additionalProperties")) {
      types.push_back("object");
    } else if (s.contains("items")) {
      types.push_back("array");
    } else {
      return any_value(depth_, next);
    }
    std::vector<int32_t> starts;
    for (const auto& t : types) starts.push_back(typed(t, s, path, next));
    return b_.alt(starts);
  }

  int depth_ = 0;
  int walk_depth_ = 0;  // value() calls open
  int fraction_digits_ = kMaxFractionDigits;  // a number's fraction digits at most (multipleOf 10^-k)

 private:
  NfaBuilder& b_;
  const json& root_;
  JsonOptions o_;
  std::map<std::string, int> ref_depth_;
};

}  // namespace

int32_t json_schema_fragment(NfaBuilder& builder, const json& schema, const JsonOptions& options, int32_t next) {
  Converter c(builder, schema, options);
  try {
    return c.value(schema, "#", next);
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorCode::kInvalidArgument, "JSON schema: a keyword has a value of the wrong type (", e.what(), ")");
  }
}

int32_t json_object_fragment(NfaBuilder& builder, const JsonOptions& options, int32_t next) {
  const json empty = json::object();
  Converter c(builder, empty, options);
  return c.any_object(0, next);
}

int32_t json_literal_fragment(NfaBuilder& builder, const json& value, const JsonOptions& options, int32_t next) {
  const json empty = json::object();
  Converter c(builder, empty, options);
  return c.literal_value(value, next);
}

}  // namespace shardlm::grammar
