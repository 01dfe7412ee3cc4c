#include "tokenizer/chat_template/interpreter.h"

#include <cmath>
#include <limits>

#include "core/error.h"

namespace shardlm::chat_template {

namespace {

// Bytes of a message an error keeps: messages quote template values
// (a dict key, a raise_exception argument) that may be megabytes.
constexpr size_t kMaxErrorMessage = 400;

// Work a builtin or operator does over v, in steps: its items, or its bytes / 64.
size_t weight(const Value& v) {
  if (v.is_list()) return v.as_list()->items.size();
  if (v.is_dict()) return v.as_dict()->items.size();
  if (v.is_string()) return v.as_string().size() / 64;
  return 0;
}

size_t saturating_mul(size_t a, size_t b) {
  size_t r;
  return __builtin_mul_overflow(a, b, &r) ? SIZE_MAX : r;
}

// Counts eval/exec frames on the stack (Limits::max_eval_depth).
struct DepthGuard {
  Interpreter& in;
  int& depth;
  DepthGuard(Interpreter& interpreter, int& d, int limit) : in(interpreter), depth(d) {
    if (++depth > limit) {
      --depth;
      in.error(str_cat("evaluation nests deeper than ", limit, " levels (Limits::max_eval_depth; macros calling macros?)"));
    }
  }
  ~DepthGuard() { --depth; }
};

}  // namespace

void Interpreter::error(const std::string& message) const {
  if (message.size() <= kMaxErrorMessage) fail(ErrorCode::kInvalidArgument, "chat template line ", line_, ": ", message);
  size_t cut = kMaxErrorMessage;
  while (cut > 0 && (static_cast<unsigned char>(message[cut]) & 0xC0) == 0x80) --cut;
  fail(ErrorCode::kInvalidArgument, "chat template line ", line_, ": ", message.substr(0, cut), "... (",
       message.size(), " bytes)");
}

void Interpreter::count_steps(size_t n) {
  n_steps_ += n;
  if (n_steps_ > limits_.max_steps)
    error(str_cat("the render took more than ", limits_.max_steps, " evaluation steps (serve --chat-template-max-steps)"));
  if (n_steps_ >= next_cancel_poll_) {
    next_cancel_poll_ = n_steps_ + kCancelPollSteps;
    if (cancelled_ && cancelled_()) error("the render was cancelled (the client has gone)");
  }
}

void Interpreter::check_items(size_t n) const {
  if (n > limits_.max_list_items)
    error(str_cat("a list would hold more than ", limits_.max_list_items, " items (serve --chat-template-max-list-items)"));
}

void Interpreter::check_defined(const Value& v) const {
  if (v.is_undefined()) error(v.undefined_name().empty() ? "value is undefined" : v.undefined_name());
}

void Interpreter::check_size(size_t n_bytes) const {
  if (n_bytes > limits_.max_output_bytes)
    error(str_cat("output or string exceeds the limit of ", limits_.max_output_bytes,
                  " bytes (serve --chat-template-max-bytes)"));
}

void Interpreter::count_iterations(size_t n) {
  n_iterations_ += n;
  if (n_iterations_ > limits_.max_loop_iterations)
    error(str_cat("more than ", limits_.max_loop_iterations,
                  " loop iterations in one render (serve --chat-template-max-loop-iterations)"));
}

void Interpreter::emit(std::string_view text) {
  check_size(out_->size() + text.size());
  out_->append(text);
}

std::string Interpreter::render(const Body& body, const Value& context) {
  Frame root;
  add_globals(root.vars);
  if (context.is_dict())
    for (const auto& [k, v] : context.as_dict()->items) root.vars[k] = v;
  std::string out;
  out_ = &out;
  root_ = &root;
  line_ = 1;
  struct ReleaseNamespaces {
    std::vector<std::shared_ptr<Dict>>& list;
    ~ReleaseNamespaces() {
      for (auto& ns : list) ns->items.clear();
      list.clear();
    }
  } release{namespaces_};
  StringLimit string_limit(limits_.max_output_bytes);  // repr(), tojson and str() of containers
  exec(body, root);
  return out;
}

std::string Interpreter::capture(const Body& body, Frame& frame) {
  std::string buffer;
  std::string* saved = out_;
  out_ = &buffer;
  try {
    exec(body, frame);
  } catch (...) {
    out_ = saved;
    throw;
  }
  out_ = saved;
  return buffer;
}

Interpreter::Flow Interpreter::exec(const Body& body, Frame& frame) {
  DepthGuard depth(*this, eval_depth_, limits_.max_eval_depth);
  for (const auto& sp : body) {
    const Stmt& s = *sp;
    line_ = s.line;
    count_steps(1);
    switch (s.kind) {
      case StmtKind::kText:
        emit(s.text);
        break;
      case StmtKind::kPrint:
        emit(eval(*s.expr, frame).str());
        break;
      case StmtKind::kIf: {
        const Body* chosen = &s.else_body;
        for (const auto& [test, branch] : s.branches) {
          if (eval(*test, frame).truthy()) {
            chosen = &branch;
            break;
          }
        }
        Flow f = exec(*chosen, frame);
        if (f != Flow::kNormal) return f;
        break;
      }
      case StmtKind::kFor: {
        Flow f = exec_for(s, frame);  // only a break/continue in the else block escapes the loop
        if (f != Flow::kNormal) return f;
        break;
      }
      case StmtKind::kSet:
        exec_set(s, frame, eval(*s.expr, frame));
        break;
      case StmtKind::kSetBlock:
        exec_set(s, frame, Value(capture(s.body, frame)));
        break;
      case StmtKind::kMacro: {
        const Stmt* macro = &s;
        frame.vars[s.name] = Value::callable(s.name, [macro](Interpreter& in, const CallArgs& args) {
          return in.call_macro(*macro, args);
        });
        break;
      }
      case StmtKind::kBreak:
        return Flow::kBreak;
      case StmtKind::kContinue:
        return Flow::kContinue;
    }
  }
  return Flow::kNormal;
}

void Interpreter::exec_set(const Stmt& s, Frame& frame, Value value) {
  if (!s.attr.empty()) {
    Value ns = lookup(s.targets[0], frame);
    if (!ns.is_dict() || !ns.as_dict()->is_namespace)
      error("cannot assign attribute '" + s.attr + "' on '" + s.targets[0] + "' (a " + ns.type_name() +
            "); only namespace() objects accept `set x.attr = ...`");
    ns.as_dict()->set(s.attr, std::move(value));
    return;
  }
  if (s.targets.size() == 1) {
    frame.vars[s.targets[0]] = std::move(value);
    return;
  }
  std::vector<Value> items = iterate(value);
  if (value.is_undefined()) check_defined(value);
  if (items.size() != s.targets.size())
    error(str_cat("cannot unpack ", items.size(), " values into ", s.targets.size(), " names"));
  for (size_t i = 0; i < items.size(); ++i) frame.vars[s.targets[i]] = items[i];
}

Interpreter::Flow Interpreter::exec_for(const Stmt& s, Frame& frame) {
  Value iterable = eval(*s.expr, frame);
  if (!(iterable.is_undefined() || iterable.is_list() || iterable.is_dict() || iterable.is_string()))
    error(str_cat("'", iterable.type_name(), "' object is not iterable"));
  std::vector<Value> all = iterate(iterable);
  count_iterations(all.size());
  count_steps(all.size());
  auto bind = [&](Frame& f, const Value& item) {
    if (s.targets.size() == 1) {
      f.vars[s.targets[0]] = item;
      return;
    }
    if (!(item.is_list() || item.is_string()))
      error(str_cat("cannot unpack a '", item.type_name(), "' into ", s.targets.size(), " loop variables"));
    std::vector<Value> parts = iterate(item);
    if (parts.size() != s.targets.size())
      error(str_cat("cannot unpack ", parts.size(), " values into ", s.targets.size(), " loop variables"));
    for (size_t i = 0; i < parts.size(); ++i) f.vars[s.targets[i]] = parts[i];
  };
  std::vector<Value> items;
  if (s.filter) {
    for (const Value& item : all) {
      Frame f;
      f.parent = &frame;
      bind(f, item);
      if (eval(*s.filter, f).truthy()) items.push_back(item);
    }
  } else {
    items = std::move(all);
  }
  if (items.empty()) {
    Frame f;
    f.parent = &frame;
    return exec(s.else_body, f);
  }
  const int64_t n = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < n; ++i) {
    Frame f;
    f.parent = &frame;
    bind(f, items[static_cast<size_t>(i)]);
    auto loop = std::make_shared<Dict>();
    loop->items = {{"index", Value(i + 1)},        {"index0", Value(i)},
                   {"revindex", Value(n - i)},     {"revindex0", Value(n - i - 1)},
                   {"first", Value(i == 0)},       {"last", Value(i == n - 1)},
                   {"length", Value(n)},           {"depth", Value(1)},
                   {"depth0", Value(0)}};
    if (i > 0) loop->items.emplace_back("previtem", items[static_cast<size_t>(i - 1)]);
    if (i + 1 < n) loop->items.emplace_back("nextitem", items[static_cast<size_t>(i + 1)]);
    loop->items.emplace_back("cycle", Value::callable("cycle", [i](Interpreter& in, const CallArgs& args) {
      if (args.positional.empty()) in.error("loop.cycle() needs at least one argument");
      return args.positional[static_cast<size_t>(i) % args.positional.size()];
    }));
    loop->is_namespace = false;
    f.vars["loop"] = Value(loop);
    Flow flow = exec(s.body, f);
    if (flow == Flow::kBreak) break;
  }
  return Flow::kNormal;
}

