// Lexer and parser for the Jinja subset. The lexer reproduces jinja2 3.x's
// whitespace rules exactly, because that is where renderings usually diverge:
//   - newlines are normalised to \n and one trailing newline of the source is dropped;
//   - `{%-`/`{{-`/`{#-` strip all whitespace before the tag, `-%}`/`-}}`/`-#}` all after;
//   - trim_blocks: one \n right after `%}` or `#}` is dropped (not after `}}`; `+%}` keeps it);
//   - lstrip_blocks: spaces/tabs between the start of a line and `{%` or `{#` are dropped
//     (not before `{{`; `{%+` keeps them).
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "tokenizer/chat_template/ast.h"

namespace shardlm::chat_template {
namespace {

enum class Tok { kData, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEof };

struct Token {
  Tok kind;
  std::string text;  // data, name, operator, decoded string literal
  int line = 0;
  Value value;  // kInt / kFloat
};

[[noreturn]] void syntax_error(int line, const std::string& what) {
  fail(ErrorCode::kInvalidArgument, "chat template line ", line, ": ", what);
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Number of bytes of Python whitespace (str.isspace) starting at s[i], 0 if none.
size_t space_len_at(std::string_view s, size_t i) {
  unsigned char c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return is_python_space(c) ? 1 : 0;
  size_t n = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
  if (i + n > s.size()) return 0;
  std::u32string cp = utf8_decode(s.substr(i, n));
  return cp.size() == 1 && is_python_space(cp[0]) ? n : 0;
}

std::string rstrip_python(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    if (space_len_at(s, start) != end - start) break;
    end = start;
  }
  return std::string(s.substr(0, end));
}

size_t skip_python_space(std::string_view s, size_t i) {
  while (i < s.size()) {
    size_t n = space_len_at(s, i);
    if (!n) break;
    i += n;
  }
  return i;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Python's "unicode-escape" decoding, which jinja2 applies to string literals.
std::string decode_string_literal(std::string_view raw, int line) {
  std::string out;
  for (size_t i = 0; i < raw.size(); ++i) {
    char c = raw[i];
    if (c != '\\' || i + 1 == raw.size()) {
      out += c;
      continue;
    }
    char e = raw[++i];
    switch (e) {
      case '\n': break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'v': out += '\v'; break;
      case 'x':
      case 'u':
      case 'U': {
        size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        char32_t cp = 0;
        for (size_t k = 0; k < n; ++k) {
          int h = i + 1 + k < raw.size() ? hex_value(raw[i + 1 + k]) : -1;
          if (h < 0) syntax_error(line, str_cat("truncated \\", e, " escape in string literal"));
          cp = cp * 16 + static_cast<char32_t>(h);
        }
        if (cp > 0x10FFFF) syntax_error(line, "\\U escape out of range in string literal");
        i += n;
        utf8_append(out, cp);
        break;
      }
      case 'N':
        syntax_error(line, "\\N{...} escapes in string literals are not supported; write the character itself");
      default:
        if (e >= '0' && e <= '7') {
          char32_t cp = static_cast<char32_t>(e - '0');
          for (int k = 0; k < 2 && i + 1 < raw.size() && raw[i + 1] >= '0' && raw[i + 1] <= '7'; ++k)
            cp = cp * 8 + static_cast<char32_t>(raw[++i] - '0');
          utf8_append(out, cp);
        } else {
          out += '\\';
          out += e;
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string_view source) {
    // Normalise \r\n and \r to \n, then drop one trailing newline (keep_trailing_newline=False).
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_ += source[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Token> run() {
    const size_t n = src_.size();
    bool line_starting = true;
    while (pos_ < n) {
      size_t start = find_tag(pos_);
      if (start == std::string::npos) {
        emit(Tok::kData, src_.substr(pos_), line_);
        advance_to(n);
        break;
      }
      char kind = src_[start + 1];
      char sign = start + 2 < n && (src_[start + 2] == '-' || src_[start + 2] == '+') ? src_[start + 2] : 0;
      std::string text = src_.substr(pos_, start - pos_);
      int text_line = line_;
      strip_before_tag(text, sign, kind != '{', line_starting);
      if (!text.empty()) emit(Tok::kData, std::move(text), text_line);
      advance_to(start + 2 + (sign ? 1 : 0));
      if (kind == '%' && lex_raw()) {
        // {% raw %}...{% endraw %} became one data token
      } else if (kind == '#') {
        size_t end = src_.find("#}", pos_);
        if (end == std::string::npos) syntax_error(line_, "missing end of comment tag '#}'");
        char before = end > pos_ ? src_[end - 1] : 0;
        size_t after = end + 2;
        if (before == '-') after = skip_python_space(src_, after);
        else if (before != '+' && after < n && src_[after] == '\n') ++after;
        advance_to(after);
      } else {
        lex_tag(kind == '%');
      }
      line_starting = src_[pos_ - 1] == '\n';
    }
    emit(Tok::kEof, "", line_);
    return std::move(tokens_);
  }

 private:
  // Whitespace control for the text before a tag: '-' strips all trailing whitespace;
  // lstrip_blocks strips spaces between the line start and a block or comment tag.
  static void strip_before_tag(std::string& text, char sign, bool is_block, bool line_starting) {
    if (sign == '-') {
      text = rstrip_python(text);
    } else if (sign != '+' && is_block) {
      size_t nl = text.rfind('\n');
      size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting) && l_pos < text.size() && skip_python_space(text, l_pos) == text.size())
        text.resize(l_pos);
    }
  }

  // At pos_ just after "{%" (and its sign): if this is `raw %}`, consumes through the
  // matching `{% endraw %}`, emits the raw text as data and returns true.
  bool lex_raw() {
    const size_t n = src_.size();
    size_t p = pos_;
    while (p < n && is_space(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    size_t q = p;
    while (q < n && is_space(src_[q])) ++q;
    if (q == p && q < n && src_[q] != '-' && src_[q] != '%') return false;  // e.g. {% rawness %}
    bool dash = src_.compare(q, 3, "-%}") == 0;
    if (!dash && src_.compare(q, 2, "%}") != 0) return false;
    int begin_line = line_;
    size_t body = dash ? skip_python_space(src_, q + 3) : q + 2;
    bool line_starting = src_[body - 1] == '\n';
    for (size_t s = src_.find("{%", body); s != std::string::npos; s = src_.find("{%", s + 2)) {
      size_t e = s + 2;
      char sign = e < n && (src_[e] == '-' || src_[e] == '+') ? src_[e] : 0;
      if (sign) ++e;
      while (e < n && is_space(src_[e])) ++e;
      if (src_.compare(e, 6, "endraw") != 0) continue;
      e += 6;
      while (e < n && is_space(src_[e])) ++e;
      size_t after;
      if (src_.compare(e, 3, "+%}") == 0) after = e + 3;
      else if (src_.compare(e, 3, "-%}") == 0) after = skip_python_space(src_, e + 3);
      else if (src_.compare(e, 2, "%}") == 0) after = e + 2 < n && src_[e + 2] == '\n' ? e + 3 : e + 2;
      else continue;
      std::string text = src_.substr(body, s - body);
      strip_before_tag(text, sign, true, line_starting);
      advance_to(body);
      if (!text.empty()) emit(Tok::kData, std::move(text), line_);
      advance_to(after);
      return true;
    }
    syntax_error(begin_line, "missing end of raw directive '{% endraw %}'");
  }

  size_t find_tag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    }
    return std::string::npos;
  }

  void advance_to(size_t p) {
    line_ += static_cast<int>(std::count(src_.begin() + static_cast<long>(pos_), src_.begin() + static_cast<long>(p), '\n'));
    pos_ = p;
  }

  void emit(Tok kind, std::string text, int line, Value value = Value()) {
    tokens_.push_back(Token{kind, std::move(text), line, std::move(value)});
  }

  bool at(const char* s) const { return src_.compare(pos_, std::strlen(s), s) == 0; }

  void lex_tag(bool block) {
    const size_t n = src_.size();
    int begin_line = line_;
    emit(block ? Tok::kBlockBegin : Tok::kVarBegin, "", line_);
    std::vector<char> balance;
    while (true) {
      size_t p = pos_;
      while (p < n && is_space(src_[p])) ++p;
      advance_to(p);
      if (pos_ >= n)
        syntax_error(begin_line, block ? "unexpected end of template: block tag '{%' is never closed with '%}'"
                                       : "unexpected end of template: '{{' is never closed with '}}'");
      if (balance.empty()) {
        if (block) {
          if (at("-%}")) {
            emit(Tok::kBlockEnd, "", line_);
            advance_to(skip_python_space(src_, pos_ + 3));
            return;
          }
          if (at("+%}")) {
            emit(Tok::kBlockEnd, "", line_);
            advance_to(pos_ + 3);
            return;
          }
          if (at("%}")) {
            emit(Tok::kBlockEnd, "", line_);
            advance_to(pos_ + 2 < n && src_[pos_ + 2] == '\n' ? pos_ + 3 : pos_ + 2);
            return;
          }
        } else {
          if (at("-}}")) {
            emit(Tok::kVarEnd, "", line_);
            advance_to(skip_python_space(src_, pos_ + 3));
            return;
          }
          if (at("}}")) {
            emit(Tok::kVarEnd, "", line_);
            advance_to(pos_ + 2);
            return;
          }
        }
      }
      lex_token(balance);
    }
  }

  void lex_token(std::vector<char>& balance) {
    const size_t n = src_.size();
    char c = src_[pos_];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t e = pos_;
      while (e < n && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
      emit(Tok::kName, src_.substr(pos_, e - pos_), line_);
      advance_to(e);
      return;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      lex_number();
      return;
    }
    if (c == '\'' || c == '"') {
      size_t e = pos_ + 1;
      while (e < n && src_[e] != c) e += src_[e] == '\\' ? 2 : 1;
      if (e >= n) syntax_error(line_, "unterminated string literal");
      std::string raw = src_.substr(pos_ + 1, e - pos_ - 1);
      emit(Tok::kString, decode_string_literal(raw, line_), line_);
      advance_to(e + 1);
      return;
    }
    static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "/", "*", "%", "~", "[", "]",
                                 "(", ")", "{", "}", "<", ">", "=", ".", ":", "|", ",", ";"};
    for (const char* op : kOps) {
      if (!at(op)) continue;
      char o = op[0];
      if (op[1] == 0 && (o == '(' || o == '[' || o == '{')) balance.push_back(o == '(' ? ')' : o == '[' ? ']' : '}');
      if (op[1] == 0 && (o == ')' || o == ']' || o == '}')) {
        if (balance.empty()) syntax_error(line_, str_cat("unexpected '", o, "'"));
        if (balance.back() != o) syntax_error(line_, str_cat("unexpected '", o, "', expected '", balance.back(), "'"));
        balance.pop_back();
      }
      emit(Tok::kOp, op, line_);
      advance_to(pos_ + std::strlen(op));
      return;
    }
    syntax_error(line_, str_cat("unexpected character '", c, "'"));
  }

  void lex_number() {
    const size_t n = src_.size();
    auto digits = [&](size_t p, bool (*ok)(char)) {
      // digits with single underscores between them, as Python allows
      size_t e = p;
      while (e < n && (ok(src_[e]) || (src_[e] == '_' && e > p && e + 1 < n && ok(src_[e + 1])))) ++e;
      return e;
    };
    auto dec = [](char ch) { return ch >= '0' && ch <= '9'; };
    auto strip = [](std::string s) {
      s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
      return s;
    };
    char x = pos_ + 1 < n ? static_cast<char>(std::tolower(static_cast<unsigned char>(src_[pos_ + 1]))) : 0;
    if (src_[pos_] == '0' && (x == 'x' || x == 'o' || x == 'b')) {
      int base = x == 'x' ? 16 : x == 'o' ? 8 : 2;
      size_t e = pos_ + 2;
      while (e < n && (src_[e] == '_' || (hex_value(src_[e]) >= 0 && hex_value(src_[e]) < base))) ++e;
      std::string body = strip(src_.substr(pos_ + 2, e - pos_ - 2));
      if (body.empty()) syntax_error(line_, "malformed integer literal");
      errno = 0;
      long long v = std::strtoll(body.c_str(), nullptr, base);
      if (errno == ERANGE) syntax_error(line_, "integer literal does not fit in 64 bits");
      emit(Tok::kInt, src_.substr(pos_, e - pos_), line_, Value(static_cast<int64_t>(v)));
      advance_to(e);
      return;
    }
    size_t e = digits(pos_, dec);
    bool is_float = false;
    if (e + 1 < n && src_[e] == '.' && dec(src_[e + 1])) {
      e = digits(e + 1, dec);
      is_float = true;
    }
    if (e < n && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t p = e + 1;
      if (p < n && (src_[p] == '+' || src_[p] == '-')) ++p;
      if (p < n && dec(src_[p])) {
        e = digits(p, dec);
        is_float = true;
      }
    }
    std::string text = strip(src_.substr(pos_, e - pos_));
    if (!is_float && text.size() > 1 && text[0] == '0' && text.find_first_not_of('0') != std::string::npos)
      syntax_error(line_, "leading zeros in integer literals are not permitted: " + text);
    if (is_float) {
      emit(Tok::kFloat, text, line_, Value(std::strtod(text.c_str(), nullptr)));
    } else {
      errno = 0;
      long long v = std::strtoll(text.c_str(), nullptr, 10);
      if (errno == ERANGE) syntax_error(line_, "integer literal does not fit in 64 bits");
      emit(Tok::kInt, text, line_, Value(static_cast<int64_t>(v)));
    }
    advance_to(e);
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

const char* describe(Tok kind) {
  switch (kind) {
    case Tok::kData: return "template text";
    case Tok::kVarBegin: return "'{{'";
    case Tok::kVarEnd: return "'}}'";
    case Tok::kBlockBegin: return "'{%'";
    case Tok::kBlockEnd: return "'%}'";
    case Tok::kName: return "name";
    case Tok::kString: return "string";
    case Tok::kInt: return "integer";
    case Tok::kFloat: return "float";
    case Tok::kOp: return "operator";
    case Tok::kEof: return "end of template";
  }
  return "?";
}

class Parser {
 public:
  Parser(std::vector<Token> tokens, const Limits& limits) : toks_(std::move(tokens)), limits_(limits) {}

  Body parse() {
    Body body = subparse({});
    if (cur().kind != Tok::kEof) syntax_error(cur().line, "unexpected '" + cur().text + "' tag");
    return body;
  }

 private:
  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser) : p(parser) {
      if (++p.depth_ > p.limits_.max_nesting)
        syntax_error(p.cur().line, str_cat("template nests deeper than ", p.limits_.max_nesting, " levels"));
    }
    ~DepthGuard() { --p.depth_; }
  };

  const Token& cur() const { return toks_[i_]; }
  const Token& peek(size_t k = 1) const { return toks_[std::min(i_ + k, toks_.size() - 1)]; }
  void next() {
    if (i_ + 1 < toks_.size()) ++i_;
  }
  bool is_op(const char* op) const { return cur().kind == Tok::kOp && cur().text == op; }
  bool is_name(const char* name) const { return cur().kind == Tok::kName && cur().text == name; }
  std::string found() const {
    const Token& t = cur();
    if (t.kind == Tok::kName || t.kind == Tok::kOp) return "'" + t.text + "'";
    return describe(t.kind);
  }
  void expect_op(const char* op) {
    if (!is_op(op)) syntax_error(cur().line, str_cat("expected '", op, "', found ", found()));
    next();
  }
  void expect(Tok kind) {
    if (cur().kind != kind) syntax_error(cur().line, str_cat("expected ", describe(kind), ", found ", found()));
    next();
  }
  std::string expect_name(const char* what) {
    if (cur().kind != Tok::kName) syntax_error(cur().line, str_cat("expected ", what, ", found ", found()));
    std::string name = cur().text;
    next();
    return name;
  }

  // Appends an operand (null: an omitted one) to `parent`, keeping its height,
  // and refuses a tree that, with the blocks and expressions the parser is
  // inside (depth_), would nest deeper than max_nesting: a left-deep chain
  // (`1+1+...`, `x.a.a...`, `f()()...`) is built by a loop here but is a tree
  // as deep as it is long, and evaluating or freeing it recurses per level.
  // Checked as each level is added, so no tree past the limit ever exists.
  void add_arg(Expr& parent, ExprPtr child) {
    if (child) {
      parent.height = std::max(parent.height, child->height + 1);
      if (parent.height + depth_ > limits_.max_nesting)
        syntax_error(parent.line, str_cat("expression nests deeper than ", limits_.max_nesting,
                                          " levels (Limits::max_nesting; a chain of operators, attributes, "
                                          "subscripts, calls or filters counts one level per link)"));
    }
    parent.args.push_back(std::move(child));
  }

  ExprPtr make(ExprKind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  // Statements up to `{% <one of end_tags>`; leaves cur() at that name (after '{%').
  Body subparse(std::initializer_list<const char*> end_tags) {
    DepthGuard guard(*this);
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.kind == Tok::kEof) {
        if (end_tags.size() == 0) return body;
        std::string expected;
        for (const char* e : end_tags) expected += std::string(expected.empty() ? "" : " or ") + "'" + e + "'";
        syntax_error(t.line, "unexpected end of template, expected " + expected);
      }
      if (t.kind == Tok::kData) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kText;
        s->line = t.line;
        s->text = t.text;
        body.push_back(std::move(s));
        next();
      } else if (t.kind == Tok::kVarBegin) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kPrint;
        s->line = t.line;
        next();
        s->expr = parse_tuple(true);
        expect(Tok::kVarEnd);
        body.push_back(std::move(s));
      } else if (t.kind == Tok::kBlockBegin) {
        next();
        if (cur().kind != Tok::kName) syntax_error(cur().line, "expected a tag name after '{%', found " + found());
        for (const char* e : end_tags)
          if (cur().text == e) return body;
        body.push_back(parse_statement(end_tags));
      } else {
        syntax_error(t.line, "unexpected " + std::string(describe(t.kind)));
      }
    }
  }

