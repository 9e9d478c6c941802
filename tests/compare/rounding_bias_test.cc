// The rounding-bias check (compare/rounding_bias.h, docs/tolerances.md "Rounding bias"): the ulp
// and the bound against hand values; two roundings to nearest of values that differ by fp32 noise
// pass; truncation toward zero fails, at a bf16 stage and through a linear map, while every per-row
// bound of the tight model passes it; pairs that do not share rounding points carry no such check.
#include "compare/rounding_bias.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include <gtest/gtest.h>

#include "compare/stage_check.h"
#include "compare/tolerance.h"
#include "core/dtype.h"

namespace dflash {
namespace {

// Rounded toward zero: the low 16 bits dropped (finite values).
float truncate_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  u &= 0xffff0000u;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// rows × cols of U(-4, 4) values, seeded.
Tensor random_values(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  Tensor t = Tensor::zeros({rows, cols});
  for (float& v : t.values) v = u(rng);
  return t;
}

// Each value moved by a relative fp32-sized perturbation (a reordered sum), then rounded to bf16.
Tensor rounded_with_noise(const Tensor& exact, uint32_t seed, bool truncate = false) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Tensor t = exact;
  for (float& v : t.values) {
    const float moved = v * (1.0f + 8.0f * std::ldexp(1.0f, -24) * u(rng));
    v = truncate ? truncate_to_bf16(moved) : round_to_bf16(moved);
  }
  return t;
}

TEST(RoundingBias, UlpOfBf16) {
  EXPECT_EQ(bf16_ulp(1.0), std::ldexp(1.0, -7));
  EXPECT_EQ(bf16_ulp(1.99), std::ldexp(1.0, -7));
  EXPECT_EQ(bf16_ulp(2.0), std::ldexp(1.0, -6));
  EXPECT_EQ(bf16_ulp(-0.75), std::ldexp(1.0, -8));
  EXPECT_EQ(bf16_ulp(1e-40), std::ldexp(1.0, -133));  // below bf16's normal range
  // Adjacent bf16 values are one ulp apart.
  const float x = round_to_bf16(3.14159f);
  EXPECT_EQ(bf16_bits_to_float(static_cast<uint16_t>(float_to_bf16_bits(x) + 1)) - x, bf16_ulp(x));
}

TEST(RoundingBias, ReportsRowMeansAndTheShareBeyondOneUlp) {
  // Row 0: every element one ulp toward zero; row 1: two ulps away from zero in its first quarter,
  // exact elsewhere. Row means -1 and (4 · 1) / 16 = 0.25 (clamped to one ulp each); sd of {-1, 0.25}.
  Tensor e = Tensor::zeros({2, 16});
  for (float& v : e.values) v = 1.5f;
  Tensor a = e;
  for (int c = 0; c < 16; ++c) a.values[c] = 1.5f - std::ldexp(1.0f, -7);
  for (int c = 0; c < 4; ++c) a.values[16 + c] = 1.5f + 2 * std::ldexp(1.0f, -7);
  const RoundingBias bias = measure_rounding_bias(e, a);
  EXPECT_EQ(bias.rows, 2);
  EXPECT_DOUBLE_EQ(bias.row_mean_sd, std::sqrt(2 * 0.625 * 0.625));
  EXPECT_DOUBLE_EQ(bias.beyond_one_ulp, 4.0 / 32);
  EXPECT_NE(describe_rounding_bias(bias).find("(2 rows, their means' sd 0.884; 12.5 % more than one ulp apart)"),
            std::string::npos)
      << describe_rounding_bias(bias);
}

TEST(RoundingBias, BoundFollowsTheElementCount) {
  // Every element one ulp toward zero: mean -1, second moment 1, bound 6·sqrt(1/n).
  Tensor e = Tensor::zeros({1, 400});
  for (float& v : e.values) v = 1.5f;
  Tensor a = e;
  for (float& v : a.values) v = 1.5f - std::ldexp(1.0f, -7);
  const RoundingBias bias = measure_rounding_bias(e, a);
  EXPECT_EQ(bias.elements, 400);
  EXPECT_DOUBLE_EQ(bias.mean_ulp, -1.0);
  EXPECT_DOUBLE_EQ(bias.second_moment, 1.0);
  EXPECT_DOUBLE_EQ(bias.bound, 6.0 * std::sqrt(1.0 / 400));
  EXPECT_FALSE(bias.passed());
  // Identical tensors: no error, and the variance floor 1/12 with the bound's floor 1/16 below it.
  const RoundingBias same = measure_rounding_bias(e, e);
  EXPECT_DOUBLE_EQ(same.mean_ulp, 0.0);
  EXPECT_DOUBLE_EQ(same.bound, std::max(1.0 / 16, 6.0 * std::sqrt(1.0 / 12 / 400)));
  EXPECT_TRUE(same.passed());
  // Large counts reach the floor: 1/16 ulp.
  Tensor big = Tensor::zeros({1, 1 << 20});
  for (float& v : big.values) v = 1.0f;
  EXPECT_DOUBLE_EQ(measure_rounding_bias(big, big).bound, 1.0 / 16);
  // Zeros and non-finite values are not measured; nothing measured passes.
  Tensor z = Tensor::zeros({2, 3});
  z.values[1] = std::numeric_limits<float>::quiet_NaN();
  const RoundingBias none = measure_rounding_bias(z, z);
  EXPECT_EQ(none.elements, 0);
  EXPECT_TRUE(none.passed());
  // One far-off element counts one ulp, not its distance.
  Tensor far = e;
  far.values[0] = 1000.0f;
  EXPECT_DOUBLE_EQ(measure_rounding_bias(e, far).mean_ulp, 1.0 / 400);
}

TEST(RoundingBias, RowsThatDisagreeWidenTheBound) {
  // Row 0 one ulp toward zero throughout, rows 1..3 exact: mean -1/4, second moment 1/4, row means
  // {-1, 0, 0, 0} with sd 1/2. The element term 6·sqrt(0.25 / 400) = 0.15 would fail it; the rows
  // are the independent samples, 6 · 0.5 / √4 = 1.5.
  Tensor e = Tensor::zeros({4, 100});
  for (float& v : e.values) v = 1.5f;
  Tensor a = e;
  for (int c = 0; c < 100; ++c) a.values[c] = 1.5f - std::ldexp(1.0f, -7);
  const RoundingBias bias = measure_rounding_bias(e, a);
  EXPECT_DOUBLE_EQ(bias.mean_ulp, -0.25);
  EXPECT_DOUBLE_EQ(bias.row_mean_sd, 0.5);
  EXPECT_DOUBLE_EQ(bias.bound, 1.5);
  EXPECT_TRUE(bias.passed());
  // Every row one ulp toward zero: the rows agree (sd 0), the element term decides and fails it.
  for (float& v : a.values) v = 1.5f - std::ldexp(1.0f, -7);
  const RoundingBias lean = measure_rounding_bias(e, a);
  EXPECT_DOUBLE_EQ(lean.row_mean_sd, 0.0);
  EXPECT_DOUBLE_EQ(lean.bound, 6.0 * std::sqrt(1.0 / 400));
  EXPECT_FALSE(lean.passed());
}

TEST(RoundingBias, NearestAgainstNearestPassesTruncationFails) {
  for (uint32_t seed : {1u, 2u, 3u, 4u, 5u}) {
    const Tensor exact = random_values(16, 96, seed);
    const Tensor e = rounded_with_noise(exact, 100 + seed);
    const RoundingBias clean = measure_rounding_bias(e, rounded_with_noise(exact, 200 + seed));
    EXPECT_TRUE(clean.passed()) << describe_rounding_bias(clean);
    EXPECT_LT(std::fabs(clean.mean_ulp), 0.01) << describe_rounding_bias(clean);
    const RoundingBias truncated = measure_rounding_bias(e, rounded_with_noise(exact, 200 + seed, true));
    EXPECT_FALSE(truncated.passed()) << describe_rounding_bias(truncated);
    EXPECT_NEAR(truncated.mean_ulp, -0.5, 0.05) << describe_rounding_bias(truncated);
  }
}

// A bf16 stage that truncates passes both per-row bounds of the tight model (its errors are under
// one ulp) and fails only the bias check; a fixture pair has no such check.
TEST(RoundingBias, CheckStageNamesATruncatingStageThatEveryRowBoundPasses) {
  StagePath path;
  path.boundaries = 2;
  path.roundings = 8;
  path.accumulation = 96;
  const TolerancePair tight = cross_pair(Precision::kBf16, "reference-bf16", Precision::kBf16, "candidate");
  const StageBound bound = stage_bound(tight, path, 96);
  EXPECT_TRUE(bound.rounding_bias);
  const Tensor exact = random_values(8, 96, 11);
  const Tensor e = rounded_with_noise(exact, 12);
  const StageCheck check = check_stage("L0.q", 5, e, rounded_with_noise(exact, 13, true), bound);
  EXPECT_FALSE(check.passed);
  EXPECT_EQ(check.fail_criterion, "rounding-bias");
  EXPECT_LE(check.metrics.max_row_rel_rms, bound.rel_rms);
  EXPECT_LE(check.metrics.max_rel, bound.max_rel);
  ASSERT_TRUE(check.bias.has_value());
  EXPECT_DOUBLE_EQ(check.fail_value, check.bias->mean_ulp);
  EXPECT_TRUE(check_stage("L0.q", 5, e, rounded_with_noise(exact, 14), bound).passed);

  // A path without roundings has nothing to bias; a pair without shared rounding points is not checked.
  EXPECT_FALSE(stage_bound(tight, StagePath{}, 96).rounding_bias);
  const TolerancePair fixture = fixture_pair("fp64", Precision::kBf16, "reference-bf16");
  const StageBound loose = stage_bound(fixture, path, 96);
  EXPECT_FALSE(loose.rounding_bias);
  EXPECT_FALSE(check_stage("L0.q", 5, e, rounded_with_noise(exact, 13, true), loose).bias.has_value());
}

// Truncation seen through a linear map (a GEMM after a truncated activation): the output is an
// fp32 stage, yet its errors lean toward zero by far more than the bound.
TEST(RoundingBias, TruncationSurvivesALinearMap) {
  const int64_t rows = 8, inner = 192, cols = 96;
  const Tensor act = random_values(rows, inner, 21);
  const Tensor w = random_values(cols, inner, 22);
  auto gemm = [&](const Tensor& x) {
    Tensor out = Tensor::zeros({rows, cols});
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        double sum = 0;
        for (int64_t k = 0; k < inner; ++k) sum += static_cast<double>(x.row(r)[k]) * w.row(c)[k];
        out.row(r)[c] = static_cast<float>(sum);
      }
    }
    return out;
  };
  const Tensor e = gemm(rounded_with_noise(act, 23));
  const RoundingBias clean = measure_rounding_bias(e, gemm(rounded_with_noise(act, 24)));
  EXPECT_TRUE(clean.passed()) << describe_rounding_bias(clean);
  const RoundingBias truncated = measure_rounding_bias(e, gemm(rounded_with_noise(act, 24, true)));
  EXPECT_FALSE(truncated.passed()) << describe_rounding_bias(truncated);
  EXPECT_LT(truncated.mean_ulp, -0.2) << describe_rounding_bias(truncated);
}

}  // namespace
}  // namespace dflash