Value Interpreter::call_macro(const Stmt& macro, const CallArgs& args) {
  if (call_depth_ >= limits_.max_call_depth)
    error(str_cat("macro calls nest deeper than ", limits_.max_call_depth, " (Limits::max_call_depth)"));
  if (args.positional.size() > macro.params.size())
    error(str_cat("macro '", macro.name, "' takes not more than ", macro.params.size(), " argument(s)"));
  Frame f;
  f.parent = root_;
  for (const auto& [k, v] : args.keyword) {
    bool known = false;
    for (size_t i = 0; i < macro.params.size(); ++i)
      if (macro.params[i].name == k) {
        if (i < args.positional.size()) error("macro '" + macro.name + "' got multiple values for argument '" + k + "'");
        known = true;
      }
    if (!known) error("macro '" + macro.name + "' takes no keyword argument '" + k + "'");
  }
  int saved_line = line_;
  for (size_t i = 0; i < macro.params.size(); ++i) {
    const MacroParam& p = macro.params[i];
    if (const Value* v = args.get(i, p.name))
      f.vars[p.name] = *v;
    else if (p.default_value)
      f.vars[p.name] = eval(*p.default_value, f);
    else
      f.vars[p.name] = Value::undefined("'" + p.name + "' is undefined");
  }
  ++call_depth_;
  std::string out;
  try {
    out = capture(macro.body, f);
  } catch (...) {
    --call_depth_;
    throw;
  }
  --call_depth_;
  line_ = saved_line;
  return Value(std::move(out));
}

