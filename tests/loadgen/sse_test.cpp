#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "loadgen/sse.h"

namespace shardlm::loadgen {
namespace {

std::vector<std::string> parse_in_pieces(const std::string& stream, size_t piece) {
  std::vector<std::string> events;
  SseParser parser([&](std::string_view d) { events.emplace_back(d); });
  for (size_t i = 0; i < stream.size(); i += piece) parser.feed(std::string_view(stream).substr(i, piece));
  parser.finish();
  return events;
}

TEST(SseParser, SplitsAtAnyByteGiveTheSameEvents) {
  const std::string stream =
      "data: {\"a\":1}\n\n"
      ": ping comment\n\n"
      "event: message\r\ndata: {\"b\":\"x\\ny\"}\r\n\r\n"
      "data:no-space\n\n"
      "data: line1\ndata: line2\n\n"
      "data: [DONE]\n\n";
  const std::vector<std::string> expected = {"{\"a\":1}", "{\"b\":\"x\\ny\"}", "no-space", "line1\nline2",
                                             "[DONE]"};
  for (size_t piece : {1, 2, 3, 5, 7, 64, 4096}) EXPECT_EQ(parse_in_pieces(stream, piece), expected) << piece;
}

TEST(SseParser, DeliversATrailingEventWithoutBlankLine) {
  EXPECT_EQ(parse_in_pieces("data: x\n\ndata: last", 3), (std::vector<std::string>{"x", "last"}));
}

TEST(SseParser, IgnoresCommentsAndOtherFields) {
  EXPECT_TRUE(parse_in_pieces(": hello\n\nid: 3\nretry: 10\n\n", 4).empty());
}

}  // namespace
}  // namespace shardlm::loadgen
