#include "core/units.h"

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
