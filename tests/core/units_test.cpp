#include "core/units.h"

#include "core/error.h"

#include <gtest/gtest.h>

namespace shardlm {
namespace {

TEST(Units, FormatsBytesInNamedUnits) {
  EXPECT_EQ(with_commas(4976698672), "4,976,698,672");
  EXPECT_EQ(with_commas(0), "0");
  EXPECT_EQ(with_commas(-1234), "-1,234");
  EXPECT_EQ(format_gib(1073741824.0), "1.00 GiB");
  EXPECT_EQ(format_gb(15231233024.0), "15.23 GB");
}

}  // namespace
}  // namespace shardlm

namespace shardlm {
namespace {

TEST(Units, ParsesSizesWithNamedUnits) {
  EXPECT_EQ(parse_bytes("4GiB", "--x"), int64_t{4} << 30);
  EXPECT_EQ(parse_bytes("512MiB", "--x"), int64_t{512} << 20);
  EXPECT_EQ(parse_bytes("2GB", "--x"), 2000000000);
  EXPECT_EQ(parse_bytes("1.5G", "--x"), int64_t{3} << 29);
  EXPECT_EQ(parse_bytes("1048576", "--x"), 1048576);
  EXPECT_THROW(parse_bytes("lots", "--x"), Error);
  EXPECT_THROW(parse_bytes("4 parsecs", "--x"), Error);
  EXPECT_THROW(parse_bytes("-1GiB", "--x"), Error);
}

}  // namespace
}  // namespace shardlm