  StmtPtr parse_statement(std::initializer_list<const char*> end_tags) {
    const std::string& tag = cur().text;
    int line = cur().line;
    auto s = std::make_unique<Stmt>();
    s->line = line;
    if (tag == "if") {
      s->kind = StmtKind::kIf;
      next();
      while (true) {
        ExprPtr test = parse_tuple(false);
        expect(Tok::kBlockEnd);
        Body body = subparse({"elif", "else", "endif"});
        s->branches.emplace_back(std::move(test), std::move(body));
        if (is_name("elif")) {
          next();
          continue;
        }
        if (is_name("else")) {
          next();
          expect(Tok::kBlockEnd);
          s->else_body = subparse({"endif"});
        }
        break;
      }
      next();  // endif
    } else if (tag == "for") {
      s->kind = StmtKind::kFor;
      next();
      s->targets = parse_targets();
      if (!is_name("in")) syntax_error(cur().line, "expected 'in' in for loop, found " + found());
      next();
      s->expr = parse_tuple(false);
      if (is_name("if")) {
        next();
        s->filter = parse_expression(true);
      }
      if (is_name("recursive")) syntax_error(cur().line, "recursive for loops are not supported");
      expect(Tok::kBlockEnd);
      ++loop_depth_;
      s->body = subparse({"endfor", "else"});
      --loop_depth_;
      if (is_name("else")) {
        next();
        expect(Tok::kBlockEnd);
        s->else_body = subparse({"endfor"});
      }
      next();  // endfor
    } else if (tag == "set") {
      next();
      s->targets = parse_targets();
      if (s->targets.size() == 1 && is_op(".")) {
        next();
        s->attr = expect_name("an attribute name after '.'");
      }
      if (is_op("=")) {
        s->kind = StmtKind::kSet;
        next();
        s->expr = parse_tuple(true);
      } else {
        if (s->targets.size() != 1) syntax_error(line, "a block set takes exactly one target");
        s->kind = StmtKind::kSetBlock;
        expect(Tok::kBlockEnd);
        s->body = subparse({"endset"});
        next();  // endset
      }
    } else if (tag == "macro") {
      s->kind = StmtKind::kMacro;
      next();
      s->name = expect_name("a macro name");
      expect_op("(");
      while (!is_op(")")) {
        if (!s->params.empty()) expect_op(",");
        if (is_op(")")) break;
        MacroParam p;
        p.name = expect_name("a parameter name");
        if (is_op("=")) {
          next();
          p.default_value = parse_expression(true);
        } else if (!s->params.empty() && s->params.back().default_value) {
          syntax_error(cur().line, "non-default argument follows default argument");
        }
        s->params.push_back(std::move(p));
      }
      next();
      expect(Tok::kBlockEnd);
      int saved_loop_depth = loop_depth_;  // a macro body is not inside the caller's loop
      loop_depth_ = 0;
      s->body = subparse({"endmacro"});
      loop_depth_ = saved_loop_depth;
      next();  // endmacro
      if (cur().kind == Tok::kName && cur().text == s->name) next();
    } else if (tag == "break" || tag == "continue") {
      s->kind = tag == "break" ? StmtKind::kBreak : StmtKind::kContinue;
      if (loop_depth_ == 0) syntax_error(line, "'" + tag + "' outside of a for loop");
      next();
    } else if (tag == "generation") {
      // transformers' AssistantTracker tag: marks assistant text, renders its body unchanged.
      s->kind = StmtKind::kIf;
      next();
      expect(Tok::kBlockEnd);
      auto always = make(ExprKind::kConst, line);
      always->value = Value(true);
      s->branches.emplace_back(std::move(always), subparse({"endgeneration"}));
      next();
    } else {
      bool is_end = false;
      for (const char* e : {"endif", "endfor", "endset", "endmacro", "else", "elif", "endgeneration"})
        if (tag == e) is_end = true;
      if (is_end) {
        std::string expected;
        for (const char* e : end_tags) expected += std::string(expected.empty() ? "" : " or ") + "'" + e + "'";
        syntax_error(line, "unexpected '" + tag + "'" +
                               (expected.empty() ? std::string() : ", expected " + expected));
      }
      syntax_error(line, "unknown or unsupported tag '" + tag +
                             "' (supported: if, for, set, macro, break, continue, generation)");
    }
    expect(Tok::kBlockEnd);
    return s;
  }

