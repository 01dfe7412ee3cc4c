#include "grammar/regex.h"

#include <algorithm>
#include <cctype>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

namespace shardlm::grammar {
namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;  // code point ranges, inclusive

Ranges normalise(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (const auto& [a, b] : r) {
    if (!out.empty() && a <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, b);
    } else {
      out.emplace_back(a, b);
    }
  }
  return out;
}

Ranges complement(const Ranges& r) {
  Ranges n = normalise(r), out;
  uint32_t lo = 0;
  for (const auto& [a, b] : n) {
    if (a > lo) out.emplace_back(lo, a - 1);
    lo = b + 1;
  }
  if (lo <= 0x10FFFF) out.emplace_back(lo, 0x10FFFF);
  return out;
}

const Ranges& digit_ranges() {
  static const Ranges r = {{'0', '9'}};
  return r;
}
const Ranges& word_ranges() {
  static const Ranges r = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
  return r;
}
const Ranges& space_ranges() {
  static const Ranges r = {{'\t', '\r'}, {' ', ' '}};
  return r;
}

struct Node {
  enum class Kind { kChars, kSeq, kAlt, kRepeat } kind = Kind::kSeq;
  Ranges chars;                               // kChars
  std::vector<std::unique_ptr<Node>> kids;    // kSeq, kAlt, kRepeat (one)
  int64_t min = 0, max = -1;                  // kRepeat
};
using NodePtr = std::unique_ptr<Node>;

NodePtr chars_node(Ranges r) {
  auto n = std::make_unique<Node>();
  n->kind = Node::Kind::kChars;
  n->chars = normalise(std::move(r));
  return n;
}

// The parser and the emitter recurse once per group and once per stacked
// quantifier, so a client's 50,000 '(' or 'a' followed by 100,000 '*' would
// exhaust the stack. Real patterns nest a handful of groups; Python and
// ECMAScript refuse even two quantifiers in a row ("multiple repeat"), which
// we accept up to a short run.
constexpr int kMaxRegexNesting = 64;      // groups inside groups
constexpr int kMaxQuantifierRun = 8;      // quantifiers on one atom: a*+?{2}
constexpr size_t kMaxQuotedPattern = 80;  // bytes of the pattern an error message quotes

// The pattern as an error message quotes it: a client may send megabytes.
std::string quoted(std::string_view p) {
  if (p.size() <= kMaxQuotedPattern) return std::string(p);
  size_t cut = kMaxQuotedPattern;
  while (cut > 0 && (static_cast<unsigned char>(p[cut]) & 0xC0) == 0x80) --cut;
  return str_cat(p.substr(0, cut), "... (", p.size(), " bytes)");
}

class Parser {
 public:
  Parser(std::string_view p, std::string_view what) : p_(p), what_(what) {}

  NodePtr parse() {
    if (peek('^')) ++i_;
    NodePtr n = parse_alt();
    if (i_ < p_.size()) bad("unbalanced ')'");
    return n;
  }

 private:
  [[noreturn]] void bad(const std::string& msg) const {
    fail(ErrorCode::kInvalidArgument, what_, ": invalid regular expression at offset ", i_, " of '", quoted(p_),
         "': ", msg);
  }
  [[noreturn]] void unsupported(const std::string& construct) const {
    fail(ErrorCode::kUnsupported, what_, ": the regular expression '", quoted(p_), "' uses ", construct,
         " (offset ", i_, "), which the grammar engine does not support");
  }
  bool peek(char c) const { return i_ < p_.size() && p_[i_] == c; }
  bool at_end_anchor() const { return peek('$') && i_ + 1 == p_.size(); }

