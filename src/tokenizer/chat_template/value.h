// Values of the chat-template interpreter: the Python objects a Jinja template
// sees (None, bool, int, float, str, list/tuple, dict, callables) plus jinja2's
// Undefined. Dicts keep insertion order like Python's, so tojson reproduces the
// key order of the request.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace shardlm::chat_template {

class Value;
class Interpreter;

// Containers nest at most this deep: deeper values (from JSON input or built by a
// template) are refused before recursive printing or destruction could exhaust the stack.
constexpr uint32_t kMaxValueDepth = 512;

// While one is alive on this thread, repr(), str() of a container and
// json_dumps refuse to build a string longer than max_bytes (the render's
// Limits::max_output_bytes): a list of a million shared 16 MiB strings is
// cheap to build and would print as terabytes.
class StringLimit {
 public:
  explicit StringLimit(size_t max_bytes);
  ~StringLimit();
  StringLimit(const StringLimit&) = delete;
  StringLimit& operator=(const StringLimit&) = delete;
  static void check(size_t n_bytes);  // throws Error naming the limit when n_bytes is over it

 private:
  size_t saved_;
};

struct List {
  std::vector<Value> items;
  uint32_t depth = 1;           // 1 + the deepest child container
  bool is_tuple = false;        // only changes repr: (1, 2) vs [1, 2]
  const char* view = nullptr;   // "dict_items" etc.: the result of d.items(), repr dict_items([...])
};

struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  uint32_t depth = 1;  // maintained by set()
  bool is_namespace = false;  // jinja2 namespace(): the only object `set x.y = ...` may write

  const Value* find(std::string_view key) const;
  Value* find(std::string_view key);
  void set(const std::string& key, Value value);
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;

  // Python-style binding: argument `index` positionally or by `name`; nullptr if absent.
  const Value* get(size_t index, std::string_view name) const;
};

struct Callable {
  std::string name;
  std::function<Value(Interpreter&, const CallArgs&)> fn;
};

struct Undefined {
  std::string name;  // what was looked up, for the error message when it is used
};

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kCallable };

  Value() : data_(Undefined{}) {}
  static Value undefined(std::string name) { return Value(Undefined{std::move(name)}); }
  static Value none() { return Value(nullptr); }
  Value(bool b) : data_(b) {}
  Value(int v) : data_(int64_t{v}) {}
  Value(int64_t v) : data_(v) {}
  Value(double v) : data_(v) {}
  Value(std::string s) : data_(std::make_shared<const std::string>(std::move(s))) {}
  Value(const char* s) : data_(std::make_shared<const std::string>(s)) {}
  Value(std::shared_ptr<List> l) : data_(std::move(l)) {}
  Value(std::shared_ptr<Dict> d) : data_(std::move(d)) {}
  Value(std::shared_ptr<Callable> c) : data_(std::move(c)) {}
  static Value list(std::vector<Value> items, bool is_tuple = false);
  static Value dict();
  static Value callable(std::string name, std::function<Value(Interpreter&, const CallArgs&)> fn);
  static Value from_json(const nlohmann::ordered_json& j);

  Kind kind() const { return static_cast<Kind>(data_.index()); }
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_bool() const { return kind() == Kind::kBool; }
  bool is_int() const { return kind() == Kind::kInt; }
  bool is_float() const { return kind() == Kind::kFloat; }
  bool is_number() const { return is_bool() || is_int() || is_float(); }  // Python: bool is an int
  bool is_string() const { return kind() == Kind::kString; }
  bool is_list() const { return kind() == Kind::kList; }
  bool is_dict() const { return kind() == Kind::kDict; }
  bool is_callable() const { return kind() == Kind::kCallable; }

  bool as_bool() const { return std::get<bool>(data_); }
  int64_t as_int() const;  // bool or int
  double as_double() const;  // bool, int or float
  const std::string& as_string() const { return *std::get<std::shared_ptr<const std::string>>(data_); }
  const std::shared_ptr<List>& as_list() const { return std::get<std::shared_ptr<List>>(data_); }
  const std::shared_ptr<Dict>& as_dict() const { return std::get<std::shared_ptr<Dict>>(data_); }
  const std::shared_ptr<Callable>& as_callable() const { return std::get<std::shared_ptr<Callable>>(data_); }
  const std::string& undefined_name() const { return std::get<Undefined>(data_).name; }

  bool truthy() const;           // Python truthiness; Undefined is false
  std::string str() const;       // Python str(); Undefined prints as ""
  std::string repr() const;      // Python repr()
  uint32_t depth() const;        // 0 for scalars, else the container's depth
  const char* type_name() const;  // Python type name, for error messages

 private:
  explicit Value(Undefined u) : data_(std::move(u)) {}
  explicit Value(std::nullptr_t) : data_(nullptr) {}
  // Strings are shared, not copied: templates read the same message content many times.
  std::variant<Undefined, std::nullptr_t, bool, int64_t, double, std::shared_ptr<const std::string>,
               std::shared_ptr<List>, std::shared_ptr<Dict>, std::shared_ptr<Callable>>
      data_;
};

// Python ==, with 1 == 1.0 == True and two Undefineds equal (jinja2's Undefined.__eq__).
bool values_equal(const Value& a, const Value& b);

// Python float repr: shortest round-trip digits, fixed notation for 1e-4 <= |x| < 1e16.
std::string python_float_repr(double x);
std::string python_string_repr(std::string_view s);

// json.dumps(x, ensure_ascii, indent, separators, sort_keys) as transformers' tojson filter
// calls it. indent: nullopt = single line; otherwise the indent string per level.
struct JsonDumpOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;
  std::optional<std::pair<std::string, std::string>> separators;  // (item, key)
  bool sort_keys = false;
};
std::string json_dumps(const Value& v, const JsonDumpOptions& options);

// UTF-8 helpers (strings are UTF-8; Python indexes them by code point).
std::u32string utf8_decode(std::string_view s);
std::string utf8_encode(std::u32string_view s);
void utf8_append(std::string& out, char32_t c);
bool is_ascii(std::string_view s);
bool is_python_space(char32_t c);  // str.isspace()

}  // namespace shardlm::chat_template
