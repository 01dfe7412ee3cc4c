#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>

namespace shardlm {
namespace {

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.00390625f), 0x3f80);
  // 1 + 3*2^-8 is halfway: rounds up to the even mantissa 0x3f82.
  EXPECT_EQ(f32_to_bf16(1.01171875f), 0x3f82);
  EXPECT_FLOAT_EQ(bf16_to_f32(0xc040), -3.0f);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(DType, F16RoundTripsKnownValues) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(1e6f), 0x7c00);
  EXPECT_EQ(f32_to_f16(5.9604645e-8f), 0x0001);  // smallest subnormal
  EXPECT_FLOAT_EQ(f16_to_f32(0x0001), 5.9604645e-8f);
  EXPECT_FLOAT_EQ(f16_to_f32(0x3555), 0.333251953125f);
  for (int bits = 0; bits < 0x7c00; bits += 7) {
    EXPECT_EQ(f32_to_f16(f16_to_f32(static_cast<uint16_t>(bits))), bits);
  }
}

TEST(DType, ParsesEverySpelling) {
  DType d;
  ASSERT_TRUE(parse_dtype("bfloat16", &d));
  EXPECT_EQ(d, DType::kBF16);
  ASSERT_TRUE(parse_dtype("F16", &d));
  EXPECT_EQ(d, DType::kF16);
  ASSERT_TRUE(parse_dtype("fp32", &d));
  EXPECT_EQ(d, DType::kF32);
  EXPECT_FALSE(parse_dtype("int8", &d));
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
}

}  // namespace
}  // namespace shardlm
