// core/fp8.h: OCP E4M3 encoding (round to nearest even, saturate to ±448, NaN -> 0x7f), decoding,
// the per-row weight quantization and the per-token activation quantization (w8a8) of
// docs/spec/drafter.md §6. Expected codes come from a brute-force nearest-value search over the 254
// finite E4M3 values written here from the format's definition, not from the encoder under test;
// expected scales from the formulas, written out here.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "core/fp8.h"
#include "core/tensor.h"

namespace dflash {
namespace {

// E4M3 from its definition: sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent field 0 is
// subnormal (m/8 · 2^-6); S.1111.111 is NaN; no infinities.
double e4m3_definition(uint8_t code) {
  const int sign = code >> 7, exponent = (code >> 3) & 15, mantissa = code & 7;
  if (exponent == 15 && mantissa == 7) return std::numeric_limits<double>::quiet_NaN();
  const double magnitude = exponent == 0 ? (mantissa / 8.0) * std::pow(2.0, -6)
                                         : (1.0 + mantissa / 8.0) * std::pow(2.0, exponent - 7);
  return sign ? -magnitude : magnitude;
}

// Nearest finite E4M3 value to x, ties to the even code (mantissa LSB 0); |x| beyond 448 lands on
// ±448 because that is the nearest finite value (satfinite). Sign of zero follows x.
uint8_t brute_force_encode(float x) {
  const double a = std::fabs(static_cast<double>(x));
  int best = 0;
  double best_distance = std::numeric_limits<double>::infinity();
  for (int code = 0; code < 0x7f; ++code) {  // non-negative finite codes 0x00..0x7e
    const double distance = std::fabs(e4m3_definition(static_cast<uint8_t>(code)) - a);
    if (distance < best_distance || (distance == best_distance && (code & 1) == 0)) {
      best = code;
      best_distance = distance;
    }
  }
  return static_cast<uint8_t>((std::signbit(x) ? 0x80 : 0x00) | best);
}

TEST(E4M3, DecodeMatchesDefinitionForAllCodes) {
  for (int code = 0; code < 256; ++code) {
    const double expected = e4m3_definition(static_cast<uint8_t>(code));
    const float got = e4m3_to_float(static_cast<uint8_t>(code));
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(got)) << "code " << code;
    } else {
      EXPECT_EQ(static_cast<double>(got), expected) << "code " << code;
      EXPECT_EQ(std::signbit(got), (code & 0x80) != 0) << "code " << code;
    }
  }
  EXPECT_EQ(e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_float(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
}

TEST(E4M3, EveryFiniteCodeRoundTrips) {
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7f) == 0x7f) continue;  // NaN
    EXPECT_EQ(float_to_e4m3_satfinite(e4m3_to_float(static_cast<uint8_t>(code))), code) << "code " << code;
  }
}