  // `x`, `a, b`, `(a, b)`: names bound by for / set.
  std::vector<std::string> parse_targets() {
    std::vector<std::string> names;
    bool parens = is_op("(");
    if (parens) next();
    while (true) {
      names.push_back(expect_name("a variable name"));
      if (!is_op(",")) break;
      next();
      if (parens && is_op(")")) break;
    }
    if (parens) expect_op(")");
    return names;
  }

  bool is_tuple_end() const {
    Tok k = cur().kind;
    return k == Tok::kVarEnd || k == Tok::kBlockEnd || k == Tok::kEof || is_op(")") || is_name("recursive");
  }

  ExprPtr parse_tuple(bool with_condexpr, bool explicit_parens = false) {
    int line = cur().line;
    std::vector<ExprPtr> args;
    bool is_tuple = false;
    while (true) {
      if (!args.empty()) expect_op(",");
      if (is_tuple_end()) break;
      args.push_back(with_condexpr ? parse_expression(true) : parse_or());
      if (is_op(","))
        is_tuple = true;
      else
        break;
    }
    if (!is_tuple) {
      if (!args.empty()) return std::move(args[0]);
      if (!explicit_parens) syntax_error(line, "expected an expression, found " + found());
    }
    auto e = make(ExprKind::kTuple, line);
    for (auto& a : args) add_arg(*e, std::move(a));
    return e;
  }

