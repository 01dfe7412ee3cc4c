#include <gtest/gtest.h>

#include "engine/stop_strings.h"

namespace shardlm {
namespace {

TEST(StopStrings, HoldsBackPossibleStartAndCutsBeforeMatch) {
  StopStringMatcher m({"END"}, false);
  std::string out;
  out += m.push("hello E");
  EXPECT_EQ(out, "hello");  // "E" (and the space) may start "END"
  out += m.push("N");
  EXPECT_FALSE(m.stopped());
  out += m.push("Dxyz");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(*m.matched(), "END");
  EXPECT_EQ(out, "hello ");
  EXPECT_EQ(m.push("more"), "");
}

TEST(StopStrings, IncludeInOutputAndFlush) {
  StopStringMatcher m({"ab", "zzz"}, true);
  EXPECT_EQ(m.push("xxab") + m.flush(), "xxab");
  StopStringMatcher n({"zzz"}, false);
  std::string out = n.push("abz");
  out += n.push("z");
  out += n.flush();  // finished for another reason: release everything
  EXPECT_EQ(out, "abzz");
  EXPECT_FALSE(n.stopped());
}

TEST(StopStrings, EarliestMatchWinsAndUtf8IsNotSplit) {
  StopStringMatcher m({"cd", "bcdef"}, false);
  EXPECT_EQ(m.push("abcdefg"), "a");
  StopStringMatcher u({"xyz"}, false);
  std::string out = u.push("a\xC3\xA9");  // 'a' + é: holding 2 bytes would split é
  EXPECT_EQ(out, "a");
  out += u.flush();
  EXPECT_EQ(out, "a\xC3\xA9");
}

TEST(StopStrings, NoCheckBeforeMinTokens) {
  StopStringMatcher m({"ab"}, false);
  std::string out = m.push("xab", /*check=*/false);
  EXPECT_FALSE(m.stopped());
  out += m.push("c");
  out += m.flush();
  EXPECT_EQ(out, "xabc");
}

}  // namespace
}  // namespace shardlm
