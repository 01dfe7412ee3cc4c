#include "tokenizer/chat_template/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace shardlm::chat_template {

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

Value* Dict::find(std::string_view key) {
  for (auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

namespace {
thread_local size_t t_max_string_bytes = SIZE_MAX;  // StringLimit's
}  // namespace

StringLimit::StringLimit(size_t max_bytes) : saved_(t_max_string_bytes) { t_max_string_bytes = max_bytes; }
StringLimit::~StringLimit() { t_max_string_bytes = saved_; }

void StringLimit::check(size_t n_bytes) {
  if (n_bytes > t_max_string_bytes)
    fail(ErrorCode::kInvalidArgument, "chat template: output or string exceeds the limit of ", t_max_string_bytes,
         " bytes (serve --chat-template-max-bytes)");
}

namespace {

void check_depth(uint32_t depth) {
  if (depth > kMaxValueDepth)
    fail(ErrorCode::kInvalidArgument, "chat template: values nest deeper than ", kMaxValueDepth, " levels");
}

}  // namespace

uint32_t Value::depth() const {
  if (is_list()) return as_list()->depth;
  if (is_dict()) return as_dict()->depth;
  return 0;
}

void Dict::set(const std::string& key, Value value) {
  depth = std::max(depth, value.depth() + 1);
  check_depth(depth);
  if (Value* v = find(key))
    *v = std::move(value);
  else
    items.emplace_back(key, std::move(value));
}

const Value* CallArgs::get(size_t index, std::string_view name) const {
  if (index < positional.size()) return &positional[index];
  for (const auto& [k, v] : keyword)
    if (k == name) return &v;
  return nullptr;
}

Value Value::list(std::vector<Value> items, bool is_tuple) {
  auto l = std::make_shared<List>();
  for (const Value& v : items) l->depth = std::max(l->depth, v.depth() + 1);
  check_depth(l->depth);
  l->items = std::move(items);
  l->is_tuple = is_tuple;
  return Value(std::move(l));
}

Value Value::dict() { return Value(std::make_shared<Dict>()); }

Value Value::callable(std::string name, std::function<Value(Interpreter&, const CallArgs&)> fn) {
  auto c = std::make_shared<Callable>();
  c->name = std::move(name);
  c->fn = std::move(fn);
  return Value(std::move(c));
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  thread_local uint32_t n_open = 0;  // recursion depth, checked before descending
  struct Open {
    Open() {
      if (++n_open > kMaxValueDepth + 1) {
        n_open = 0;
        fail(ErrorCode::kInvalidArgument, "chat template context: JSON nests deeper than ", kMaxValueDepth,
             " levels");
      }
    }
    ~Open() {
      if (n_open > 0) --n_open;
    }
  } open;
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX))
        fail(ErrorCode::kInvalidArgument, "chat template context: integer ", u,
             " does not fit in 64 bits; pass it as a string");
      return Value(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e));
      return list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      auto d = std::make_shared<Dict>();
      d->items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) {
        d->items.emplace_back(it.key(), from_json(it.value()));
        d->depth = std::max(d->depth, d->items.back().second.depth() + 1);
        check_depth(d->depth);
      }
      return Value(std::move(d));
    }
    default:
      fail(ErrorCode::kInvalidArgument, "chat template context: unsupported JSON value of type ", j.type_name(),
           "; use null, bool, number, string, array or object");
  }
}

int64_t Value::as_int() const {
  if (is_bool()) return as_bool() ? 1 : 0;
  return std::get<int64_t>(data_);
}

double Value::as_double() const {
  if (is_float()) return std::get<double>(data_);
  return static_cast<double>(as_int());
}

bool Value::truthy() const {
  switch (kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return as_bool();
    case Kind::kInt:
      return as_int() != 0;
    case Kind::kFloat:
      return as_double() != 0.0;
    case Kind::kString:
      return !as_string().empty();
    case Kind::kList:
      return !as_list()->items.empty();
    case Kind::kDict:
      return as_dict()->is_namespace || !as_dict()->items.empty();
    case Kind::kCallable:
      return true;
  }
  return false;
}

const char* Value::type_name() const {
  switch (kind()) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return as_list()->is_tuple ? "tuple" : "list";
    case Kind::kDict: return as_dict()->is_namespace ? "Namespace" : "dict";
    case Kind::kCallable: return "function";
  }
  return "?";
}

