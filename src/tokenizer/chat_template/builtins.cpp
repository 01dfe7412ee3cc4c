// Filters, tests, str/dict/list methods and globals, each following the
// CPython / jinja2 3.1 behaviour it is named after.
#include <algorithm>
#include <ctime>
#include <functional>
#include <unordered_map>

#include <utf8proc.h>

#include "core/error.h"
#include "tokenizer/chat_template/interpreter.h"

namespace shardlm::chat_template {
namespace {

using Fn = std::function<Value(Interpreter&, const Value&, const CallArgs&)>;

Value arg_or(const CallArgs& args, size_t i, std::string_view name, Value fallback) {
  const Value* v = args.get(i, name);
  return v ? *v : std::move(fallback);
}

const std::string& need_string(Interpreter& in, const Value& v, const char* what) {
  in.check_defined(v);
  if (!v.is_string()) in.error(str_cat(what, " must be a string, found ", v.type_name()));
  return v.as_string();
}

int64_t need_int(Interpreter& in, const Value& v, const char* what) {
  in.check_defined(v);
  if (!(v.is_int() || v.is_bool())) in.error(str_cat(what, " must be an integer, found ", v.type_name()));
  return v.as_int();
}

// ---- string helpers (code-point based like Python's str) ----

// Python's full (SpecialCasing) mappings that differ from the simple one-code-point mapping.
const char* special_upper(char32_t c) {
  switch (c) {
    case 0xDF: return "SS";
    case 0xFB00: return "FF";
    case 0xFB01: return "FI";
    case 0xFB02: return "FL";
    case 0xFB03: return "FFI";
    case 0xFB04: return "FFL";
    case 0xFB05:
    case 0xFB06: return "ST";
    case 0x149: return "\u02BCN";
    default: return nullptr;
  }
}

const char* special_title(char32_t c) {
  switch (c) {
    case 0xDF: return "Ss";
    case 0xFB00: return "Ff";
    case 0xFB01: return "Fi";
    case 0xFB02: return "Fl";
    case 0xFB03: return "Ffi";
    case 0xFB04: return "Ffl";
    case 0xFB05:
    case 0xFB06: return "St";
    case 0x149: return "\u02BCN";
    default: return nullptr;
  }
}

std::string map_case(const std::string& s, bool upper) {
  if (is_ascii(s)) {
    std::string out = s;
    for (char& c : out) c = static_cast<char>(upper ? std::toupper(static_cast<unsigned char>(c))
                                                    : std::tolower(static_cast<unsigned char>(c)));
    return out;
  }
  std::string out;
  for (char32_t c : utf8_decode(s)) {
    if (upper && special_upper(c)) {
      out += special_upper(c);
    } else if (!upper && c == 0x130) {
      out += "i\u0307";
    } else {
      utf8_append(out, static_cast<char32_t>(upper ? utf8proc_toupper(static_cast<utf8proc_int32_t>(c))
                                                   : utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
    }
  }
  return out;
}

char32_t upper_cp(char32_t c) { return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c))); }
char32_t lower_cp(char32_t c) { return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))); }
char32_t title_cp(char32_t c) { return static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(c))); }
bool is_cased(char32_t c) {
  utf8proc_category_t cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  if (cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT) return true;
  return upper_cp(c) != c || lower_cp(c) != c || title_cp(c) != c;
}

// str.title(): a cased character after an uncased one is title-cased, the rest lower-cased.
void append_title(std::string& out, char32_t c) {
  if (const char* t = special_title(c)) out += t;
  else utf8_append(out, title_cp(c));
}

void append_lower(std::string& out, char32_t c) {
  if (c == 0x130) out += "i\u0307";
  else utf8_append(out, lower_cp(c));
}

std::string py_title(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  for (char32_t c : utf8_decode(s)) {
    bool cased = is_cased(c);
    if (prev_cased) append_lower(out, c);
    else append_title(out, c);
    prev_cased = cased;
  }
  return out;
}

std::string py_capitalize(const std::string& s) {
  std::string out;
  bool first = true;
  for (char32_t c : utf8_decode(s)) {
    if (first) append_title(out, c);
    else append_lower(out, c);
    first = false;
  }
  return out;
}

// jinja2's title filter: words start after runs of - whitespace ( { [ <; each word is
// word[0].upper() + word[1:].lower().
std::string jinja_title(const std::string& s) {
  std::string out;
  bool at_word_start = true;
  for (char32_t c : utf8_decode(s)) {
    bool sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || is_python_space(c);
    if (sep) {
      utf8_append(out, c);
      at_word_start = true;
      continue;
    }
    std::string one;
    utf8_append(one, c);
    out += map_case(one, at_word_start);
    at_word_start = false;
  }
  return out;
}

// Start of the UTF-8 sequence that ends just before byte `end`.
size_t prev_start(const std::string& s, size_t end) {
  size_t p = end - 1;
  while (p > 0 && (static_cast<unsigned char>(s[p]) & 0xC0) == 0x80 && end - p < 4) --p;
  return p;
}

std::string py_strip(Interpreter& in, const std::string& s, const Value* chars, bool left, bool right) {
  std::u32string set;
  bool whitespace = !chars || chars->is_none() || chars->is_undefined();
  if (whitespace) {  // fast path without decoding the whole string
    size_t b = 0, e = s.size();
    while (left && b < e) {
      unsigned char c = static_cast<unsigned char>(s[b]);
      size_t len = c < 0xC0 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
      std::u32string cp = utf8_decode(s.substr(b, std::min(len, e - b)));
      if (cp.size() != 1 || !is_python_space(cp[0])) break;
      b += std::min(len, e - b);
    }
    while (right && e > b) {
      size_t p = prev_start(s, e);
      std::u32string cp = utf8_decode(s.substr(p, e - p));
      if (cp.size() != 1 || !is_python_space(cp[0])) break;
      e = p;
    }
    return s.substr(b, e - b);
  }
  if (!whitespace) set = utf8_decode(need_string(in, *chars, "strip characters"));
  auto strip_me = [&](char32_t c) { return whitespace ? is_python_space(c) : set.find(c) != std::u32string::npos; };
  std::u32string u = utf8_decode(s);
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && strip_me(u[b])) ++b;
  if (right)
    while (e > b && strip_me(u[e - 1])) --e;
  return utf8_encode(u.substr(b, e - b));
}