Value Interpreter::lookup(const std::string& name, Frame& frame) const {
  for (const Frame* f = &frame; f; f = f->parent) {
    auto it = f->vars.find(name);
    if (it != f->vars.end()) return it->second;
  }
  return Value::undefined("'" + name + "' is undefined");
}

std::vector<Value> Interpreter::iterate(const Value& v) {
  std::vector<Value> out;
  count_steps(weight(v));
  if (v.is_list()) return v.as_list()->items;
  if (v.is_dict()) {
    if (v.as_dict()->is_namespace) error("'Namespace' object is not iterable");
    for (const auto& [k, _] : v.as_dict()->items) out.emplace_back(k);
  } else if (v.is_string()) {
    const std::string& s = v.as_string();
    count_steps(s.size());  // one item per character
    if (is_ascii(s)) check_items(s.size());
    else check_items(utf8_decode(s).size());
    if (is_ascii(s)) {
      for (char c : s) out.emplace_back(std::string(1, c));
    } else {
      for (char32_t c : utf8_decode(s)) {
        std::string ch;
        utf8_append(ch, c);
        out.emplace_back(std::move(ch));
      }
    }
  } else if (!v.is_undefined()) {
    error(str_cat("'", v.type_name(), "' object is not iterable"));
  }
  return out;
}