TEST(E4M3, Saturation) {
  EXPECT_EQ(float_to_e4m3_satfinite(448.0f), 0x7e);
  EXPECT_EQ(float_to_e4m3_satfinite(449.0f), 0x7e);
  EXPECT_EQ(float_to_e4m3_satfinite(464.0f), 0x7e);  // halfway to the (NaN) slot above 448
  EXPECT_EQ(float_to_e4m3_satfinite(480.0f), 0x7e);
  EXPECT_EQ(float_to_e4m3_satfinite(1e30f), 0x7e);
  EXPECT_EQ(float_to_e4m3_satfinite(std::numeric_limits<float>::max()), 0x7e);
  EXPECT_EQ(float_to_e4m3_satfinite(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(float_to_e4m3_satfinite(-464.0f), 0xfe);
  EXPECT_EQ(float_to_e4m3_satfinite(-1e30f), 0xfe);
  EXPECT_EQ(float_to_e4m3_satfinite(-std::numeric_limits<float>::infinity()), 0xfe);
  // Below 448 the neighbours are 416 (0x7d) and 448 (0x7e): 432 is the tie and goes to the even
  // code 0x7e; one float below it goes down.
  EXPECT_EQ(float_to_e4m3_satfinite(416.0f), 0x7d);
  EXPECT_EQ(float_to_e4m3_satfinite(432.0f), 0x7e);
  EXPECT_EQ(float_to_e4m3_satfinite(std::nextafter(432.0f, 0.0f)), 0x7d);
  EXPECT_EQ(float_to_e4m3_satfinite(440.0f), 0x7e);
}

TEST(E4M3, Subnormals) {
  for (int k = 0; k <= 7; ++k) {  // k · 2^-9 is exact
    EXPECT_EQ(float_to_e4m3_satfinite(std::ldexp(static_cast<float>(k), -9)), k) << "k=" << k;
    EXPECT_EQ(float_to_e4m3_satfinite(-std::ldexp(static_cast<float>(k), -9)), 0x80 | k) << "k=" << k;
  }
  const float smallest = std::ldexp(1.0f, -9);
  EXPECT_EQ(float_to_e4m3_satfinite(smallest / 2), 0x00);  // tie between 0 and 2^-9: even (0)
  EXPECT_EQ(float_to_e4m3_satfinite(std::nextafter(smallest / 2, 1.0f)), 0x01);
  EXPECT_EQ(float_to_e4m3_satfinite(1.5f * smallest), 0x02);  // tie 1 vs 2: even (2)
  EXPECT_EQ(float_to_e4m3_satfinite(2.5f * smallest), 0x02);  // tie 2 vs 3: even (2)
  EXPECT_EQ(float_to_e4m3_satfinite(7.5f * smallest), 0x08);  // tie 7 vs 8 (smallest normal): even (8)
  EXPECT_EQ(float_to_e4m3_satfinite(std::ldexp(1.0f, -12)), 0x00);
  EXPECT_EQ(float_to_e4m3_satfinite(std::numeric_limits<float>::denorm_min()), 0x00);
  EXPECT_EQ(float_to_e4m3_satfinite(-std::numeric_limits<float>::denorm_min()), 0x80);
}

TEST(E4M3, TiesToEvenInTheNormalRange) {
  EXPECT_EQ(float_to_e4m3_satfinite(1.0625f), 0x38);  // 1 (0x38) vs 1.125 (0x39): 0x38
  EXPECT_EQ(float_to_e4m3_satfinite(1.1875f), 0x3a);  // 1.125 (0x39) vs 1.25 (0x3a): 0x3a
  EXPECT_EQ(float_to_e4m3_satfinite(1.9375f), 0x40);  // 1.875 (0x3f) vs 2 (0x40): 0x40, carries the exponent
  EXPECT_EQ(float_to_e4m3_satfinite(248.0f), 0x78);   // 240 (0x77) vs 256 (0x78): 0x78
  EXPECT_EQ(float_to_e4m3_satfinite(-1.0625f), 0xb8);
  EXPECT_EQ(float_to_e4m3_satfinite(std::nextafter(1.0625f, 2.0f)), 0x39);
  EXPECT_EQ(float_to_e4m3_satfinite(std::nextafter(1.0625f, 0.0f)), 0x38);
}

TEST(E4M3, SignedZeroAndNaN) {
  EXPECT_EQ(float_to_e4m3_satfinite(0.0f), 0x00);
  EXPECT_EQ(float_to_e4m3_satfinite(-0.0f), 0x80);
  EXPECT_TRUE(std::signbit(e4m3_to_float(0x80)));
  EXPECT_EQ(e4m3_to_float(0x80), 0.0f);
  EXPECT_EQ(float_to_e4m3_satfinite(std::numeric_limits<float>::quiet_NaN()), 0x7f);
  EXPECT_EQ(float_to_e4m3_satfinite(-std::numeric_limits<float>::quiet_NaN()), 0x7f);
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7f)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xff)));
}

