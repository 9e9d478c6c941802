#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace dflash {
namespace {

TEST(Bf16, RoundsToNearestEven) {
  // 1 + 2^-8 is exactly halfway between bf16 neighbours 1 and 1 + 2^-7: ties go to the even (1).
  EXPECT_EQ(round_to_bf16(1.0f + std::ldexp(1.0f, -8)), 1.0f);
  // 1 + 3·2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even).
  EXPECT_EQ(round_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 1.0f + std::ldexp(1.0f, -6));
  // Just above the halfway point rounds up.
  EXPECT_EQ(round_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 1.0f + std::ldexp(1.0f, -7));
  EXPECT_TRUE(std::isnan(round_to_bf16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(round_to_bf16(-0.0f), 0.0f);
  EXPECT_TRUE(std::signbit(round_to_bf16(-0.0f)));
}

TEST(Bf16, BitsRoundTrip) {
  for (uint32_t bits = 0; bits < 0x10000; bits += 7) {
    const float f = bf16_bits_to_float(static_cast<uint16_t>(bits));
    if (std::isnan(f)) continue;
    EXPECT_EQ(float_to_bf16_bits(f), bits);
  }
}

TEST(F16, DecodesNormalsSubnormalsAndSpecials) {
  EXPECT_EQ(f16_bits_to_float(0x3c00), 1.0f);
  EXPECT_EQ(f16_bits_to_float(0xc000), -2.0f);
  EXPECT_EQ(f16_bits_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_bits_to_float(0x7bff), 65504.0f);
  EXPECT_TRUE(std::isinf(f16_bits_to_float(0x7c00)));
  EXPECT_TRUE(std::isnan(f16_bits_to_float(0x7e00)));
}

TEST(DType, NamesRoundTrip) {
  for (DType d : {DType::kBF16, DType::kF16, DType::kF32, DType::kF64, DType::kI32, DType::kI64, DType::kF8E4M3, DType::kU8}) {
    DType parsed;
    ASSERT_TRUE(parse_dtype(dtype_name(d), &parsed));
    EXPECT_EQ(parsed, d);
  }
  DType ignored;
  EXPECT_FALSE(parse_dtype("bf16", &ignored));  // safetensors spelling is upper case
}

}  // namespace
}  // namespace dflash