Value Interpreter::getattr(const Value& obj, const std::string& name) {
  check_defined(obj);
  if (obj.is_dict()) {
    const Dict& d = *obj.as_dict();
    if (!d.is_namespace) {
      Value m = bound_method(*this, obj, name);
      if (m.is_callable()) return m;
      static const char* kDictAttrs[] = {"clear", "pop", "popitem", "setdefault", "update", "copy", "fromkeys"};
      for (const char* a : kDictAttrs)
        if (name == a) return Value::undefined("access to attribute '" + name + "' of 'dict' object is unsafe");
    }
    if (const Value* v = d.find(name)) return *v;
    return Value::undefined("'" + std::string(d.is_namespace ? "Namespace" : "dict") +
                            " object' has no attribute '" + name + "'");
  }
  if (obj.is_string() || obj.is_list()) {
    count_steps(weight(obj));  // what the method may walk (split, join, replace, index, ...)
    Value m = bound_method(*this, obj, name);
    if (m.is_callable()) return m;
  }
  if (obj.is_none()) return Value::undefined("'None' has no attribute '" + name + "'");
  return Value::undefined(str_cat("'", obj.type_name(), " object' has no attribute '", name, "'"));
}

Value Interpreter::getitem(const Value& obj, const Value& key) {
  check_defined(obj);
  if (obj.is_dict() && !obj.as_dict()->is_namespace) {
    if (key.is_string()) {
      if (const Value* v = obj.as_dict()->find(key.as_string())) return *v;
      Value m = bound_method(*this, obj, key.as_string());
      if (m.is_callable()) return m;
    }
    return Value::undefined("'dict object' has no attribute " + key.repr());
  }
  if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.as_int();
    if (obj.is_list()) {
      const auto& items = obj.as_list()->items;
      int64_t n = static_cast<int64_t>(items.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return items[static_cast<size_t>(i)];
      return Value::undefined(str_cat("list object has no element ", key.as_int()));
    }
    const std::string& s = obj.as_string();
    if (is_ascii(s)) {
      int64_t n = static_cast<int64_t>(s.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return Value(std::string(1, s[static_cast<size_t>(i)]));
    } else {
      std::u32string u = utf8_decode(s);
      int64_t n = static_cast<int64_t>(u.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return Value(utf8_encode(u.substr(static_cast<size_t>(i), 1)));
    }
    return Value::undefined(str_cat("str object has no element ", key.as_int()));
  }
  if (key.is_string()) return getattr(obj, key.as_string());
  return Value::undefined(str_cat("'", obj.type_name(), " object' has no element ", key.repr()));
}

Value Interpreter::eval_slice(const Value& obj, const Value& start_v, const Value& stop_v, const Value& step_v) {
  check_defined(obj);
  auto as_index = [&](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_none() || v.is_undefined()) return std::nullopt;
    if (!(v.is_int() || v.is_bool())) error(str_cat("slice ", what, " must be an integer or none, found ", v.type_name()));
    return v.as_int();
  };
  if (!(obj.is_list() || obj.is_string()))
    return Value::undefined(str_cat("'", obj.type_name(), "' object is not subscriptable"));
  int64_t step = as_index(step_v, "step").value_or(1);
  if (step == 0) error("slice step cannot be zero");
  bool ascii = obj.is_string() && is_ascii(obj.as_string());
  std::u32string u;
  int64_t n;
  if (obj.is_list()) n = static_cast<int64_t>(obj.as_list()->items.size());
  else if (ascii) n = static_cast<int64_t>(obj.as_string().size());
  else {
    u = utf8_decode(obj.as_string());
    n = static_cast<int64_t>(u.size());
  }
  auto adjust = [&](std::optional<int64_t> v, bool is_start) {
    if (!v) return is_start ? (step < 0 ? n - 1 : 0) : (step < 0 ? -1 : n);
    int64_t x = *v;
    if (x < 0) {
      x += n;
      if (x < 0) x = step < 0 ? -1 : 0;
    } else if (x >= n) {
      x = step < 0 ? n - 1 : n;
    }
    return x;
  };
  int64_t start = adjust(as_index(start_v, "start"), true);
  int64_t stop = adjust(as_index(stop_v, "stop"), false);
  std::vector<size_t> idx;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) idx.push_back(static_cast<size_t>(i));
  if (obj.is_list()) {
    std::vector<Value> items;
    items.reserve(idx.size());
    for (size_t i : idx) items.push_back(obj.as_list()->items[i]);
    return Value::list(std::move(items), obj.as_list()->is_tuple);
  }
  std::string out;
  if (ascii) {
    for (size_t i : idx) out += obj.as_string()[i];
  } else {
    for (size_t i : idx) utf8_append(out, u[i]);
  }
  return Value(std::move(out));
}