std::string Value::str() const {
  switch (kind()) {
    case Kind::kUndefined: return "";
    case Kind::kString: return as_string();
    default: return repr();
  }
}

namespace {
thread_local int repr_depth = 0;  // namespaces can hold themselves: bound the recursion
}

std::string Value::repr() const {
  struct Guard {
    Guard() {
      if (++repr_depth > static_cast<int>(kMaxValueDepth)) {
        --repr_depth;
        fail(ErrorCode::kInvalidArgument, "chat template: cannot print a value nested deeper than ",
             kMaxValueDepth, " levels (a namespace that contains itself?)");
      }
    }
    ~Guard() { --repr_depth; }
  } guard;
  switch (kind()) {
    case Kind::kUndefined: return "";
    case Kind::kNone: return "None";
    case Kind::kBool: return as_bool() ? "True" : "False";
    case Kind::kInt: return std::to_string(as_int());
    case Kind::kFloat: return python_float_repr(as_double());
    case Kind::kString:
      StringLimit::check(as_string().size());  // a repr is at least as long (4x for \x escapes: checked by the caller)
      return python_string_repr(as_string());
    case Kind::kList: {
      const List& l = *as_list();
      std::string out = l.is_tuple ? "(" : "[";
      for (size_t i = 0; i < l.items.size(); ++i) {
        if (i) out += ", ";
        out += l.items[i].repr();
        StringLimit::check(out.size());
      }
      if (l.is_tuple && l.items.size() == 1) out += ",";
      out += l.is_tuple ? ")" : "]";
      if (l.view) return std::string(l.view) + "(" + out + ")";
      return out;
    }
    case Kind::kDict: {
      const Dict& d = *as_dict();
      std::string out = d.is_namespace ? "<Namespace {" : "{";
      for (size_t i = 0; i < d.items.size(); ++i) {
        if (i) out += ", ";
        out += python_string_repr(d.items[i].first) + ": " + d.items[i].second.repr();
        StringLimit::check(out.size());
      }
      out += d.is_namespace ? "}>" : "}";
      return out;
    }
    case Kind::kCallable: return "<function " + as_callable()->name + ">";
  }
  return "";
}

bool values_equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.as_string() == b.as_string();
    case Value::Kind::kList: {
      const auto& x = a.as_list()->items;
      const auto& y = b.as_list()->items;
      if (a.as_list()->is_tuple != b.as_list()->is_tuple || x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i)
        if (!values_equal(x[i], y[i])) return false;
      return true;
    }
    case Value::Kind::kDict: {
      const Dict& x = *a.as_dict();
      const Dict& y = *b.as_dict();
      if (x.is_namespace || y.is_namespace) return &x == &y;
      if (x.items.size() != y.items.size()) return false;
      for (const auto& [k, v] : x.items) {
        const Value* w = y.find(k);
        if (!w || !values_equal(v, *w)) return false;
      }
      return true;
    }
    case Value::Kind::kCallable:
      return a.as_callable() == b.as_callable();
    default:
      return false;
  }
}

std::string python_float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), x, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // e.g. -1.2345e+02, shortest round-trip digits
  bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  size_t e_pos = sci.find('e');
  std::string digits = sci.substr(0, e_pos);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  int exponent = std::stoi(sci.substr(e_pos + 1));
  std::string out = negative ? "-" : "";
  if (exponent < -4 || exponent >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char e[16];
    std::snprintf(e, sizeof(e), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    return out + e;
  }
  if (exponent >= 0) {
    size_t n_int = static_cast<size_t>(exponent) + 1;
    if (digits.size() <= n_int) return out + digits + std::string(n_int - digits.size(), '0') + ".0";
    return out + digits.substr(0, n_int) + "." + digits.substr(n_int);
  }
  return out + "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
}