// The parts s splits into, counted before any is built: a 16 MiB string of
// separators would make 16 M strings (Limits::max_list_items).
void check_split_count(Interpreter& in, const std::string& s, const Value* sep_v, int64_t maxsplit) {
  size_t n = 1;
  if (!sep_v || sep_v->is_none()) {
    for (size_t i = 1; i < s.size(); ++i) n += is_python_space(static_cast<unsigned char>(s[i - 1])) && !is_python_space(static_cast<unsigned char>(s[i]));
  } else if (sep_v->is_string() && !sep_v->as_string().empty()) {
    const std::string& sep = sep_v->as_string();
    for (size_t p = s.find(sep); p != std::string::npos; p = s.find(sep, p + sep.size())) ++n;
  }
  if (maxsplit >= 0) n = std::min<size_t>(n, static_cast<size_t>(maxsplit) + 1);
  in.check_items(n);
}

std::vector<Value> py_split(Interpreter& in, const std::string& s, const Value* sep_v, int64_t maxsplit,
                            bool from_right) {
  check_split_count(in, s, sep_v, maxsplit);
  std::vector<std::string> parts;
  if (!sep_v || sep_v->is_none()) {
    std::u32string u = utf8_decode(s);
    if (from_right) std::reverse(u.begin(), u.end());
    size_t i = 0;
    int64_t n_splits = 0;
    while (true) {
      while (i < u.size() && is_python_space(u[i])) ++i;
      if (i >= u.size()) break;
      if (maxsplit >= 0 && n_splits == maxsplit) {
        parts.push_back(utf8_encode(u.substr(i)));  // the rest keeps its trailing whitespace
        break;
      }
      size_t j = i;
      while (j < u.size() && !is_python_space(u[j])) ++j;
      parts.push_back(utf8_encode(u.substr(i, j - i)));
      ++n_splits;
      i = j;
    }
    if (from_right) {
      std::reverse(parts.begin(), parts.end());
      for (auto& p : parts) {
        std::u32string w = utf8_decode(p);
        std::reverse(w.begin(), w.end());
        p = utf8_encode(w);
      }
    }
  } else {
    const std::string& sep = need_string(in, *sep_v, "split separator");
    if (sep.empty()) in.error("empty separator");
    if (!from_right) {
      size_t start = 0;
      int64_t n_splits = 0;
      while (maxsplit < 0 || n_splits < maxsplit) {
        size_t p = s.find(sep, start);
        if (p == std::string::npos) break;
        parts.push_back(s.substr(start, p - start));
        start = p + sep.size();
        ++n_splits;
      }
      parts.push_back(s.substr(start));
    } else {
      size_t end = s.size();
      int64_t n_splits = 0;
      while (maxsplit < 0 || n_splits < maxsplit) {
        if (end < sep.size()) break;
        size_t p = s.rfind(sep, end - sep.size());
        if (p == std::string::npos) break;
        parts.push_back(s.substr(p + sep.size(), end - p - sep.size()));
        end = p;
        ++n_splits;
      }
      parts.push_back(s.substr(0, end));
      std::reverse(parts.begin(), parts.end());
    }
  }
  std::vector<Value> out;
  out.reserve(parts.size());
  for (auto& p : parts) out.emplace_back(std::move(p));
  return out;
}

std::string py_replace(Interpreter& in, const std::string& s, const std::string& old, const std::string& repl,
                       int64_t count) {
  std::string out;
  if (old.empty()) {
    std::u32string u = utf8_decode(s);
    int64_t n = 0;
    for (size_t i = 0; i <= u.size(); ++i) {
      if (count < 0 || n < count) {
        out += repl;
        ++n;
      }
      if (i < u.size()) utf8_append(out, u[i]);
      in.check_size(out.size());
    }
    return out;
  }
  size_t start = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    size_t p = s.find(old, start);
    if (p == std::string::npos) break;
    out.append(s, start, p - start);
    out += repl;
    in.check_size(out.size());
    start = p + old.size();
    ++n;
  }
  out.append(s, start);
  in.check_size(out.size());
  return out;
}

size_t n_codepoints(const std::string& s) {
  size_t n = 0;
  for (char c : s)
    if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) ++n;
  return n;
}

// Code-point index of the byte offset `byte` in s.
int64_t cp_index(const std::string& s, size_t byte) { return static_cast<int64_t>(n_codepoints(s.substr(0, byte))); }

std::vector<std::string> py_splitlines(const std::string& s) {
  std::vector<std::string> lines;
  std::u32string u = utf8_decode(s);
  std::u32string cur;
  for (size_t i = 0; i < u.size(); ++i) {
    char32_t c = u[i];
    bool brk = c == '\n' || c == '\r' || c == '\v' || c == '\f' || c == 0x1C || c == 0x1D || c == 0x1E ||
               c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!brk) {
      cur += c;
      continue;
    }
    if (c == '\r' && i + 1 < u.size() && u[i + 1] == '\n') ++i;
    lines.push_back(utf8_encode(cur));
    cur.clear();
  }
  if (!cur.empty()) lines.push_back(utf8_encode(cur));
  return lines;
}