CallArgs Interpreter::eval_args(const Expr& e, Frame& frame, size_t first) {
  CallArgs args;
  for (size_t i = first; i < e.args.size(); ++i) args.positional.push_back(eval(*e.args[i], frame));
  for (const auto& [k, v] : e.kwargs) args.keyword.emplace_back(k, eval(*v, frame));
  return args;
}

Value Interpreter::call(const Value& callee, const CallArgs& args) {
  check_defined(callee);
  if (!callee.is_callable()) error(str_cat("'", callee.type_name(), "' object is not callable"));
  return callee.as_callable()->fn(*this, args);
}

namespace {

int64_t checked(Interpreter& in, bool overflow, int64_t v) {
  if (overflow) in.error("integer overflow (results beyond 64 bits are not supported)");
  return v;
}

double floor_mod(double a, double b) {
  double m = std::fmod(a, b);
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

}  // namespace

Value Interpreter::binary(const std::string& op, const Value& a, const Value& b) {
  check_defined(a);
  check_defined(b);
  bool nums = a.is_number() && b.is_number();
  bool ints = nums && !a.is_float() && !b.is_float();
  if (op == "+") {
    if (ints) {
      int64_t r;
      bool overflow = __builtin_add_overflow(a.as_int(), b.as_int(), &r);
      return Value(checked(*this, overflow, r));
    }
    if (nums) return Value(a.as_double() + b.as_double());
    if (a.is_string() && b.is_string()) {
      check_size(a.as_string().size() + b.as_string().size());
      count_steps(weight(a) + weight(b));
      return Value(a.as_string() + b.as_string());
    }
    if (a.is_list() && b.is_list()) {
      check_items(a.as_list()->items.size() + b.as_list()->items.size());
      count_steps(weight(a) + weight(b));
      std::vector<Value> items = a.as_list()->items;
      items.insert(items.end(), b.as_list()->items.begin(), b.as_list()->items.end());
      return Value::list(std::move(items), a.as_list()->is_tuple);
    }
    if (a.is_string()) error(str_cat("can only concatenate str (not \"", b.type_name(), "\") to str"));
    error(str_cat("unsupported operand type(s) for +: '", a.type_name(), "' and '", b.type_name(), "'"));
  }
  if (op == "-") {
    if (ints) {
      int64_t r;
      bool overflow = __builtin_sub_overflow(a.as_int(), b.as_int(), &r);
      return Value(checked(*this, overflow, r));
    }
    if (nums) return Value(a.as_double() - b.as_double());
  } else if (op == "*") {
    if (ints) {
      int64_t r;
      bool overflow = __builtin_mul_overflow(a.as_int(), b.as_int(), &r);
      return Value(checked(*this, overflow, r));
    }
    if (nums) return Value(a.as_double() * b.as_double());
    const Value* seq = a.is_string() || a.is_list() ? &a : &b;
    const Value* count = seq == &a ? &b : &a;
    if ((seq->is_string() || seq->is_list()) && (count->is_int() || count->is_bool())) {
      int64_t times = std::max<int64_t>(0, count->as_int());
      if (seq->is_string()) {
        check_size(saturating_mul(seq->as_string().size(), static_cast<size_t>(times)));
        count_steps(saturating_mul(seq->as_string().size(), static_cast<size_t>(times)) / 64);
        std::string out;
        out.reserve(seq->as_string().size() * static_cast<size_t>(times));
        for (int64_t i = 0; i < times; ++i) out += seq->as_string();
        return Value(std::move(out));
      }
      check_items(saturating_mul(seq->as_list()->items.size(), static_cast<size_t>(times)));
      count_steps(saturating_mul(seq->as_list()->items.size(), static_cast<size_t>(times)));
      std::vector<Value> items;
      items.reserve(seq->as_list()->items.size() * static_cast<size_t>(times));
      for (int64_t i = 0; i < times; ++i)
        items.insert(items.end(), seq->as_list()->items.begin(), seq->as_list()->items.end());
      return Value::list(std::move(items), seq->as_list()->is_tuple);
    }
  } else if (op == "/") {
    if (nums) {
      if (b.as_double() == 0) error("division by zero");
      return Value(a.as_double() / b.as_double());
    }
  } else if (op == "//") {
    if (ints) {
      if (b.as_int() == 0) error("integer division or modulo by zero");
      int64_t q = a.as_int() / b.as_int();
      if ((a.as_int() % b.as_int() != 0) && ((a.as_int() < 0) != (b.as_int() < 0))) --q;
      return Value(q);
    }
    if (nums) {
      if (b.as_double() == 0) error("float floor division by zero");
      return Value(std::floor(a.as_double() / b.as_double()));
    }
  } else if (op == "%") {
    if (ints) {
      if (b.as_int() == 0) error("integer division or modulo by zero");
      int64_t m = a.as_int() % b.as_int();
      if (m != 0 && ((m < 0) != (b.as_int() < 0))) m += b.as_int();
      return Value(m);
    }
    if (nums) {
      if (b.as_double() == 0) error("float modulo");
      return Value(floor_mod(a.as_double(), b.as_double()));
    }
    if (a.is_string()) error("printf-style '%' string formatting is not supported; use ~ or format()");
  } else if (op == "**") {
    if (ints && b.as_int() >= 0) {
      int64_t r = 1, base = a.as_int();
      for (int64_t e = b.as_int(); e > 0; --e) {
        if (__builtin_mul_overflow(r, base, &r)) error("integer overflow (results beyond 64 bits are not supported)");
        if (r == 0 || r == 1) break;
      }
      if (base == -1) r = (b.as_int() % 2) ? -1 : 1;
      return Value(r);
    }
    if (nums) {
      if (a.as_double() == 0 && b.as_double() < 0) error("0.0 cannot be raised to a negative power");
      return Value(std::pow(a.as_double(), b.as_double()));
    }
  }
  error(str_cat("unsupported operand type(s) for ", op, ": '", a.type_name(), "' and '", b.type_name(), "'"));
}

bool python_less(Interpreter& in, const Value& a, const Value& b) {
  in.check_defined(a);
  in.check_defined(b);
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();  // UTF-8 order = code point order
  if (a.is_list() && b.is_list()) {
    const auto& x = a.as_list()->items;
    const auto& y = b.as_list()->items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (values_equal(x[i], y[i])) continue;
      return python_less(in, x[i], y[i]);
    }
    return x.size() < y.size();
  }
  in.error(str_cat("'<' not supported between instances of '", a.type_name(), "' and '", b.type_name(), "'"));
}

