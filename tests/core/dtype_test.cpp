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

TEST(DType, F8E4M3DecodesAndRoundsToNearestEven) {
  EXPECT_EQ(f8e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(f8e4m3_to_f32(0xc0), -2.0f);
  EXPECT_EQ(f8e4m3_to_f32(0x7e), 448.0f);           // largest finite
  EXPECT_EQ(f8e4m3_to_f32(0x01), 0.001953125f);     // smallest subnormal, 2^-9
  EXPECT_EQ(f8e4m3_to_f32(0x08), 0.015625f);        // smallest normal, 2^-6
  EXPECT_TRUE(std::isnan(f8e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(f8e4m3_to_f32(0xff)));
  EXPECT_EQ(f32_to_f8e4m3(1.0f), 0x38);
  EXPECT_EQ(f32_to_f8e4m3(1.0625f), 0x38);   // halfway 1 .. 1.125: to even
  EXPECT_EQ(f32_to_f8e4m3(1.1875f), 0x3a);   // halfway 1.125 .. 1.25: to even
  EXPECT_EQ(f32_to_f8e4m3(1000.0f), 0x7e);   // saturates
  EXPECT_EQ(f32_to_f8e4m3(-1e9f), 0xfe);
  EXPECT_EQ(f32_to_f8e4m3(0.0009765625f), 0x00);  // 2^-10: halfway 0 .. 2^-9, to even
  EXPECT_EQ(f32_to_f8e4m3(0.00146484375f), 0x01);  // 1.5 * 2^-10 rounds up to 2^-9
  EXPECT_EQ(f32_to_f8e4m3(0.0146484375f), 0x08);   // rounds up from subnormal into the first binade
  EXPECT_EQ(f32_to_f8e4m3(NAN), 0x7f);
  for (int bits = 0; bits < 256; ++bits) {
    if ((bits & 0x7f) == 0x7f) continue;
    EXPECT_EQ(f32_to_f8e4m3(f8e4m3_to_f32(static_cast<uint8_t>(bits))), bits) << bits;
  }
}

TEST(DType, SafetensorsNamesOfStorageDtypes) {
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3, DType::kI32, DType::kI8, DType::kU8}) {
    DType back;
    ASSERT_TRUE(parse_safetensors_dtype(dtype_safetensors_name(d), &back)) << dtype_safetensors_name(d);
    EXPECT_EQ(back, d);
  }
  EXPECT_EQ(dtype_size(DType::kF8E4M3), 1u);
  EXPECT_EQ(dtype_size(DType::kI32), 4u);
  DType d;
  EXPECT_FALSE(parse_safetensors_dtype("I64", &d));
  EXPECT_FALSE(parse_safetensors_dtype("bf16", &d));  // the exact safetensors spelling only
  // A compute dtype cannot be a storage dtype: torch_dtype "int32" is refused.
  EXPECT_FALSE(parse_dtype("int32", &d));
  EXPECT_FALSE(parse_dtype("I8", &d));
  EXPECT_FALSE(is_compute_dtype(DType::kF8E4M3));
  EXPECT_TRUE(is_compute_dtype(DType::kBF16));
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