// str.format with {} / {0} / {name} fields and no format specs.
std::string py_format(Interpreter& in, const std::string& fmt, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') ++i;
      else in.error("str.format: single '}' encountered in format string");
      out += '}';
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    size_t close = fmt.find('}', i);
    if (close == std::string::npos) in.error("str.format: single '{' encountered in format string");
    std::string field = fmt.substr(i + 1, close - i - 1);
    if (field.find_first_of(":!.[") != std::string::npos)
      in.error("str.format: format specs, conversions and attribute fields are not supported: {" + field + "}");
    const Value* v = nullptr;
    if (field.empty()) {
      if (auto_index < args.positional.size()) v = &args.positional[auto_index];
      ++auto_index;
    } else if (std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
      if (field.size() > 9) in.error("str.format: field index {" + field.substr(0, 20) + "} is out of range");
      size_t k = std::stoul(field);
      if (k < args.positional.size()) v = &args.positional[k];
    } else {
      for (const auto& [name, val] : args.keyword)
        if (name == field) v = &val;
    }
    if (!v) in.error("str.format: no argument for field {" + field + "}");
    in.check_size(out.size() + (v->is_string() ? v->as_string().size() : 0));  // '{0}' * 8 .format(16 MiB)
    out += v->str();
    in.check_size(out.size());
    i = close;
  }
  return out;
}

std::string py_strftime(Interpreter& in, const std::string& fmt) {
  std::time_t t = in.now() ? *in.now() : std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  if (fmt.empty()) return "";
  std::vector<char> buf(256 + fmt.size() * 8);
  size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm);
  if (n == 0) in.error("strftime_now: format produced no output or is too long");
  return std::string(buf.data(), n);
}

// jinja2's make_attrgetter: "a.b.0" looks up each part with subscript semantics.
Value get_attribute_path(Interpreter& in, const Value& obj, const Value& attribute) {
  if (attribute.is_int()) return in.getitem(obj, attribute);
  const std::string& path = need_string(in, attribute, "attribute");
  Value cur = obj;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    cur = in.getitem(cur, numeric ? Value(static_cast<int64_t>(std::stoll(part))) : Value(part));
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

std::string json_indent(Interpreter& in, const Value& indent) {
  if (indent.is_string()) return indent.as_string();
  int64_t n = need_int(in, indent, "tojson indent");
  return std::string(static_cast<size_t>(std::max<int64_t>(0, std::min<int64_t>(n, 1024))), ' ');
}

// select / reject / selectattr / rejectattr
Value select_impl(Interpreter& in, const Value& seq, const CallArgs& args, bool by_attr, bool keep) {
  size_t first = 0;
  Value attribute;
  if (by_attr) {
    if (args.positional.empty()) in.error("selectattr/rejectattr need an attribute name");
    attribute = args.positional[0];
    first = 1;
  }
  std::string test;
  CallArgs test_args;
  if (args.positional.size() > first) {
    test = need_string(in, args.positional[first], "test name");
    test_args.positional.assign(args.positional.begin() + static_cast<long>(first) + 1, args.positional.end());
    test_args.keyword = args.keyword;
  }
  std::vector<Value> out;
  for (const Value& item : in.iterate(seq)) {
    Value v = by_attr ? get_attribute_path(in, item, attribute) : item;
    bool ok = test.empty() ? v.truthy() : apply_test(in, test, v, test_args);
    if (ok == keep) out.push_back(item);
  }
  return Value::list(std::move(out));
}

std::vector<Value> sorted_copy(Interpreter& in, std::vector<Value> items, bool reverse,
                               const std::function<Value(const Value&)>& key) {
  std::vector<Value> keys;
  for (const Value& v : items) keys.push_back(key(v));
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return reverse ? python_less(in, keys[b], keys[a]) : python_less(in, keys[a], keys[b]);
  });
  std::vector<Value> out;
  for (size_t i : order) out.push_back(items[i]);
  return out;
}

Value fold_case(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value(map_case(v.as_string(), false));
  return v;
}