bool Interpreter::compare(const std::string& op, const Value& a, const Value& b) {
  count_steps(std::min(weight(a), weight(b)) + (op == "in" || op == "notin" ? weight(b) : 0));
  if (op == "==") return values_equal(a, b);
  if (op == "!=") return !values_equal(a, b);
  if (op == "<") return python_less(*this, a, b);
  if (op == ">") return python_less(*this, b, a);
  if (op == "<=") return python_less(*this, a, b) || values_equal(a, b);
  if (op == ">=") return python_less(*this, b, a) || values_equal(a, b);
  bool contained = false;
  if (b.is_string()) {
    check_defined(a);
    if (!a.is_string()) error(str_cat("'in <string>' requires string as left operand, not ", a.type_name()));
    contained = b.as_string().find(a.as_string()) != std::string::npos;
  } else if (b.is_list()) {
    for (const Value& v : b.as_list()->items)
      if (values_equal(a, v)) contained = true;
  } else if (b.is_dict() && !b.as_dict()->is_namespace) {
    contained = a.is_string() && b.as_dict()->find(a.as_string()) != nullptr;
  } else if (!b.is_undefined()) {
    error(str_cat("argument of type '", b.type_name(), "' is not iterable"));
  }
  return op == "in" ? contained : !contained;
}

