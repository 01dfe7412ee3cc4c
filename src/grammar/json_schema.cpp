#include "grammar/json_schema.h"

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
      "uniqueItems"};
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

  int32_t integer_digits(bool allow_negative, bool allow_zero, int32_t next) {
    std::string re = allow_zero ? "(0|[1-9][0-9]{0,14})" : "[1-9][0-9]{0,14}";
    static_assert(kMaxIntegerDigits == 15);
    if (allow_negative) re = "-?" + re;
    return compile_regex(b_, re, next);
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

  static double num(const json& v) { return v.get<double>(); }

  int32_t integer(const json& s, const std::string& path, int32_t next) {
    std::optional<double> lo, hi;
    if (s.contains("minimum")) lo = num(s["minimum"]);
    if (s.contains("exclusiveMinimum")) lo = std::floor(num(s["exclusiveMinimum"])) + 1;
    if (s.contains("maximum")) hi = num(s["maximum"]);
    if (s.contains("exclusiveMaximum")) hi = std::ceil(num(s["exclusiveMaximum"])) - 1;
    if (lo) lo = std::ceil(*lo);
    if (hi) hi = std::floor(*hi);
    if (lo && hi) {
      if (*hi < *lo) invalid(path, "maximum is below minimum: no integer fits");
      if (*hi - *lo + 1 <= double(kMaxEnumeratedRange)) {
        std::vector<int32_t> starts;
        for (int64_t v = int64_t(*lo); v <= int64_t(*hi); ++v) starts.push_back(b_.literal(std::to_string(v), next));
        return b_.alt(starts);
      }
    }
    if (hi) unsupported(path + "/maximum", "an integer maximum is supported only with a minimum less than " +
                                               std::to_string(kMaxEnumeratedRange) + " below it");
    if (!lo) return integer_digits(true, true, next);
    if (*lo == 0) return integer_digits(false, true, next);
    if (*lo == 1) return integer_digits(false, false, next);
    unsupported(path + "/minimum", "an integer minimum other than 0 or 1 is supported only with a maximum at most " +
                                       std::to_string(kMaxEnumeratedRange) + " above it");
  }

  int32_t number_type(const json& s, const std::string& path, int32_t next) {
    if (s.contains("maximum") || s.contains("exclusiveMaximum") || s.contains("exclusiveMinimum"))
      unsupported(path, "number maximum / exclusiveMinimum / exclusiveMaximum are not supported (minimum 0 is)");
    if (s.contains("minimum")) {
      if (num(s["minimum"]) != 0) unsupported(path + "/minimum", "a number minimum other than 0 is not supported");
      return number(next, false);
    }
    return number(next, true);
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