  uint32_t next_codepoint() {
    const auto c0 = static_cast<unsigned char>(p_[i_]);
    int n = c0 < 0x80 ? 1 : (c0 >> 5) == 6 ? 2 : (c0 >> 4) == 14 ? 3 : (c0 >> 3) == 30 ? 4 : 0;
    if (n == 0 || i_ + size_t(n) > p_.size()) bad("the pattern is not valid UTF-8");
    uint32_t cp = n == 1 ? c0 : n == 2 ? (c0 & 0x1F) : n == 3 ? (c0 & 0x0F) : (c0 & 0x07);
    for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(p_[i_ + size_t(k)]) & 0x3F);
    i_ += size_t(n);
    return cp;
  }

  uint32_t hex(int n_digits) {
    uint32_t v = 0;
    for (int k = 0; k < n_digits; ++k) {
      if (i_ >= p_.size() || !std::isxdigit(static_cast<unsigned char>(p_[i_]))) bad("expected a hex digit");
      const char c = p_[i_++];
      v = v * 16 + uint32_t(std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : (std::tolower(c) - 'a' + 10));
    }
    return v;
  }

  // After a backslash: the set of code points the escape stands for.
  Ranges escape() {
    if (i_ >= p_.size()) bad("the pattern ends with a backslash");
    const char c = p_[i_++];
    switch (c) {
      case 'd': return digit_ranges();
      case 'D': return complement(digit_ranges());
      case 'w': return word_ranges();
      case 'W': return complement(word_ranges());
      case 's': return space_ranges();
      case 'S': return complement(space_ranges());
      case 'n': return {{'\n', '\n'}};
      case 'r': return {{'\r', '\r'}};
      case 't': return {{'\t', '\t'}};
      case 'f': return {{'\f', '\f'}};
      case 'v': return {{'\v', '\v'}};
      case '0': return {{0, 0}};
      case 'x': { uint32_t v = hex(2); return {{v, v}}; }
      case 'u': { uint32_t v = hex(4); return {{v, v}}; }
      case 'b': case 'B': --i_; unsupported("a word boundary (\\b, \\B)");
      default: break;
    }
    if (c >= '1' && c <= '9') {
      --i_;
      unsupported("a backreference");
    }
    if (std::isalnum(static_cast<unsigned char>(c))) {
      --i_;
      unsupported(std::string("the escape \\") + c);
    }
    --i_;
    const uint32_t cp = next_codepoint();
    return {{cp, cp}};
  }

  NodePtr parse_class() {
    // at '[' already consumed
    bool negate = false;
    if (peek('^')) {
      negate = true;
      ++i_;
    }
    Ranges r;
    bool first = true;
    for (;;) {
      if (i_ >= p_.size()) bad("unterminated character class");
      if (peek(']') && !first) {
        ++i_;
        break;
      }
      first = false;
      Ranges item;
      bool single = false;
      uint32_t lo = 0;
      if (peek('\\')) {
        ++i_;
        item = escape();
        single = item.size() == 1 && item[0].first == item[0].second;
        lo = item[0].first;
      } else if (peek('[') && i_ + 1 < p_.size() && p_[i_ + 1] == ':') {
        unsupported("a POSIX class [:name:]");
      } else {
        lo = next_codepoint();
        item = {{lo, lo}};
        single = true;
      }
      if (single && peek('-') && i_ + 1 < p_.size() && p_[i_ + 1] != ']') {
        ++i_;
        uint32_t hi = 0;
        if (peek('\\')) {
          ++i_;
          Ranges e = escape();
          if (e.size() != 1 || e[0].first != e[0].second) bad("a class range must end with a single character");
          hi = e[0].first;
        } else {
          hi = next_codepoint();
        }
        if (hi < lo) bad("a class range is out of order");
        item = {{lo, hi}};
      }
      r.insert(r.end(), item.begin(), item.end());
    }
    return chars_node(negate ? complement(r) : r);
  }

  NodePtr parse_alt() {
    auto alt = std::make_unique<Node>();
    alt->kind = Node::Kind::kAlt;
    alt->kids.push_back(parse_seq());
    while (peek('|')) {
      ++i_;
      alt->kids.push_back(parse_seq());
    }
    if (alt->kids.size() == 1) return std::move(alt->kids[0]);
    return alt;
  }

  NodePtr parse_seq() {
    auto seq = std::make_unique<Node>();
    seq->kind = Node::Kind::kSeq;
    while (i_ < p_.size() && !peek('|') && !peek(')')) {
      if (at_end_anchor()) {
        ++i_;
        break;
      }
      NodePtr atom = parse_atom();
      seq->kids.push_back(parse_quantifier(std::move(atom)));
    }
    return seq;
  }

  bool parse_int(int64_t* v) {
    size_t start = i_;
    int64_t x = 0;
    while (i_ < p_.size() && std::isdigit(static_cast<unsigned char>(p_[i_]))) {
      x = std::min<int64_t>(x * 10 + (p_[i_] - '0'), int64_t(1) << 40);
      ++i_;
    }
    *v = x;
    return i_ > start;
  }

  NodePtr parse_quantifier(NodePtr atom) {
    for (int run = 0;; ++run) {
      if (run == kMaxQuantifierRun && (peek('*') || peek('+') || peek('?') || peek('{')))
        bad(str_cat("more than ", kMaxQuantifierRun, " quantifiers in a row on one item (the limit on stacked quantifiers)"));
      int64_t min = 0, max = -1;
      if (peek('*')) {
        ++i_;
      } else if (peek('+')) {
        ++i_;
        min = 1;
      } else if (peek('?')) {
        ++i_;
        max = 1;
      } else if (peek('{')) {
        const size_t save = i_;
        ++i_;
        if (!parse_int(&min)) {  // a literal '{' (as Python reads it)
          i_ = save;
          return atom;
        }
        max = min;
        if (peek(',')) {
          ++i_;
          if (!parse_int(&max)) max = -1;
        }
        if (!peek('}')) bad("unterminated {n,m} quantifier");
        ++i_;
        if (max >= 0 && max < min) bad("{n,m} with m < n");
      } else {
        return atom;
      }
      if (peek('?')) ++i_;  // lazy: same language
      else if (peek('+')) unsupported("a possessive quantifier");
      auto rep = std::make_unique<Node>();
      rep->kind = Node::Kind::kRepeat;
      rep->min = min;
      rep->max = max;
      rep->kids.push_back(std::move(atom));
      atom = std::move(rep);
    }
  }

  NodePtr parse_atom() {
    const char c = p_[i_];
    if (c == '(') {
      ++i_;
      if (peek('?')) {
        ++i_;
        if (peek(':')) {
          ++i_;
        } else if (peek('P') || (peek('<') && i_ + 1 < p_.size() && p_[i_ + 1] != '=' && p_[i_ + 1] != '!')) {
          if (peek('P')) ++i_;
          if (!peek('<')) unsupported("a (?P...) group other than (?P<name>...)");
          while (i_ < p_.size() && !peek('>')) ++i_;
          if (!peek('>')) bad("unterminated group name");
          ++i_;
        } else if (peek('=') || peek('!') || peek('<')) {
          unsupported("a lookaround assertion");
        } else {
          unsupported("an inline flag or special group (?...)");
        }
      }
      if (++depth_ > kMaxRegexNesting)
        bad(str_cat("groups are nested deeper than ", kMaxRegexNesting, " levels (the limit on regex nesting)"));
      NodePtr inner = parse_alt();
      if (!peek(')')) bad("missing ')'");
      ++i_;
      --depth_;
      return inner;
    }
    if (c == '[') {
      ++i_;
      return parse_class();
    }
    if (c == '.') {
      ++i_;
      return chars_node(complement({{'\n', '\n'}}));
    }
    if (c == '\\') {
      ++i_;
      return chars_node(escape());
    }
    if (c == '^' || c == '$') unsupported("an anchor (^ or $) inside the pattern");
    if (c == '*' || c == '+' || c == '?') bad("a quantifier with nothing to repeat");
    if (c == ')') bad("unbalanced ')'");
    const uint32_t cp = next_codepoint();
    return chars_node({{cp, cp}});
  }

  std::string_view p_;
  std::string_view what_;
  size_t i_ = 0;
  int depth_ = 0;  // groups open at i_
};