const std::unordered_map<std::string, Fn>& filters() {
  static const std::unordered_map<std::string, Fn> table = [] {
    std::unordered_map<std::string, Fn> f;
    f["default"] = [](Interpreter&, const Value& v, const CallArgs& a) {
      Value fallback = arg_or(a, 0, "default_value", Value(""));
      bool boolean = arg_or(a, 1, "boolean", Value(false)).truthy();
      return (v.is_undefined() || (boolean && !v.truthy())) ? fallback : v;
    };
    f["d"] = f["default"];
    f["length"] = [](Interpreter& in, const Value& v, const CallArgs&) {
      if (v.is_undefined()) return Value(0);
      if (v.is_string()) return Value(static_cast<int64_t>(n_codepoints(v.as_string())));
      if (v.is_list()) return Value(static_cast<int64_t>(v.as_list()->items.size()));
      if (v.is_dict() && !v.as_dict()->is_namespace) return Value(static_cast<int64_t>(v.as_dict()->items.size()));
      in.error(str_cat("object of type '", v.type_name(), "' has no len()"));
    };
    f["count"] = f["length"];
    f["first"] = [](Interpreter& in, const Value& v, const CallArgs&) {
      std::vector<Value> items = in.iterate(v);
      return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
    };
    f["last"] = [](Interpreter& in, const Value& v, const CallArgs&) {
      std::vector<Value> items = in.iterate(v);
      return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
    };
    f["join"] = [](Interpreter& in, const Value& v, const CallArgs& a) {
      std::string sep = arg_or(a, 0, "d", Value("")).str();
      const Value* attribute = a.get(1, "attribute");
      std::string out;
      bool first = true;
      for (const Value& item : in.iterate(v)) {
        if (!first) out += sep;
        first = false;
        out += (attribute && !attribute->is_none() ? get_attribute_path(in, item, *attribute) : item).str();
        in.check_size(out.size());
      }
      return Value(std::move(out));
    };
    f["upper"] = [](Interpreter&, const Value& v, const CallArgs&) { return Value(map_case(v.str(), true)); };
    f["lower"] = [](Interpreter&, const Value& v, const CallArgs&) { return Value(map_case(v.str(), false)); };
    f["capitalize"] = [](Interpreter&, const Value& v, const CallArgs&) { return Value(py_capitalize(v.str())); };
    f["title"] = [](Interpreter&, const Value& v, const CallArgs&) { return Value(jinja_title(v.str())); };
    f["trim"] = [](Interpreter& in, const Value& v, const CallArgs& a) {
      return Value(py_strip(in, v.str(), a.get(0, "chars"), true, true));
    };
    f["replace"] = [](Interpreter& in, const Value& v, const CallArgs& a) {
      const Value* old = a.get(0, "old");
      const Value* repl = a.get(1, "new");
      if (!old || !repl) in.error("replace filter needs old and new strings");
      const Value* count = a.get(2, "count");
      int64_t n = count && !count->is_none() ? need_int(in, *count, "replace count") : -1;
      return Value(py_replace(in, v.str(), old->str(), repl->str(), n));
    };
    f["string"] = [](Interpreter&, const Value& v, const CallArgs&) { return Value(v.str()); };
    // markupsafe.escape; autoescaping is off in transformers, so only an explicit |e escapes.
    f["escape"] = [](Interpreter& in, const Value& v, const CallArgs&) {
      std::string out;
      const std::string text = v.str();
      // Each of &<>"' grows by at most 4 bytes: checked before building.
      in.check_size(text.size() + 4 * static_cast<size_t>(std::count_if(text.begin(), text.end(), [](char c) {
                      return c == '&' || c == '<' || c == '>' || c == '"' || c == '\'';
                    })));
      for (char c : text) {
        switch (c) {
          case '&': out += "&amp;"; break;
          case '<': out += "&lt;"; break;
          case '>': out += "&gt;"; break;
          case '"': out += "&#34;"; break;
          case '\'': out += "&#39;"; break;
          default: out += c;
        }
      }
      return Value(std::move(out));
    };
    f["e"] = f["escape"];
    f["safe"] = f["string"];
    f["list"] = [](Interpreter& in, const Value& v, const CallArgs&) { return Value::list(in.iterate(v)); };
    f["int"] = [](Interpreter& in, const Value& v, const CallArgs& a) {
      Value fallback = arg_or(a, 0, "default", Value(0));
      int base = static_cast<int>(need_int(in, arg_or(a, 1, "base", Value(10)), "int base"));
      if (v.is_int() || v.is_bool()) return Value(v.as_int());
      if (v.is_float()) {
        double d = v.as_double();
        if (!(d > -9.2e18 && d < 9.2e18)) return fallback;
        return Value(static_cast<int64_t>(d));
      }
      if (v.is_string()) {
        std::string s = py_strip(in, v.as_string(), nullptr, true, true);
        s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
        if (!s.empty()) {
          char* end = nullptr;
          errno = 0;
          long long x = std::strtoll(s.c_str(), &end, base);
          if (errno == 0 && end && *end == 0) return Value(static_cast<int64_t>(x));
          double d = std::strtod(s.c_str(), &end);
          if (end && *end == 0 && d > -9.2e18 && d < 9.2e18) return Value(static_cast<int64_t>(d));
        }
      }
      return fallback;
    };
    f["float"] = [](Interpreter& in, const Value& v, const CallArgs& a) {
      Value fallback = arg_or(a, 0, "default", Value(0.0));
      if (v.is_number()) return Value(v.as_double());
      if (v.is_string()) {
        std::string s = py_strip(in, v.as_string(), nullptr, true, true);
        char* end = nullptr;
        double d = std::strtod(s.c_str(), &end);
        if (!s.empty() && end && *end == 0) return Value(d);
      }
      return fallback;
    };
    f["abs"] = [](Interpreter& in, const Value& v, const CallArgs&) {
      in.check_defined(v);
      if (v.is_float()) return Value(std::abs(v.as_double()));
      if (v.is_number()) {
        if (v.as_int() == INT64_MIN) in.error("integer overflow");
        return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
      }
      in.error(str_cat("bad operand type for abs(): '", v.type_name(), "'"));
    };
    f["items"] = [](Interpreter& in, const Value& v, const CallArgs&) {
      if (v.is_undefined()) return Value::list({});
      if (!v.is_dict() || v.as_dict()->is_namespace) in.error("Can only get item pairs from a mapping.");
      std::vector<Value> out;
      for (const auto& [k, val] : v.as_dict()->items) out.push_back(Value::list({Value(k), val}, true));
      return Value::list(std::move(out));
    };
    f["dictsort"] = [](Interpreter& in, const Value& v, const CallArgs& a) {
      if (!v.is_dict() || v.as_dict()->is_namespace) in.error("dictsort needs a mapping");
      bool case_sensitive = arg_or(a, 0, "case_sensitive", Value(false)).truthy();
      std::string by = arg_or(a, 1, "by", Value("key")).str();
      bool reverse = arg_or(a, 2, "reverse", Value(false)).truthy();
      if (by != "key" && by != "value") in.error("You can only sort by either \"key\" or \"value\"");
      std::vector<Value> pairs;
      for (const auto& [k, val] : v.as_dict()->items) pairs.push_back(Value::list({Value(k), val}, true));
      size_t pos = by == "key" ? 0 : 1;
      return Value::list(sorted_copy(in, std::move(pairs), reverse, [&](const Value& p) {
        return fold_case(p.as_list()->items[pos], case_sensitive);
      }));
    };
    f["sort"] = [](Interpreter& in, const Value& v, const CallArgs& a) {
      bool reverse = arg_or(a, 0, "reverse", Value(false)).truthy();
      bool case_sensitive = arg_or(a, 1, "case_sensitive", Value(false)).truthy();
      Value attribute = arg_or(a, 2, "attribute", Value::none());
      return Value::list(sorted_copy(in, in.iterate(v), reverse, [&](const Value& x) {
        return fold_case(attribute.is_none() ? x : get_attribute_path(in, x, attribute), case_sensitive);
      }));
    };
    f["reverse"] = [](Interpreter& in, const Value& v, const CallArgs&) {
      if (v.is_string()) {
        std::u32string u = utf8_decode(v.as_string());
        std::reverse(u.begin(), u.end());
        return Value(utf8_encode(u));
      }
      std::vector<Value> items = in.iterate(v);
      std::reverse(items.begin(), items.end());
      return Value::list(std::move(items));
    };
    f["select"] = [](Interpreter& in, const Value& v, const CallArgs& a) { return select_impl(in, v, a, false, true); };
    f["reject"] = [](Interpreter& in, const Value& v, const CallArgs& a) { return select_impl(in, v, a, false, false); };
    f["selectattr"] = [](Interpreter& in, const Value& v, const CallArgs& a) { return select_impl(in, v, a, true, true); };
    f["rejectattr"] = [](Interpreter& in, const Value& v, const CallArgs& a) { return select_impl(in, v, a, true, false); };
    f["map"] = [](Interpreter& in, const Value& v, const CallArgs& a) {
      std::vector<Value> out;
      if (a.positional.empty()) {
        const Value* attribute = a.get(99, "attribute");
        if (!attribute) in.error("map needs a filter name or attribute=");
        const Value* fallback = a.get(99, "default");
        for (const Value& item : in.iterate(v)) {
          Value x = get_attribute_path(in, item, *attribute);
          out.push_back(x.is_undefined() && fallback ? *fallback : x);
        }
      } else {
        std::string name = need_string(in, a.positional[0], "map filter name");
        CallArgs rest;
        rest.positional.assign(a.positional.begin() + 1, a.positional.end());
        rest.keyword = a.keyword;
        for (const Value& item : in.iterate(v)) out.push_back(apply_filter(in, name, item, rest));
      }
      return Value::list(std::move(out));
    };
    f["unique"] = [](Interpreter& in, const Value& v, const CallArgs& a) {
      bool case_sensitive = arg_or(a, 0, "case_sensitive", Value(false)).truthy();
      std::vector<Value> out, seen;
      for (const Value& item : in.iterate(v)) {
        Value key = fold_case(item, case_sensitive);
        in.count_steps(seen.size());  // quadratic: a million items would take 10^12 comparisons
        if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return values_equal(s, key); })) {
          seen.push_back(key);
          out.push_back(item);
        }
      }
      return Value::list(std::move(out));
    };
    f["sum"] = [](Interpreter& in, const Value& v, const CallArgs& a) {
      const Value* attribute = a.get(0, "attribute");
      Value total = arg_or(a, 1, "start", Value(0));
      for (const Value& item : in.iterate(v)) {
        Value x = attribute && !attribute->is_none() ? get_attribute_path(in, item, *attribute) : item;
        in.check_defined(x);
        if (!x.is_number() || !total.is_number()) in.error("sum filter needs numbers");
        if (total.is_float() || x.is_float()) total = Value(total.as_double() + x.as_double());
        else total = Value(total.as_int() + x.as_int());
      }
      return total;
    };
    auto minmax = [](bool want_max) {
      return [want_max](Interpreter& in, const Value& v, const CallArgs& a) {
        bool case_sensitive = arg_or(a, 0, "case_sensitive", Value(false)).truthy();
        Value attribute = arg_or(a, 1, "attribute", Value::none());
        std::vector<Value> items = in.iterate(v);
        if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
        size_t best = 0;
        auto key = [&](const Value& x) {
          return fold_case(attribute.is_none() ? x : get_attribute_path(in, x, attribute), case_sensitive);
        };
        for (size_t i = 1; i < items.size(); ++i) {
          bool better = want_max ? python_less(in, key(items[best]), key(items[i]))
                                 : python_less(in, key(items[i]), key(items[best]));
          if (better) best = i;
        }
        return items[best];
      };
    };
    f["max"] = minmax(true);
    f["min"] = minmax(false);
    f["attr"] = [](Interpreter& in, const Value& v, const CallArgs& a) {
      const Value* name = a.get(0, "name");
      if (!name) in.error("attr filter needs a name");
      return in.getattr(v, need_string(in, *name, "attribute name"));
    };
    f["indent"] = [](Interpreter& in, const Value& v, const CallArgs& a) {
      Value width = arg_or(a, 0, "width", Value(4));
      bool first = arg_or(a, 1, "first", Value(false)).truthy();
      bool blank = arg_or(a, 2, "blank", Value(false)).truthy();
      std::string pad = width.is_string() ? width.as_string()
                                          : std::string(static_cast<size_t>(std::clamp<int64_t>(
                                                            need_int(in, width, "indent width"), 0, 1024)),
                                                        ' ');
      std::vector<std::string> lines = py_splitlines(v.str() + "\n");
      std::string out;
      for (size_t i = 0; i < lines.size(); ++i) {
        if (i > 0) {
          out += "\n";
          if (blank || !lines[i].empty()) out += pad;
        }
        out += lines[i];
        in.check_size(out.size());
      }
      if (first) out = pad + out;
      return Value(std::move(out));
    };
    // transformers' tojson: json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
    f["tojson"] = [](Interpreter& in, const Value& v, const CallArgs& a) {
      JsonDumpOptions o;
      o.ensure_ascii = arg_or(a, 0, "ensure_ascii", Value(false)).truthy();
      Value indent = arg_or(a, 1, "indent", Value::none());
      if (!indent.is_none()) o.indent = json_indent(in, indent);
      Value seps = arg_or(a, 2, "separators", Value::none());
      if (!seps.is_none()) {
        if (!seps.is_list() || seps.as_list()->items.size() != 2)
          in.error("tojson separators must be an (item_separator, key_separator) pair");
        o.separators = std::make_pair(need_string(in, seps.as_list()->items[0], "separator"),
                                      need_string(in, seps.as_list()->items[1], "separator"));
      }
      o.sort_keys = arg_or(a, 3, "sort_keys", Value(false)).truthy();
      in.check_defined(v);
      std::string out = json_dumps(v, o);
      in.check_size(out.size());
      return Value(std::move(out));
    };
    return f;
  }();
  return table;
}

