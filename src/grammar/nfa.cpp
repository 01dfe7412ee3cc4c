#include "grammar/nfa.h"

#include <algorithm>

#include "core/error.h"

namespace shardlm::grammar {

NfaBuilder::NfaBuilder() { accept_ = add_state(); }

int32_t NfaBuilder::add_state() {
  if (nfa_.edges.size() >= kMaxNfaStates)
    fail(ErrorCode::kUnsupported, "grammar is too large: it needs more than ", kMaxNfaStates,
         " automaton states; simplify the schema (fewer or smaller bounded repetitions, shallower nesting)");
  if (cancelled_ && (nfa_.edges.size() & 0xFFFF) == 0xFFFF && (*cancelled_)())
    fail(ErrorCode::kInvalidArgument, "grammar compilation was cancelled (the client has gone)");
  nfa_.edges.emplace_back();
  nfa_.eps.emplace_back();
  return static_cast<int32_t>(nfa_.edges.size() - 1);
}

void NfaBuilder::add_eps(int32_t from, int32_t to) { nfa_.eps[size_t(from)].push_back(to); }

void NfaBuilder::add_bytes(int32_t from, const ByteSet& bytes, int32_t to) {
  nfa_.edges[size_t(from)].push_back(NfaEdge{bytes, to});
}

int32_t NfaBuilder::literal(std::string_view bytes, int32_t next) {
  if (next == kEmpty) return kEmpty;
  int32_t cur = next;
  for (size_t i = bytes.size(); i-- > 0;) {
    ByteSet b;
    b.add(uint8_t(bytes[i]));
    cur = byte_of(b, cur);
  }
  return cur;
}

int32_t NfaBuilder::byte_of(const ByteSet& set, int32_t next) {
  if (next == kEmpty || set.empty()) return kEmpty;
  const int32_t s = add_state();
  add_bytes(s, set, next);
  return s;
}

int32_t NfaBuilder::alt(std::span<const int32_t> starts) {
  int32_t only = kEmpty;
  int n = 0;
  for (int32_t s : starts)
    if (s != kEmpty) {
      only = s;
      ++n;
    }
  if (n <= 1) return only;
  const int32_t hub = add_state();
  for (int32_t s : starts)
    if (s != kEmpty) add_eps(hub, s);
  return hub;
}

int32_t NfaBuilder::repeat(const std::function<int32_t(int32_t)>& body, int64_t min, int64_t max, int32_t next,
                           std::string_view what) {
  if (next == kEmpty) return kEmpty;
  if (min < 0 || (max >= 0 && max < min))
    fail(ErrorCode::kInvalidArgument, what, ": repetition bounds {", min, ",", max, "} are invalid (need 0 <= min <= max)");
  if (min > kMaxRepeat || max > kMaxRepeat)
    fail(ErrorCode::kUnsupported, what, ": a bound of ", std::max(min, max),
         " repetitions exceeds the grammar engine's limit of ", kMaxRepeat, "; use a smaller bound");
  int32_t cur = next;
  if (max < 0) {
    // loop: either leave, or one more copy and back to the loop.
    const int32_t loop = add_state();
    add_eps(loop, next);
    const int32_t b = body(loop);
    if (b != kEmpty) add_eps(loop, b);
    cur = loop;
  } else {
    for (int64_t i = min; i < max; ++i) {
      const int32_t b = body(cur);
      const int32_t pair[2] = {next, b};
      cur = alt(pair);
    }
  }
  for (int64_t i = 0; i < min; ++i) {
    cur = body(cur);
    if (cur == kEmpty) return kEmpty;
  }
  return cur;
}

void append_utf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(char(cp));
  } else if (cp < 0x800) {
    out->push_back(char(0xC0 | (cp >> 6)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(char(0xE0 | (cp >> 12)));
    out->push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(char(0xF0 | (cp >> 18)));
    out->push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  }
}

namespace {
int utf8_len(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }
}  // namespace

// [lo, hi] with both ends of the same encoded length (RE2's split): the range
// is cut until it is a fixed prefix followed by full continuation ranges.
void NfaBuilder::utf8_range(uint32_t lo, uint32_t hi, int32_t next, std::vector<int32_t>* starts) {
  const int n = utf8_len(lo);
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (uint32_t(1) << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_range(lo, lo | m, next, starts);
        utf8_range((lo | m) + 1, hi, next, starts);
        return;
      }
      if ((hi & m) != m) {
        utf8_range(lo, (hi & ~m) - 1, next, starts);
        utf8_range(hi & ~m, hi, next, starts);
        return;
      }
    }
  }
  std::string a, b;
  append_utf8(lo, &a);
  append_utf8(hi, &b);
  int32_t cur = next;
  for (size_t k = a.size(); k-- > 0;) {
    ByteSet s;
    s.add_range(uint8_t(a[k]), uint8_t(b[k]));
    cur = byte_of(s, cur);
  }
  starts->push_back(cur);
}

int32_t NfaBuilder::codepoint_range(uint32_t lo, uint32_t hi, int32_t next) {
  if (next == kEmpty) return kEmpty;
  hi = std::min<uint32_t>(hi, 0x10FFFF);
  std::vector<int32_t> starts;
  auto add = [&](uint32_t a, uint32_t b) {
    // split at the encoded-length boundaries
    static constexpr uint32_t kEdges[] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
    for (uint32_t e : kEdges) {
      if (a > b) return;
      if (a <= e) {
        const uint32_t top = std::min(b, e);
        utf8_range(a, top, next, &starts);
        a = top + 1;
      }
    }
  };
  if (lo <= hi) {
    if (hi < 0xD800 || lo > 0xDFFF) {
      add(lo, hi);
    } else {
      if (lo < 0xD800) add(lo, 0xD7FF);
      if (hi > 0xDFFF) add(0xE000, hi);
    }
  }
  return alt(starts);
}

Nfa NfaBuilder::finish(int32_t start, std::string_view what) {
  if (start == kEmpty)
    fail(ErrorCode::kInvalidArgument, what, ": the grammar matches no text at all (contradictory constraints)");
  nfa_.start = start;
  nfa_.accept = accept_;
  return std::move(nfa_);
}

}  // namespace shardlm::grammar
