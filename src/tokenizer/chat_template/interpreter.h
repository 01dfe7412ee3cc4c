// Tree-walking evaluator for a parsed chat template. Internal to chat_template/:
// users go through ChatTemplate (chat_template.h).
//
// Sandbox: the template sees only the context it is given and the globals below
// (range, namespace, dict, raise_exception, strftime_now); lists and dicts are
// immutable (their mutating methods are Undefined, as in jinja2's
// ImmutableSandboxedEnvironment); loop iterations, output size, string sizes and
// macro recursion are bounded by Limits. Every failure is a shardlm::Error that
// names the template line.
#pragma once

#include <ctime>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>

#include "tokenizer/chat_template/ast.h"

namespace shardlm::chat_template {

class Interpreter {
 public:
  // cancelled (when set) is polled every kCancelPollSteps steps; true stops
  // the render with an error.
  Interpreter(const Limits& limits, std::optional<std::time_t> now, std::function<bool()> cancelled = {})
      : limits_(limits), now_(now), cancelled_(std::move(cancelled)) {}
  static constexpr size_t kCancelPollSteps = 65'536;

  // Renders `body` with `context` (a dict) as the top-level variables.
  std::string render(const Body& body, const Value& context);

  [[noreturn]] void error(const std::string& message) const;
  // Raises jinja2's UndefinedError for `v` if it is Undefined.
  void check_defined(const Value& v) const;
  Value call(const Value& callee, const CallArgs& args);
  Value getattr(const Value& obj, const std::string& name);
  Value getitem(const Value& obj, const Value& key);
  // Elements of a list, keys of a dict, characters of a string; Undefined is empty.
  std::vector<Value> iterate(const Value& v);
  void check_size(size_t n_bytes) const;
  void count_iterations(size_t n);
  // Charges n steps of work to the render (Limits::max_steps): one per node
  // evaluated, plus the items or bytes/64 an operation walks.
  void count_steps(size_t n);
  // A list of n items is about to be built (Limits::max_list_items).
  void check_items(size_t n) const;
  const Limits& limits() const { return limits_; }
  // namespace() objects are the only mutable values and may end up holding themselves;
  // render() empties them when it finishes so such cycles are not leaked.
  void track_namespace(std::shared_ptr<Dict> ns) { namespaces_.push_back(std::move(ns)); }
  std::optional<std::time_t> now() const { return now_; }

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  struct Frame {
    std::unordered_map<std::string, Value> vars;
    Frame* parent = nullptr;
  };

  Flow exec(const Body& body, Frame& frame);
  Flow exec_for(const Stmt& s, Frame& frame);
  void exec_set(const Stmt& s, Frame& frame, Value value);
  Value call_macro(const Stmt& macro, const CallArgs& args);
  std::string capture(const Body& body, Frame& frame);
  void emit(std::string_view text);

  Value eval(const Expr& e, Frame& frame);
  Value lookup(const std::string& name, Frame& frame) const;
  CallArgs eval_args(const Expr& e, Frame& frame, size_t first);
  Value eval_slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
  Value binary(const std::string& op, const Value& a, const Value& b);
  bool compare(const std::string& op, const Value& a, const Value& b);

  const Limits& limits_;
  std::optional<std::time_t> now_;
  std::string* out_ = nullptr;
  Frame* root_ = nullptr;
  size_t n_iterations_ = 0;
  size_t n_steps_ = 0;
  size_t next_cancel_poll_ = kCancelPollSteps;
  std::function<bool()> cancelled_;
  int call_depth_ = 0;
  int eval_depth_ = 0;  // eval/exec frames on the stack
  std::vector<std::shared_ptr<Dict>> namespaces_;
  mutable int line_ = 0;
};

// Builtins (builtins.cpp).
Value apply_filter(Interpreter& in, const std::string& name, const Value& value, const CallArgs& args);
bool apply_test(Interpreter& in, const std::string& name, const Value& value, const CallArgs& args);
// A bound method of a str / dict / list, or Undefined when the method is missing or unsafe.
Value bound_method(Interpreter& in, const Value& obj, const std::string& name);
void add_globals(std::unordered_map<std::string, Value>& vars);
// Python's < for numbers, strings and lists; error for anything else.
bool python_less(Interpreter& in, const Value& a, const Value& b);

}  // namespace shardlm::chat_template