using TestFn = std::function<bool(Interpreter&, const Value&, const CallArgs&)>;

const Value& test_arg(Interpreter& in, const CallArgs& a, const char* test) {
  if (a.positional.empty()) in.error(str_cat("test '", test, "' needs an argument"));
  return a.positional[0];
}

const std::unordered_map<std::string, TestFn>& tests() {
  static const std::unordered_map<std::string, TestFn> table = [] {
    std::unordered_map<std::string, TestFn> t;
    t["defined"] = [](Interpreter&, const Value& v, const CallArgs&) { return !v.is_undefined(); };
    t["undefined"] = [](Interpreter&, const Value& v, const CallArgs&) { return v.is_undefined(); };
    t["none"] = [](Interpreter&, const Value& v, const CallArgs&) { return v.is_none(); };
    t["boolean"] = [](Interpreter&, const Value& v, const CallArgs&) { return v.is_bool(); };
    t["true"] = [](Interpreter&, const Value& v, const CallArgs&) { return v.is_bool() && v.as_bool(); };
    t["false"] = [](Interpreter&, const Value& v, const CallArgs&) { return v.is_bool() && !v.as_bool(); };
    t["integer"] = [](Interpreter&, const Value& v, const CallArgs&) { return v.is_int(); };
    t["float"] = [](Interpreter&, const Value& v, const CallArgs&) { return v.is_float(); };
    t["number"] = [](Interpreter&, const Value& v, const CallArgs&) { return v.is_number(); };
    t["string"] = [](Interpreter&, const Value& v, const CallArgs&) { return v.is_string(); };
    t["mapping"] = [](Interpreter&, const Value& v, const CallArgs&) {
      return v.is_dict() && !v.as_dict()->is_namespace;
    };
    // Undefined is iterable (empty) and a sequence in jinja2, as it defines __iter__/__len__/__getitem__.
    t["iterable"] = [](Interpreter&, const Value& v, const CallArgs&) {
      return v.is_undefined() || v.is_string() || v.is_list() || (v.is_dict() && !v.as_dict()->is_namespace);
    };
    t["sequence"] = t["iterable"];
    t["callable"] = [](Interpreter&, const Value& v, const CallArgs&) { return v.is_callable(); };
    t["odd"] = [](Interpreter& in, const Value& v, const CallArgs&) { return need_int(in, v, "odd test value") % 2 != 0; };
    t["even"] = [](Interpreter& in, const Value& v, const CallArgs&) { return need_int(in, v, "even test value") % 2 == 0; };
    t["divisibleby"] = [](Interpreter& in, const Value& v, const CallArgs& a) {
      int64_t d = need_int(in, test_arg(in, a, "divisibleby"), "divisibleby argument");
      if (d == 0) in.error("integer division or modulo by zero");
      return need_int(in, v, "divisibleby value") % d == 0;
    };
    t["eq"] = [](Interpreter&, const Value& v, const CallArgs& a) {
      return !a.positional.empty() && values_equal(v, a.positional[0]);
    };
    t["equalto"] = t["eq"];
    t["=="] = t["eq"];
    t["ne"] = [](Interpreter& in, const Value& v, const CallArgs& a) { return !values_equal(v, test_arg(in, a, "ne")); };
    t["!="] = t["ne"];
    t["lt"] = [](Interpreter& in, const Value& v, const CallArgs& a) { return python_less(in, v, test_arg(in, a, "lt")); };
    t["<"] = t["lt"];
    t["lessthan"] = t["lt"];
    t["gt"] = [](Interpreter& in, const Value& v, const CallArgs& a) { return python_less(in, test_arg(in, a, "gt"), v); };
    t[">"] = t["gt"];
    t["greaterthan"] = t["gt"];
    t["le"] = [](Interpreter& in, const Value& v, const CallArgs& a) {
      const Value& o = test_arg(in, a, "le");
      return python_less(in, v, o) || values_equal(v, o);
    };
    t["<="] = t["le"];
    t["ge"] = [](Interpreter& in, const Value& v, const CallArgs& a) {
      const Value& o = test_arg(in, a, "ge");
      return python_less(in, o, v) || values_equal(v, o);
    };
    t[">="] = t["ge"];
    t["in"] = [](Interpreter& in, const Value& v, const CallArgs& a) {
      const Value& seq = test_arg(in, a, "in");
      if (seq.is_string()) return v.is_string() && seq.as_string().find(v.as_string()) != std::string::npos;
      if (seq.is_dict()) return v.is_string() && seq.as_dict()->find(v.as_string()) != nullptr;
      for (const Value& x : in.iterate(seq))
        if (values_equal(v, x)) return true;
      return false;
    };
    t["sameas"] = [](Interpreter& in, const Value& v, const CallArgs& a) {
      const Value& o = test_arg(in, a, "sameas");
      if (v.kind() != o.kind()) return false;
      if (v.is_list()) return v.as_list() == o.as_list();
      if (v.is_dict()) return v.as_dict() == o.as_dict();
      return values_equal(v, o);
    };
    t["lower"] = [](Interpreter&, const Value& v, const CallArgs&) {
      std::string s = v.str();
      return map_case(s, false) == s && map_case(s, true) != s;
    };
    t["upper"] = [](Interpreter&, const Value& v, const CallArgs&) {
      std::string s = v.str();
      return map_case(s, true) == s && map_case(s, false) != s;
    };
    t["filter"] = [](Interpreter& in, const Value& v, const CallArgs&) {
      return v.is_string() && filters().count(v.as_string()) > 0;
    };
    t["test"] = [](Interpreter&, const Value& v, const CallArgs&) { return v.is_string() && tests().count(v.as_string()) > 0; };
    return t;
  }();
  return table;
}