// The escaped spelling JSON needs for a code point inside a string, or
// empty when it may appear as itself.
std::string json_escape(uint32_t cp) {
  if (cp == '"') return "\\\"";
  if (cp == '\\') return "\\\\";
  if (cp == '\n') return "\\n";
  if (cp == '\t') return "\\t";
  if (cp == '\r') return "\\r";
  if (cp < 0x20) {
    static const char* kHex = "0123456789abcdef";
    return std::string("\\u00") + kHex[cp >> 4] + kHex[cp & 15];
  }
  return "";
}

class Emitter {
 public:
  Emitter(NfaBuilder& b, const RegexOptions& o) : b_(b), o_(o) {}

  int32_t build(const Node& n, int32_t next) {
    if (next == kEmpty) return kEmpty;
    switch (n.kind) {
      case Node::Kind::kChars: return chars(n.chars, next);
      case Node::Kind::kSeq: {
        int32_t cur = next;
        for (size_t k = n.kids.size(); k-- > 0;) cur = build(*n.kids[k], cur);
        return cur;
      }
      case Node::Kind::kAlt: {
        std::vector<int32_t> starts;
        for (const auto& k : n.kids) starts.push_back(build(*k, next));
        return b_.alt(starts);
      }
      case Node::Kind::kRepeat:
        return b_.repeat([&](int32_t nx) { return build(*n.kids[0], nx); }, n.min, n.max, next, o_.what);
    }
    return kEmpty;
  }

 private:
  int32_t chars(const Ranges& r, int32_t next) {
    std::vector<int32_t> starts;
    for (auto [a, b] : r) {
      if (o_.json_string) {
        // Escaped forms for the code points JSON may not write bare.
        for (uint32_t cp = a; cp <= std::min<uint32_t>(b, 0x5C); ++cp) {
          std::string e = json_escape(cp);
          if (!e.empty()) starts.push_back(b_.literal(e, next));
        }
        // Bare: >= 0x20, minus '"' and '\'.
        const Ranges bare = {{0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0x10FFFF}};
        for (auto [x, y] : bare) {
          const uint32_t lo = std::max(a, x), hi = std::min(b, y);
          if (lo <= hi) starts.push_back(b_.codepoint_range(lo, hi, next));
        }
      } else {
        starts.push_back(b_.codepoint_range(a, b, next));
      }
    }
    return b_.alt(starts);
  }

  NfaBuilder& b_;
  const RegexOptions& o_;
};

}  // namespace

int32_t compile_regex(NfaBuilder& builder, std::string_view pattern, int32_t next, const RegexOptions& options) {
  Parser parser(pattern, options.what);
  NodePtr root = parser.parse();
  Emitter emitter(builder, options);
  return emitter.build(*root, next);
}

}  // namespace shardlm::grammar