// Every rounding boundary: each representable value, the midpoint to the next one (exact in float)
// and the floats on either side of it.
TEST(E4M3, EveryMidpointAndItsNeighbours) {
  for (int code = 0; code < 0x7e; ++code) {
    const float lo = e4m3_to_float(static_cast<uint8_t>(code));
    const float hi = e4m3_to_float(static_cast<uint8_t>(code + 1));
    const float mid = (lo + hi) / 2;
    for (float x : {lo, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f), hi}) {
      ASSERT_EQ(float_to_e4m3_satfinite(x), brute_force_encode(x)) << "x=" << x;
      ASSERT_EQ(float_to_e4m3_satfinite(-x), brute_force_encode(-x)) << "x=" << -x;
    }
  }
}

// Any float: the encoder agrees with the nearest-value search (NaN excluded: it has its own code).
RC_GTEST_PROP(E4M3Property, EncodesToTheNearestValueTiesToEven, (uint32_t bits)) {
  float x;
  std::memcpy(&x, &bits, sizeof x);
  RC_PRE(!std::isnan(x));
  RC_ASSERT(float_to_e4m3_satfinite(x) == brute_force_encode(x));
}

RC_GTEST_PROP(E4M3Property, EncodesSmallMagnitudesToTheNearestValue, ()) {
  // Most random bit patterns are huge or tiny; this draws inside E4M3's range instead.
  const int mantissa = *rc::gen::inRange(0, 1 << 23);
  const int exponent = *rc::gen::inRange(-12, 10);
  const bool negative = *rc::gen::arbitrary<bool>();
  const float x = std::ldexp(1.0f + static_cast<float>(mantissa) / (1 << 23), exponent) * (negative ? -1.0f : 1.0f);
  RC_ASSERT(float_to_e4m3_satfinite(x) == brute_force_encode(x));
}

TEST(QuantizeRows, ScalesCodesAndZeroRows) {
  // Row 0: max |w| = 2.5; row 1: all zero; row 2: negative max, with values that land on ties.
  Tensor w({3, 5}, {0.5f, -2.5f, 1.25f, 0.0f, 2.0f,  //
                    0.0f, 0.0f, -0.0f, 0.0f, 0.0f,   //
                    -3.0f, 1.0f, 0.1f, -0.001f, 3.0f});
  const QuantizedRows q = quantize_rows_e4m3(w);
  ASSERT_EQ(q.rows, 3);
  ASSERT_EQ(q.cols, 5);
  ASSERT_EQ(q.codes.size(), 15u);
  ASSERT_EQ(q.scales.size(), 3u);
  EXPECT_EQ(q.scales[0], 2.5f / 448.0f);
  EXPECT_EQ(q.scales[1], 1.0f);  // all-zero row
  EXPECT_EQ(q.scales[2], 3.0f / 448.0f);
  for (int64_t n = 0; n < 3; ++n) {
    const float inv = 1.0f / q.scales[n];  // the documented fp32 reciprocal and product
    for (int64_t k = 0; k < 5; ++k) {
      EXPECT_EQ(q.codes[n * 5 + k], brute_force_encode(w.row(n)[k] * inv)) << "n=" << n << " k=" << k;
    }
  }
  // The row maximum maps to ±448 (the product may round a hair past 448: satfinite).
  EXPECT_EQ(q.codes[1], 0xfe);
  EXPECT_EQ(q.codes[10], 0xfe);
  EXPECT_EQ(q.codes[14], 0x7e);
  EXPECT_EQ(q.codes[7], 0x80);  // -0 stays -0 in an all-zero row
  const Tensor decoded = decode_e4m3_codes(q);
  ASSERT_EQ(decoded.shape, (std::vector<int64_t>{3, 5}));
  for (size_t i = 0; i < q.codes.size(); ++i) EXPECT_EQ(decoded.values[i], e4m3_to_float(q.codes[i])) << i;
}