Value Interpreter::eval(const Expr& e, Frame& frame) {
  DepthGuard depth(*this, eval_depth_, limits_.max_eval_depth);
  line_ = e.line;
  count_steps(1);
  switch (e.kind) {
    case ExprKind::kConst:
      return e.value;
    case ExprKind::kName:
      return lookup(e.name, frame);
    case ExprKind::kList:
    case ExprKind::kTuple: {
      std::vector<Value> items;
      items.reserve(e.args.size());
      for (const auto& a : e.args) items.push_back(eval(*a, frame));
      return Value::list(std::move(items), e.kind == ExprKind::kTuple);
    }
    case ExprKind::kDict: {
      auto d = std::make_shared<Dict>();
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        Value k = eval(*e.args[i], frame);
        if (!k.is_string()) error(str_cat("dict keys must be strings here, found ", k.type_name()));
        d->set(k.as_string(), eval(*e.args[i + 1], frame));
      }
      return Value(d);
    }
    case ExprKind::kGetAttr: {
      Value obj = eval(*e.args[0], frame);
      line_ = e.line;
      return getattr(obj, e.name);
    }
    case ExprKind::kGetItem: {
      Value obj = eval(*e.args[0], frame);
      Value key = eval(*e.args[1], frame);
      line_ = e.line;
      return getitem(obj, key);
    }
    case ExprKind::kSlice: {
      Value obj = eval(*e.args[0], frame);
      Value start = e.args[1] ? eval(*e.args[1], frame) : Value::none();
      Value stop = e.args[2] ? eval(*e.args[2], frame) : Value::none();
      Value step = e.args[3] ? eval(*e.args[3], frame) : Value::none();
      line_ = e.line;
      return eval_slice(obj, start, stop, step);
    }
    case ExprKind::kCall: {
      Value callee = eval(*e.args[0], frame);
      CallArgs args = eval_args(e, frame, 1);
      line_ = e.line;
      return call(callee, args);
    }
    case ExprKind::kFilter: {
      Value v = eval(*e.args[0], frame);
      CallArgs args = eval_args(e, frame, 1);
      line_ = e.line;
      count_steps(weight(v));  // a filter walks its input (join, map, sort, tojson, ...)
      return apply_filter(*this, e.name, v, args);
    }
    case ExprKind::kTest: {
      Value v = eval(*e.args[0], frame);
      CallArgs args = eval_args(e, frame, 1);
      line_ = e.line;
      return Value(apply_test(*this, e.name, v, args) != e.negated);
    }
    case ExprKind::kNeg:
    case ExprKind::kPos: {
      Value v = eval(*e.args[0], frame);
      line_ = e.line;
      check_defined(v);
      if (!v.is_number()) error(str_cat("bad operand type for unary ", e.kind == ExprKind::kNeg ? "-" : "+", ": '",
                                        v.type_name(), "'"));
      if (e.kind == ExprKind::kPos) return v.is_bool() ? Value(v.as_int()) : v;
      if (v.is_float()) return Value(-v.as_double());
      if (v.as_int() == std::numeric_limits<int64_t>::min()) error("integer overflow");
      return Value(-v.as_int());
    }
    case ExprKind::kNot:
      return Value(!eval(*e.args[0], frame).truthy());
    case ExprKind::kAnd: {
      Value a = eval(*e.args[0], frame);
      return a.truthy() ? eval(*e.args[1], frame) : a;
    }
    case ExprKind::kOr: {
      Value a = eval(*e.args[0], frame);
      return a.truthy() ? a : eval(*e.args[1], frame);
    }
    case ExprKind::kBinary: {
      Value a = eval(*e.args[0], frame);
      Value b = eval(*e.args[1], frame);
      line_ = e.line;
      return binary(e.name, a, b);
    }
    case ExprKind::kCompare: {
      Value left = eval(*e.args[0], frame);
      for (size_t i = 0; i < e.ops.size(); ++i) {
        Value right = eval(*e.args[i + 1], frame);
        line_ = e.line;
        if (!compare(e.ops[i], left, right)) return Value(false);
        left = std::move(right);
      }
      return Value(true);
    }
    case ExprKind::kConcat: {
      std::string out;
      for (const auto& a : e.args) {
        out += eval(*a, frame).str();
        check_size(out.size());
      }
      return Value(std::move(out));
    }
    case ExprKind::kCondExpr: {
      if (eval(*e.args[1], frame).truthy()) return eval(*e.args[0], frame);
      if (e.args[2]) return eval(*e.args[2], frame);
      return Value::undefined("the inline if-expression evaluated to false and has no else section");
    }
  }
  error("unknown expression");
}

}  // namespace shardlm::chat_template