Value string_method(Interpreter& in, const std::string& s, const std::string& name, const CallArgs& a) {
  auto affix = [&](bool prefix) {
    const Value* p = a.get(0, "prefix");
    if (!p) in.error(str_cat("str.", name, "() takes at least 1 argument"));
    std::vector<Value> options = p->is_list() ? p->as_list()->items : std::vector<Value>{*p};
    for (const Value& o : options) {
      const std::string& x = need_string(in, o, "startswith/endswith argument");
      if (x.size() <= s.size() && (prefix ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0))
        return Value(true);
    }
    return Value(false);
  };
  if (name == "startswith") return affix(true);
  if (name == "endswith") return affix(false);
  if (name == "strip") return Value(py_strip(in, s, a.get(0, "chars"), true, true));
  if (name == "lstrip") return Value(py_strip(in, s, a.get(0, "chars"), true, false));
  if (name == "rstrip") return Value(py_strip(in, s, a.get(0, "chars"), false, true));
  if (name == "split" || name == "rsplit") {
    int64_t maxsplit = need_int(in, arg_or(a, 1, "maxsplit", Value(-1)), "maxsplit");
    return Value::list(py_split(in, s, a.get(0, "sep"), maxsplit, name == "rsplit"));
  }
  if (name == "splitlines") {
    in.check_items(static_cast<size_t>(std::count_if(s.begin(), s.end(), [](char c) {
                     return c == '\n' || c == '\r' || c == '\v' || c == '\f' || (c >= 0x1C && c <= 0x1E);
                   })) + 1);
    std::vector<Value> out;
    for (auto& l : py_splitlines(s)) out.emplace_back(std::move(l));
    return Value::list(std::move(out));
  }
  if (name == "replace") {
    const Value* old = a.get(0, "old");
    const Value* repl = a.get(1, "new");
    if (!old || !repl) in.error("str.replace() needs old and new");
    int64_t count = need_int(in, arg_or(a, 2, "count", Value(-1)), "replace count");
    return Value(py_replace(in, s, need_string(in, *old, "replace old"), need_string(in, *repl, "replace new"), count));
  }
  if (name == "upper") return Value(map_case(s, true));
  if (name == "lower") return Value(map_case(s, false));
  if (name == "title") return Value(py_title(s));
  if (name == "capitalize") return Value(py_capitalize(s));
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    const Value* sub_v = a.get(0, "sub");
    if (!sub_v) in.error(str_cat("str.", name, "() takes at least 1 argument"));
    const std::string& sub = need_string(in, *sub_v, "substring");
    if (a.positional.size() > 1) in.error(str_cat("str.", name, "(): start/end arguments are not supported"));
    if (name == "count") {
      if (sub.empty()) return Value(static_cast<int64_t>(n_codepoints(s) + 1));
      int64_t n = 0;
      for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
      return Value(n);
    }
    size_t p = (name == "find" || name == "index") ? s.find(sub) : s.rfind(sub);
    if (p == std::string::npos) {
      if (name == "index" || name == "rindex") in.error("substring not found");
      return Value(-1);
    }
    return Value(cp_index(s, p));
  }
  if (name == "join") {
    const Value* items = a.get(0, "iterable");
    if (!items) in.error("str.join() takes exactly one argument");
    std::string out;
    bool first = true;
    for (const Value& item : in.iterate(*items)) {
      if (!first) out += s;
      first = false;
      out += need_string(in, item, "str.join() item");
      in.check_size(out.size());
    }
    return Value(std::move(out));
  }
  if (name == "format") return Value(py_format(in, s, a));
  if (name == "removeprefix" || name == "removesuffix") {
    const std::string& x = need_string(in, arg_or(a, 0, "prefix", Value("")), "affix");
    if (name == "removeprefix" && s.compare(0, x.size(), x) == 0) return Value(s.substr(x.size()));
    if (name == "removesuffix" && !x.empty() && x.size() <= s.size() && s.compare(s.size() - x.size(), x.size(), x) == 0)
      return Value(s.substr(0, s.size() - x.size()));
    return Value(s);
  }
  auto all_cp = [&](const std::function<bool(char32_t)>& pred) {
    std::u32string u = utf8_decode(s);
    return Value(!u.empty() && std::all_of(u.begin(), u.end(), pred));
  };
  if (name == "isspace") return all_cp(is_python_space);
  if (name == "isdigit") return all_cp([](char32_t c) { return c >= '0' && c <= '9'; });
  if (name == "isalpha")
    return all_cp([](char32_t c) { return c < 0x80 ? std::isalpha(static_cast<int>(c)) != 0 : is_cased(c); });
  if (name == "isalnum")
    return all_cp([](char32_t c) { return c < 0x80 ? std::isalnum(static_cast<int>(c)) != 0 : is_cased(c); });
  if (name == "islower") return Value(map_case(s, false) == s && map_case(s, true) != s);
  if (name == "isupper") return Value(map_case(s, true) == s && map_case(s, false) != s);
  in.error("str." + name + "() is not supported");
}

