// Syntax tree of a parsed chat template: statements (text, output, if, for,
// set, macro, break/continue) over expressions, mirroring jinja2's nodes.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/chat_template/value.h"

namespace shardlm::chat_template {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprKind {
  kConst,     // value
  kName,      // name
  kList,      // args
  kTuple,     // args
  kDict,      // args = key0, value0, key1, value1, ...
  kGetAttr,   // args[0].name
  kGetItem,   // args[0][args[1]]
  kSlice,     // args[0][args[1]:args[2]:args[3]] (null = omitted)
  kCall,      // args[0](args[1:], kwargs)
  kFilter,    // args[0] | name(args[1:], kwargs)
  kTest,      // args[0] is [not] name(args[1:])
  kNeg,       // -args[0]
  kPos,       // +args[0]
  kNot,       // not args[0]
  kBinary,    // args[0] op args[1]: + - * / // % **
  kAnd,       // args[0] and args[1]
  kOr,        // args[0] or args[1]
  kCompare,   // args[0] ops[0] args[1] ops[1] args[2] ...: == != < <= > >= in notin
  kConcat,    // args joined with ~
  kCondExpr,  // args[0] if args[1] else args[2] (args[2] null = undefined)
};

struct Expr {
  ExprKind kind;
  int line = 0;
  Value value;                    // kConst
  std::string name;               // kName, kGetAttr, kFilter, kTest; operator for kBinary
  std::vector<ExprPtr> args;      // operands, see ExprKind
  std::vector<std::pair<std::string, ExprPtr>> kwargs;  // kCall, kFilter
  std::vector<std::string> ops;   // kCompare
  bool negated = false;           // kTest: `is not`
  int height = 1;                 // 1 + the tallest operand: evaluation and destruction recurse this deep
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class StmtKind { kText, kPrint, kIf, kFor, kSet, kSetBlock, kMacro, kBreak, kContinue };

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // null: no default (Undefined when not passed)
};

struct Stmt {
  StmtKind kind;
  int line = 0;
  std::string text;                // kText
  ExprPtr expr;                    // kPrint, kSet value, kFor iterable
  std::vector<std::pair<ExprPtr, Body>> branches;  // kIf: (test, body) in order
  Body body;                       // kFor, kSetBlock, kMacro body
  Body else_body;                  // kIf, kFor
  std::vector<std::string> targets;  // kFor / kSet names (more than one: tuple unpacking)
  std::string attr;                // kSet/kSetBlock `set ns.attr`: targets[0] is the namespace
  ExprPtr filter;                  // kFor `if` condition
  std::string name;                // kMacro
  std::vector<MacroParam> params;  // kMacro
};

// What one template may cost. The parser refuses a template that nests too
// deep (a chat template is the checkpoint's: that fails the model's load), the
// interpreter stops a render that runs past a budget (a 400 naming the limit).
struct Limits {
  size_t max_output_bytes = size_t{16} << 20;  // rendered text and any single string built
  size_t max_loop_iterations = 1'000'000;      // total over the whole render
  int max_call_depth = 64;                     // nested macro calls
  // Parser nesting of blocks and expressions, and the height of any one
  // expression tree plus the blocks around it: `1+1+...` and `x.a.a...` are
  // loops in the parser but trees as deep as they are long, which evaluation
  // and destruction walk recursively.
  int max_nesting = 200;
  // Recursion of one render across macro calls (each level ~0.7 KiB of stack
  // in Release, several times that under ASan): max_call_depth macros of
  // max_nesting levels each would need 9 MB.
  int max_eval_depth = 1000;
  // Evaluation steps in one render: one per statement and expression node,
  // plus the items and bytes (/64) that builtins and operators walk. About
  // 0.5 s in Release; a macro that recurses twice per level, or nested
  // range() loops, stops here instead of running for minutes.
  size_t max_steps = 10'000'000;
  size_t max_list_items = 1'000'000;  // items of any one list a template builds (x + x doubling)
};

// Parses template source with jinja2's lexer rules as transformers configures them
// (trim_blocks, lstrip_blocks, keep_trailing_newline=False). Throws shardlm::Error
// naming the line on any syntax error.
Body parse_template(std::string_view source, const Limits& limits);

}  // namespace shardlm::chat_template