  ExprPtr parse_expression(bool with_condexpr) { return with_condexpr ? parse_condexpr() : parse_or(); }

  ExprPtr parse_condexpr() {
    DepthGuard guard(*this);
    ExprPtr expr1 = parse_or();
    while (is_name("if")) {
      int line = cur().line;
      next();
      ExprPtr expr2 = parse_or();
      ExprPtr expr3;
      if (is_name("else")) {
        next();
        expr3 = parse_condexpr();
      }
      auto e = make(ExprKind::kCondExpr, line);
      add_arg(*e, std::move(expr1));
      add_arg(*e, std::move(expr2));
      add_arg(*e, std::move(expr3));
      expr1 = std::move(e);
    }
    return expr1;
  }

  ExprPtr binary(ExprKind kind, ExprPtr left, ExprPtr right, int line, std::string op = "") {
    auto e = make(kind, line);
    e->name = std::move(op);
    add_arg(*e, std::move(left));
    add_arg(*e, std::move(right));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      int line = cur().line;
      next();
      left = binary(ExprKind::kOr, std::move(left), parse_and(), line);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      int line = cur().line;
      next();
      left = binary(ExprKind::kAnd, std::move(left), parse_not(), line);
    }
    return left;
  }

  ExprPtr parse_not() {
    DepthGuard guard(*this);
    if (is_name("not")) {
      auto e = make(ExprKind::kNot, cur().line);
      next();
      add_arg(*e, parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    int line = cur().line;
    ExprPtr expr = parse_math1();
    std::vector<std::string> ops;
    std::vector<ExprPtr> operands;
    while (true) {
      if (cur().kind == Tok::kOp && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                     cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
        ops.push_back(cur().text);
        next();
      } else if (is_name("in")) {
        ops.push_back("in");
        next();
      } else if (is_name("not") && peek().kind == Tok::kName && peek().text == "in") {
        ops.push_back("notin");
        next();
        next();
      } else {
        break;
      }
      operands.push_back(parse_math1());
    }
    if (ops.empty()) return expr;
    auto e = make(ExprKind::kCompare, line);
    add_arg(*e, std::move(expr));
    for (auto& o : operands) add_arg(*e, std::move(o));
    e->ops = std::move(ops);
    return e;
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = cur().text;
      int line = cur().line;
      next();
      left = binary(ExprKind::kBinary, std::move(left), parse_concat(), line, op);
    }
    return left;
  }

  ExprPtr parse_concat() {
    int line = cur().line;
    std::vector<ExprPtr> args;
    args.push_back(parse_math2());
    while (is_op("~")) {
      next();
      args.push_back(parse_math2());
    }
    if (args.size() == 1) return std::move(args[0]);
    auto e = make(ExprKind::kConcat, line);
    for (auto& a : args) add_arg(*e, std::move(a));
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = cur().text;
      int line = cur().line;
      next();
      left = binary(ExprKind::kBinary, std::move(left), parse_pow(), line, op);
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      int line = cur().line;
      next();
      left = binary(ExprKind::kBinary, std::move(left), parse_unary(true), line, "**");
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      node = make(is_op("-") ? ExprKind::kNeg : ExprKind::kPos, cur().line);
      next();
      add_arg(*node, parse_unary(false));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    int line = t.line;
    if (t.kind == Tok::kName) {
      auto e = make(ExprKind::kConst, line);
      if (t.text == "true" || t.text == "True") e->value = Value(true);
      else if (t.text == "false" || t.text == "False") e->value = Value(false);
      else if (t.text == "none" || t.text == "None") e->value = Value::none();
      else {
        e->kind = ExprKind::kName;
        e->name = t.text;
      }
      next();
      return e;
    }
    if (t.kind == Tok::kString) {
      std::string s;
      while (cur().kind == Tok::kString) {  // adjacent literals concatenate
        s += cur().text;
        next();
      }
      auto e = make(ExprKind::kConst, line);
      e->value = Value(std::move(s));
      return e;
    }
    if (t.kind == Tok::kInt || t.kind == Tok::kFloat) {
      auto e = make(ExprKind::kConst, line);
      e->value = t.value;
      next();
      return e;
    }
    if (is_op("(")) {
      next();
      ExprPtr e = parse_tuple(true, true);
      expect_op(")");
      return e;
    }
    if (is_op("[")) {
      next();
      auto e = make(ExprKind::kList, line);
      while (!is_op("]")) {
        if (!e->args.empty()) expect_op(",");
        if (is_op("]")) break;
        add_arg(*e, parse_expression(true));
      }
      next();
      return e;
    }
    if (is_op("{")) {
      next();
      auto e = make(ExprKind::kDict, line);
      while (!is_op("}")) {
        if (!e->args.empty()) expect_op(",");
        if (is_op("}")) break;
        add_arg(*e, parse_expression(true));
        expect_op(":");
        add_arg(*e, parse_expression(true));
      }
      next();
      return e;
    }
    syntax_error(line, "unexpected " + found() + " where an expression was expected");
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".")) {
        int line = cur().line;
        next();
        if (cur().kind == Tok::kName) {
          auto e = make(ExprKind::kGetAttr, line);
          e->name = cur().text;
          add_arg(*e, std::move(node));
          node = std::move(e);
        } else if (cur().kind == Tok::kInt) {
          auto idx = make(ExprKind::kConst, line);
          idx->value = cur().value;
          auto e = make(ExprKind::kGetItem, line);
          add_arg(*e, std::move(node));
          add_arg(*e, std::move(idx));
          node = std::move(e);
        } else {
          syntax_error(line, "expected an attribute name after '.', found " + found());
        }
        next();
      } else if (is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    int line = cur().line;
    next();  // [
    ExprPtr start, stop, step;
    if (!is_op(":")) {
      start = parse_expression(true);
      if (is_op(",")) {  // x[a, b]: a tuple key (never found in JSON data, so Undefined)
        auto key = make(ExprKind::kTuple, line);
        add_arg(*key, std::move(start));
        while (is_op(",")) {
          next();
          if (is_op("]")) break;
          add_arg(*key, parse_expression(true));
        }
        start = std::move(key);
      }
      if (!is_op(":")) {
        expect_op("]");
        auto e = make(ExprKind::kGetItem, line);
        add_arg(*e, std::move(node));
        add_arg(*e, std::move(start));
        return e;
      }
    }
    next();  // :
    if (!is_op("]") && !is_op(":")) stop = parse_expression(true);
    if (is_op(":")) {
      next();
      if (!is_op("]")) step = parse_expression(true);
    }
    expect_op("]");
    auto e = make(ExprKind::kSlice, line);
    add_arg(*e, std::move(node));
    add_arg(*e, std::move(start));
    add_arg(*e, std::move(stop));
    add_arg(*e, std::move(step));
    return e;
  }