bool is_string_method(const std::string& name) {
  static const char* kNames[] = {"startswith", "endswith", "strip", "lstrip", "rstrip", "split", "rsplit",
                                 "splitlines", "replace", "upper", "lower", "title", "capitalize", "find",
                                 "rfind", "index", "rindex", "count", "join", "format", "removeprefix",
                                 "removesuffix", "isspace", "isdigit", "isalpha", "isalnum", "islower", "isupper"};
  return std::any_of(std::begin(kNames), std::end(kNames), [&](const char* n) { return name == n; });
}

}  // namespace

Value apply_filter(Interpreter& in, const std::string& name, const Value& value, const CallArgs& args) {
  const auto& table = filters();
  auto it = table.find(name);
  if (it == table.end()) in.error("no filter named '" + name + "'");
  return it->second(in, value, args);
}

bool apply_test(Interpreter& in, const std::string& name, const Value& value, const CallArgs& args) {
  const auto& table = tests();
  auto it = table.find(name);
  if (it == table.end()) in.error("no test named '" + name + "'");
  return it->second(in, value, args);
}

Value bound_method(Interpreter& in, const Value& obj, const std::string& name) {
  if (obj.is_string() && is_string_method(name)) {
    return Value::callable("str." + name, [obj, name](Interpreter& in2, const CallArgs& a) {
      return string_method(in2, obj.as_string(), name, a);
    });
  }
  if (obj.is_dict() && !obj.as_dict()->is_namespace) {
    auto d = obj.as_dict();
    if (name == "items" || name == "keys" || name == "values") {
      return Value::callable("dict." + name, [d, name](Interpreter&, const CallArgs&) {
        std::vector<Value> out;
        for (const auto& [k, v] : d->items)
          out.push_back(name == "keys" ? Value(k) : name == "values" ? v : Value::list({Value(k), v}, true));
        Value view = Value::list(std::move(out));
        view.as_list()->view = name == "keys" ? "dict_keys" : name == "values" ? "dict_values" : "dict_items";
        return view;
      });
    }
    if (name == "get") {
      return Value::callable("dict.get", [d](Interpreter& in2, const CallArgs& a) {
        const Value* key = a.get(0, "key");
        if (!key) in2.error("dict.get() takes at least 1 argument");
        const Value* v = key->is_string() ? d->find(key->as_string()) : nullptr;
        return v ? *v : arg_or(a, 1, "default", Value::none());
      });
    }
  }
  if (obj.is_list() && (name == "index" || name == "count")) {
    auto l = obj.as_list();
    return Value::callable("list." + name, [l, name](Interpreter& in2, const CallArgs& a) {
      if (a.positional.size() != 1) in2.error("list." + name + "() takes exactly one argument");
      int64_t n = 0;
      for (size_t i = 0; i < l->items.size(); ++i) {
        if (!values_equal(l->items[i], a.positional[0])) continue;
        if (name == "index") return Value(static_cast<int64_t>(i));
        ++n;
      }
      if (name == "index") in2.error("list.index(x): x not in list");
      return Value(n);
    });
  }
  (void)in;
  return Value::undefined("no method '" + name + "'");
}

