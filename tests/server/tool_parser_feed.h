// Feeding a tool-call parser a recorded output in pieces, for the parser
// tests: whole, byte by byte, or split at chosen offsets, all of which must
// give the same content and calls.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <vector>

#include "server/chat_output.h"
#include "server/tool_call_parser.h"

namespace shardlm::server::testing {

struct ParseResult {
  std::string content;
  std::vector<ToolCall> calls;
  bool called = false;
  std::vector<ToolCallDelta> deltas;
};

// Feeds `text` to `parser` in pieces cut at `cuts` (sorted offsets), then finishes it.
inline ParseResult feed_in_pieces(ToolCallParser& parser, const std::string& text, const std::vector<size_t>& cuts) {
  ParseResult r;
  auto take = [&](ToolParseDelta d) {
    r.content += d.content;
    r.deltas.insert(r.deltas.end(), d.tool_calls.begin(), d.tool_calls.end());
  };
  size_t at = 0;
  for (size_t cut : cuts) {
    take(parser.feed(std::string_view(text).substr(at, cut - at)));
    at = cut;
  }
  take(parser.feed(std::string_view(text).substr(at)));
  take(parser.finish());
  accumulate(r.deltas, &r.calls);
  r.called = parser.called();
  return r;
}

inline void expect_same(const ParseResult& a, const ParseResult& b, const std::string& where) {
  EXPECT_EQ(a.content, b.content) << where;
  ASSERT_EQ(a.calls.size(), b.calls.size()) << where;
  for (size_t i = 0; i < a.calls.size(); ++i) {
    EXPECT_EQ(a.calls[i].id, b.calls[i].id) << where;
    EXPECT_EQ(a.calls[i].name, b.calls[i].name) << where;
    EXPECT_EQ(a.calls[i].arguments, b.calls[i].arguments) << where;
  }
  EXPECT_EQ(a.called, b.called) << where;
}

}  // namespace shardlm::server::testing