TEST(QuantizeRows, DequantizedRowsStayWithinHalfAStep) {
  // |w - scale·q| <= scale · (half the E4M3 step at that magnitude) + the fp32 product's rounding.
  Tensor w = Tensor::zeros({4, 64});
  for (int64_t i = 0; i < w.numel(); ++i) w.values[i] = std::sin(0.37f * static_cast<float>(i)) * (1.0f + i % 5);
  const QuantizedRows q = quantize_rows_e4m3(w);
  for (int64_t n = 0; n < 4; ++n) {
    for (int64_t k = 0; k < 64; ++k) {
      const float x = w.row(n)[k] / q.scales[n];
      const float decoded = e4m3_to_float(q.codes[n * 64 + k]);
      // E4M3 spacing at |x|: 2^(floor(log2|x|) - 3) for normals, 2^-9 for subnormals.
      const float step = std::fabs(x) < std::ldexp(1.0f, -6)
                             ? std::ldexp(1.0f, -9)
                             : std::ldexp(1.0f, static_cast<int>(std::floor(std::log2(std::fabs(x)))) - 3);
      EXPECT_LE(std::fabs(decoded - x), step / 2 + std::fabs(x) * 1e-6f) << "n=" << n << " k=" << k;
    }
  }
}

// Per-token activation quantization: the scale max(amax, 2^-9) / 448 and codes E4M3(x · (1/scale)),
// computed here from the formula and the brute-force encoder.
std::vector<uint8_t> expected_codes(const std::vector<float>& row, float scale) {
  const float inv = 1.0f / scale;
  std::vector<uint8_t> codes;
  for (float x : row) codes.push_back(brute_force_encode(x * inv));
  return codes;
}

std::vector<uint8_t> quantized(const std::vector<float>& row, float scale) {
  std::vector<uint8_t> codes(row.size(), 0xaa);
  quantize_activation_e4m3(row.data(), static_cast<int64_t>(row.size()), scale, codes.data());
  return codes;
}

TEST(ActivationQuant, AKnownRow) {
  const std::vector<float> row = {1.5f, -3.5f, 0.75f, 0.0f, -0.0f, 2.0f, 0.01f, -0.3f};
  const float amax = 3.5f;  // by inspection
  const float scale = amax / 448.0f;
  EXPECT_EQ(scale, 0x1p-7f);  // 3.5 / 448 = 1/128 exactly: the codes below are x · 128
  const float got = activation_scale_e4m3(row.data(), static_cast<int64_t>(row.size()));
  EXPECT_EQ(got, scale);
  const std::vector<uint8_t> codes = quantized(row, got);
  EXPECT_EQ(codes, expected_codes(row, scale));
  // By hand: 192 = 1.5·2^7 (exponent field 14, mantissa 4); -448 (saturated maximum); 96; +0; -0;
  // 256 = 2^8; 1.28 -> 1.25 (exponent field 7, mantissa 2); -38.4 -> -40 = -1.25·2^5.
  const std::vector<uint8_t> by_hand = {0x74, 0xfe, 0x6c, 0x00, 0x80, 0x78, 0x3a, 0xe2};
  EXPECT_EQ(codes, by_hand);
}

TEST(ActivationQuant, StaticScaleSaturatesAtPlusMinus448) {
  // A static input_scale of 0.01 on values up to 5: x / 0.01 runs past 448 and saturates.
  const std::vector<float> row = {5.0f, -5.0f, 4.4f, 4.3f, -1e30f, 0.02f};
  const float scale = 0.01f;
  const std::vector<uint8_t> codes = quantized(row, scale);
  EXPECT_EQ(codes, expected_codes(row, scale));
  EXPECT_EQ(codes[0], 0x7e);  // 500 -> 448
  EXPECT_EQ(codes[1], 0xfe);  // -500 -> -448
  EXPECT_EQ(codes[2], 0x7e);  // 440: past the 416/448 midpoint 432
  EXPECT_EQ(codes[3], 0x7d);  // 430: 416
  EXPECT_EQ(codes[4], 0xfe);
  EXPECT_EQ(codes[5], 0x40);  // 2 = 2^1 (exponent field 8)
}