namespace {

// Decodes one code point at s[i] and advances i; a malformed byte is taken as is.
char32_t decode_at(std::string_view s, size_t& i) {
  unsigned char c = static_cast<unsigned char>(s[i]);
  if (c < 0xC0) {
    ++i;
    return c;
  }
  int n = c < 0xE0 ? 1 : c < 0xF0 ? 2 : 3;
  char32_t cp = c & (0x3F >> n);
  for (int k = 1; k <= n; ++k) {
    if (i + k >= s.size() || (static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) {
      ++i;
      return c;
    }
    cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  }
  i += n + 1;
  return cp;
}

void append_json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      size_t start = i;
      char32_t cp = decode_at(s, i);
      if (!ensure_ascii) {
        out.append(s.substr(start, i - start));
      } else {
        char buf[16];
        if (cp >= 0x10000) {
          char32_t v = cp - 0x10000;
          std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", 0xD800 + static_cast<unsigned>(v >> 10),
                        0xDC00 + static_cast<unsigned>(v & 0x3FF));
        } else {
          std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(cp));
        }
        out += buf;
      }
      continue;
    }
    ++i;
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20 || (ensure_ascii && c == 0x7f)) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

void dump_json(std::string& out, const Value& v, const JsonDumpOptions& o, const std::string& item_sep,
               const std::string& key_sep, int depth) {
  if (depth > 512) fail(ErrorCode::kInvalidArgument, "chat template: tojson nesting deeper than 512");
  auto newline = [&](int level) {
    out += '\n';
    for (int k = 0; k < level; ++k) out += *o.indent;
  };
  switch (v.kind()) {
    case Value::Kind::kNone: out += "null"; return;
    case Value::Kind::kBool: out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::kInt: out += std::to_string(v.as_int()); return;
    case Value::Kind::kFloat: {
      double x = v.as_double();
      if (std::isnan(x)) out += "NaN";
      else if (std::isinf(x)) out += x > 0 ? "Infinity" : "-Infinity";
      else out += python_float_repr(x);
      return;
    }
    case Value::Kind::kString:
      StringLimit::check(out.size() + v.as_string().size());
      append_json_string(out, v.as_string(), o.ensure_ascii);
      return;
    case Value::Kind::kList: {
      const auto& items = v.as_list()->items;
      if (items.empty()) { out += "[]"; return; }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += item_sep;
        if (o.indent) newline(depth + 1);
        dump_json(out, items[i], o, item_sep, key_sep, depth + 1);
        StringLimit::check(out.size());
      }
      if (o.indent) newline(depth);
      out += ']';
      return;
    }
    case Value::Kind::kDict: {
      const Dict& d = *v.as_dict();
      if (d.is_namespace) break;
      if (d.items.empty()) { out += "{}"; return; }
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& e : d.items) entries.push_back(&e);
      if (o.sort_keys)
        std::stable_sort(entries.begin(), entries.end(), [](auto* a, auto* b) {
          return utf8_decode(a->first) < utf8_decode(b->first);
        });
      out += '{';
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i) out += item_sep;
        if (o.indent) newline(depth + 1);
        append_json_string(out, entries[i]->first, o.ensure_ascii);
        out += key_sep;
        dump_json(out, entries[i]->second, o, item_sep, key_sep, depth + 1);
        StringLimit::check(out.size());
      }
      if (o.indent) newline(depth);
      out += '}';
      return;
    }
    default: break;
  }
  fail(ErrorCode::kInvalidArgument, "chat template: tojson: Object of type ", v.type_name(),
       " is not JSON serializable");
}

}  // namespace

std::string json_dumps(const Value& v, const JsonDumpOptions& options) {
  std::string item_sep = options.indent ? "," : ", ";
  std::string key_sep = ": ";
  if (options.separators) {
    item_sep = options.separators->first;
    key_sep = options.separators->second;
  }
  std::string out;
  dump_json(out, v, options, item_sep, key_sep, 0);
  return out;
}

std::u32string utf8_decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) out += decode_at(s, i);
  return out;
}

void utf8_append(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

std::string utf8_encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) utf8_append(out, c);
  return out;
}

bool is_ascii(std::string_view s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

bool is_python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

std::string python_string_repr(std::string_view s) {
  bool has_single = s.find('\'') != std::string_view::npos;
  bool has_double = s.find('"') != std::string_view::npos;
  char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  size_t i = 0;
  while (i < s.size()) {
    size_t start = i;
    char32_t c = decode_at(s, i);
    char buf[16];
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F || (c >= 0x80 && c < 0xA0) || c == 0xAD) {
      std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(c));
      out += buf;
    } else if (c == 0x2028 || c == 0x2029 || (c >= 0xD800 && c < 0xE000)) {
      std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out.append(s.substr(start, i - start));
    }
  }
  out += quote;
  return out;
}

}  // namespace shardlm::chat_template