  void parse_call_args(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) syntax_error(cur().line, "*args / **kwargs in calls are not supported");
      if (cur().kind == Tok::kName && peek().kind == Tok::kOp && peek().text == "=") {
        std::string key = cur().text;
        next();
        next();
        ExprPtr value = parse_expression(true);
        e.height = std::max(e.height, value->height + 1);
        if (e.height + depth_ > limits_.max_nesting)
          syntax_error(e.line, str_cat("expression nests deeper than ", limits_.max_nesting, " levels (Limits::max_nesting)"));
        e.kwargs.emplace_back(std::move(key), std::move(value));
      } else {
        if (!e.kwargs.empty()) syntax_error(cur().line, "positional argument follows keyword argument");
        add_arg(e, parse_expression(true));
      }
    }
    next();
  }

  ExprPtr parse_call(ExprPtr node) {
    auto e = make(ExprKind::kCall, cur().line);
    add_arg(*e, std::move(node));
    parse_call_args(*e);
    return e;
  }

  std::string parse_dotted_name(const char* what) {
    std::string name = expect_name(what);
    while (is_op(".") && peek().kind == Tok::kName) {
      next();
      name += "." + cur().text;
      next();
    }
    return name;
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|")) {
        int line = cur().line;
        next();
        auto e = make(ExprKind::kFilter, line);
        e->name = parse_dotted_name("a filter name after '|'");
        add_arg(*e, std::move(node));
        if (is_op("(")) parse_call_args(*e);
        node = std::move(e);
      } else if (is_name("is")) {
        int line = cur().line;
        next();
        auto e = make(ExprKind::kTest, line);
        if (is_name("not")) {
          e->negated = true;
          next();
        }
        e->name = parse_dotted_name("a test name after 'is'");
        add_arg(*e, std::move(node));
        Tok k = cur().kind;
        if (is_op("(")) {
          parse_call_args(*e);
        } else if ((k == Tok::kName || k == Tok::kString || k == Tok::kInt || k == Tok::kFloat || is_op("[") ||
                    is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          if (is_name("is")) syntax_error(cur().line, "you cannot chain multiple tests with 'is'");
          add_arg(*e, parse_postfix(parse_primary()));
        }
        node = std::move(e);
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  std::vector<Token> toks_;
  size_t i_ = 0;
  const Limits& limits_;
  int depth_ = 0;
  int loop_depth_ = 0;  // enclosing for-loop bodies, for break/continue
};

}  // namespace

Body parse_template(std::string_view source, const Limits& limits) {
  Lexer lexer(source);
  Parser parser(lexer.run(), limits);
  return parser.parse();
}

}  // namespace shardlm::chat_template