TEST(ActivationQuant, ZeroRowAndRowsBelowTheFloor) {
  // amax 0: the floor 2^-9 gives scale 2^-9 / 448, vLLM's 1 / (448 · 512), and all-zero codes.
  const std::vector<float> zeros = {0.0f, -0.0f, 0.0f};
  const float floor_scale = 1.0f / (448.0f * 512.0f);
  EXPECT_EQ(activation_scale_e4m3(zeros.data(), 3), floor_scale);
  EXPECT_EQ(quantized(zeros, floor_scale), (std::vector<uint8_t>{0x00, 0x80, 0x00}));
  // amax 2^-12 < 2^-9: the same floor scale; codes of x · 448 · 512.
  const std::vector<float> tiny = {0x1p-12f, -0x1p-13f, 0x1p-20f};
  EXPECT_EQ(activation_scale_e4m3(tiny.data(), 3), floor_scale);
  EXPECT_EQ(quantized(tiny, floor_scale), expected_codes(tiny, floor_scale));
  // Just above the floor the row's own amax decides.
  const std::vector<float> above = {0x1.02p-9f, 0.0f};
  EXPECT_EQ(activation_scale_e4m3(above.data(), 2), 0x1.02p-9f / 448.0f);
}

TEST(ActivationQuant, NaNIsIgnoredByTheScaleAndKeepsItsCode) {
  const std::vector<float> row = {std::numeric_limits<float>::quiet_NaN(), 1.0f, -0.5f};
  const float scale = activation_scale_e4m3(row.data(), 3);
  EXPECT_EQ(scale, 1.0f / 448.0f);
  const std::vector<uint8_t> codes = quantized(row, scale);
  EXPECT_EQ(codes[0], 0x7f);
  EXPECT_EQ(codes[1], brute_force_encode(1.0f * (1.0f / scale)));
}

// The floor is vLLM's: max(amax / 448, 1 / (448 · 512)) is the same fp32 number as
// max(amax, 2^-9) / 448, for every amax (division by 448 is monotone, and 2^-9 / 448 rounds like
// 1 / 229376 since a power of two scales exactly).
RC_GTEST_PROP(ActivationQuantProperty, FloorIsVllmsMinScalingFactor, ()) {
  const int mantissa = *rc::gen::inRange(0, 1 << 23);
  const int exponent = *rc::gen::inRange(-30, 20);
  const float amax = std::ldexp(1.0f + static_cast<float>(mantissa) / (1 << 23), exponent);
  const float vllm = std::fmax(amax / 448.0f, 1.0f / (448.0f * 512.0f));
  RC_ASSERT(std::fmax(amax, 0x1p-9f) / 448.0f == vllm);
  const std::vector<float> row = {0.0f, -amax, amax / 3};
  RC_ASSERT(activation_scale_e4m3(row.data(), 3) == vllm);
}

// The row's largest magnitude always lands on ±448 (the product may round a hair past it:
// satfinite), and every code is the nearest E4M3 value of x · (1/scale).
RC_GTEST_PROP(ActivationQuantProperty, RowMaximumMapsTo448, ()) {
  const int n = *rc::gen::inRange(1, 40);
  const int exponent = *rc::gen::inRange(-8, 12);
  std::vector<float> row;
  for (int k = 0; k < n; ++k) {
    const int m = *rc::gen::inRange(-(1 << 20), 1 << 20);
    row.push_back(std::ldexp(static_cast<float>(m), exponent - 20));
  }
  float amax = 0.0f;
  size_t at = 0;
  for (size_t k = 0; k < row.size(); ++k) {
    if (std::fabs(row[k]) > amax) amax = std::fabs(row[k]), at = k;
  }
  RC_PRE(amax >= 0x1p-9f);
  const float scale = amax / 448.0f;
  RC_ASSERT(activation_scale_e4m3(row.data(), n) == scale);
  const std::vector<uint8_t> codes = quantized(row, scale);
  RC_ASSERT(codes == expected_codes(row, scale));
  RC_ASSERT((codes[at] & 0x7f) == 0x7e);
}

}  // namespace
}  // namespace dflash