void add_globals(std::unordered_map<std::string, Value>& vars) {
  vars["range"] = Value::callable("range", [](Interpreter& in, const CallArgs& a) {
    if (a.positional.empty() || a.positional.size() > 3) in.error("range expected 1 to 3 integer arguments");
    int64_t start = 0, stop, step = 1;
    if (a.positional.size() == 1) {
      stop = need_int(in, a.positional[0], "range argument");
    } else {
      start = need_int(in, a.positional[0], "range start");
      stop = need_int(in, a.positional[1], "range stop");
      if (a.positional.size() == 3) step = need_int(in, a.positional[2], "range step");
    }
    if (step == 0) in.error("range() arg 3 must not be zero");
    std::vector<Value> out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      // jinja2's sandbox refuses ranges over MAX_RANGE = 100000 items
      if (out.size() >= 100000) in.error("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
      out.emplace_back(i);
    }
    return Value::list(std::move(out));
  });
  vars["namespace"] = Value::callable("namespace", [](Interpreter& in, const CallArgs& a) {
    auto d = std::make_shared<Dict>();
    d->is_namespace = true;
    for (const Value& p : a.positional) {
      if (!p.is_dict()) in.error("namespace() positional arguments must be mappings");
      for (const auto& [k, v] : p.as_dict()->items) d->set(k, v);
    }
    for (const auto& [k, v] : a.keyword) d->set(k, v);
    in.track_namespace(d);
    return Value(d);
  });
  vars["dict"] = Value::callable("dict", [](Interpreter& in, const CallArgs& a) {
    auto d = std::make_shared<Dict>();
    for (const Value& p : a.positional) {
      if (!p.is_dict()) in.error("dict() positional arguments must be mappings here");
      for (const auto& [k, v] : p.as_dict()->items) d->set(k, v);
    }
    for (const auto& [k, v] : a.keyword) d->set(k, v);
    return Value(d);
  });
  vars["raise_exception"] = Value::callable("raise_exception", [](Interpreter& in, const CallArgs& a) -> Value {
    in.error("raise_exception: " + (a.positional.empty() ? std::string() : a.positional[0].str()));
  });
  vars["strftime_now"] = Value::callable("strftime_now", [](Interpreter& in, const CallArgs& a) {
    const Value* fmt = a.get(0, "format");
    if (!fmt) in.error("strftime_now() needs a format string");
    return Value(py_strftime(in, need_string(in, *fmt, "strftime_now format")));
  });
}

}  // namespace shardlm::chat_template
