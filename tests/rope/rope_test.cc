// core/rope.h against RoPE as Hugging Face transformers forms it, at positions up to 128k.
//
// The expected values (rope_test_table.h beside this file) come from rope_test_table.py, which
// follows upstream's formulas independently of this code: numpy float32 for upstream's fp32 tensor
// operations, Python floats for its Python ones, SLEEF's powf (torch's CPU fp32 pow) for the
// power, cos/sin at 200 bits rounded once to float32. Every value is compared bit for bit:
// inv_freq, the attention factor, the angle float(p)·inv_freq[j] and the scaled cos and sin.
// core/rope.cc rounds cos/sin from double results; those differ from the nearest float32 only when
// the exact value lies within ~2^-28 ulp of a rounding midpoint, and the generator reports that no
// tabulated value comes closer than 6e-5 ulp, so bit equality is the right expectation. The
// negative controls form inv_freq or the angle in plausible other ways (among them the correctly
// rounded pow, which SLEEF's is not everywhere) and show that the same comparison reports them.
#include "core/rope.h"

#include <gtest/gtest.h>
#include <sleef.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "tests/rope/rope_test_table.h"

namespace dflash {
namespace {

namespace table = rope_test_table;

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

float float_of(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

struct Case {
  const char* name;
  RopeConfig rope;
  int head_dim;
  uint32_t attention_scaling;
  const uint32_t* inv_freq;  // [d/2]
  const uint32_t* angle;     // [positions][d/2]
  const uint32_t* cos;
  const uint32_t* sin;
};

RopeConfig default_rope(double theta) {
  RopeConfig r;
  r.type = RopeConfig::Type::kDefault;
  r.theta = theta;
  return r;
}

// gpt-oss style YaRN: factor 32 from 4096, beta_fast 32, beta_slow 1, theta 150000.
RopeConfig gpt_oss_yarn(bool truncate) {
  RopeConfig r;
  r.type = RopeConfig::Type::kYarn;
  r.theta = 150000.0;
  r.factor = 32.0;
  r.original_max_position_embeddings = 4096;
  r.beta_fast = 32.0;
  r.beta_slow = 1.0;
  r.truncate = truncate;
  return r;
}

std::vector<Case> cases() {
  return {
      {"default theta 1e6, d 128", default_rope(1e6), 128, table::default_theta1e6_d128::kAttentionScaling,
       table::default_theta1e6_d128::kInvFreq, table::default_theta1e6_d128::kAngle,
       table::default_theta1e6_d128::kCos, table::default_theta1e6_d128::kSin},
      {"YaRN x32 from 4096 (gpt-oss, truncate false), d 64", gpt_oss_yarn(false), 64,
       table::yarn_gptoss_d64::kAttentionScaling, table::yarn_gptoss_d64::kInvFreq, table::yarn_gptoss_d64::kAngle,
       table::yarn_gptoss_d64::kCos, table::yarn_gptoss_d64::kSin},
      {"YaRN x32 from 4096 (truncate true), d 64", gpt_oss_yarn(true), 64,
       table::yarn_gptoss_truncated_d64::kAttentionScaling, table::yarn_gptoss_truncated_d64::kInvFreq,
       table::yarn_gptoss_truncated_d64::kAngle, table::yarn_gptoss_truncated_d64::kCos,
       table::yarn_gptoss_truncated_d64::kSin},
  };
}

// How many of `got` differ in bits from `expected`; the first one is described in *first.
int64_t mismatches(const std::vector<float>& got, const uint32_t* expected, std::string* first) {
  int64_t count = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (bits_of(got[i]) == expected[i]) continue;
    if (count++ == 0 && first != nullptr) {
      std::ostringstream s;
      s.precision(9);
      s << "entry " << i << ": got " << got[i] << " (0x" << std::hex << bits_of(got[i]) << "), expected "
        << float_of(expected[i]) << " (0x" << expected[i] << ")";
      *first = s.str();
    }
  }
  return count;
}

// Angles of every tabulated position for the frequencies `inv_freq`, as rope_angle forms them.
std::vector<float> angles(const RopeTable& t) {
  std::vector<float> out;
  for (int64_t p : table::kPositions) {
    for (size_t j = 0; j < t.inv_freq.size(); ++j) out.push_back(rope_angle(t, p, j));
  }
  return out;
}

TEST(Rope, InvFreqAndAttentionFactorAreUpstreamsBitForBit) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const RopeTable t = make_rope_table(c.rope, c.head_dim);
    ASSERT_EQ(t.inv_freq.size(), static_cast<size_t>(c.head_dim / 2));
    std::string first;
    EXPECT_EQ(mismatches(t.inv_freq, c.inv_freq, &first), 0) << first;
    EXPECT_EQ(bits_of(t.attention_scaling), c.attention_scaling);
  }
}

TEST(Rope, AnglesCosAndSinAreUpstreamsBitForBitUpToPosition128k) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const RopeTable t = make_rope_table(c.rope, c.head_dim);
    const size_t half = t.inv_freq.size();
    std::string first;
    EXPECT_EQ(mismatches(angles(t), c.angle, &first), 0) << first;
    std::vector<float> cos, sin, cs(half), sn(half);
    for (int64_t p : table::kPositions) {
      rope_cos_sin(t, p, cs.data(), sn.data());
      cos.insert(cos.end(), cs.begin(), cs.end());
      sin.insert(sin.end(), sn.begin(), sn.end());
    }
    EXPECT_EQ(mismatches(cos, c.cos, &first), 0) << "cos " << first;
    EXPECT_EQ(mismatches(sin, c.sin, &first), 0) << "sin " << first;
  }
}

// Negative controls: the same comparisons report frequencies or angles formed another way.
TEST(Rope, OtherWaysOfFormingTheFrequenciesAreReported) {
  const Case c = cases()[0];  // default RoPE, theta 1e6, d 128
  const size_t half = static_cast<size_t>(c.head_dim / 2);
  const RopeTable exact = make_rope_table(c.rope, c.head_dim);

  // inv_freq formed in double and rounded once to float (no fp32 exponent, pow or reciprocal).
  RopeTable fp64 = exact;
  for (size_t j = 0; j < half; ++j) {
    fp64.inv_freq[j] = static_cast<float>(1.0 / std::pow(c.rope.theta, static_cast<double>(2 * j) / c.head_dim));
  }
  EXPECT_GT(mismatches(fp64.inv_freq, c.inv_freq, nullptr), 0) << "an fp64-formed inv_freq went unnoticed";
  EXPECT_GT(mismatches(angles(fp64), c.angle, nullptr), 0);

  // The nearest float to the power (a correctly rounded fp32 pow) instead of SLEEF's.
  RopeTable nearest_power = exact;
  for (size_t j = 0; j < half; ++j) {
    const float exponent = static_cast<float>(2 * j) / static_cast<float>(c.head_dim);
    nearest_power.inv_freq[j] =
        1.0f / static_cast<float>(std::pow(static_cast<double>(static_cast<float>(c.rope.theta)), static_cast<double>(exponent)));
  }
  EXPECT_GT(mismatches(nearest_power.inv_freq, c.inv_freq, nullptr), 0) << "a correctly rounded pow went unnoticed";
  EXPECT_GT(mismatches(angles(nearest_power), c.angle, nullptr), 0);

  // The power taken with the negative exponent instead of a reciprocal of the fp32 power.
  RopeTable negative_power = exact;
  for (size_t j = 0; j < half; ++j) {
    const float exponent = static_cast<float>(2 * j) / static_cast<float>(c.head_dim);
    negative_power.inv_freq[j] = std::pow(static_cast<float>(c.rope.theta), -exponent);
  }
  EXPECT_GT(mismatches(negative_power.inv_freq, c.inv_freq, nullptr), 0) << "theta^(-2j/d) went unnoticed";

  // The angle formed entirely in double (position times a double inv_freq), rounded once.
  std::vector<float> double_angles;
  for (int64_t p : table::kPositions) {
    for (size_t j = 0; j < half; ++j) {
      const double inv_freq = 1.0 / std::pow(c.rope.theta, static_cast<double>(2 * j) / c.head_dim);
      double_angles.push_back(static_cast<float>(static_cast<double>(p) * inv_freq));
    }
  }
  EXPECT_GT(mismatches(double_angles, c.angle, nullptr), 0) << "fp64-formed angles went unnoticed";
}

TEST(Rope, YarnRampDenominatorRoundedFromTheFloatDifferenceIsReported) {
  // With truncate false the correction range is fractional: upstream divides by the Python
  // difference high - low converted to fp32, not by the difference of the two fp32 bounds.
  const Case c = cases()[1];
  const size_t half = static_cast<size_t>(c.head_dim / 2);
  const RopeTable exact = make_rope_table(c.rope, c.head_dim);
  auto correction_dim = [&](double rotations) {
    return (c.head_dim * std::log(c.rope.original_max_position_embeddings / (rotations * 2.0 * M_PI))) /
           (2.0 * std::log(c.rope.theta));
  };
  const float low = static_cast<float>(correction_dim(c.rope.beta_fast));
  const float high = static_cast<float>(correction_dim(c.rope.beta_slow));
  RopeTable fp32_range = exact;
  const float factor = static_cast<float>(c.rope.factor);
  for (size_t j = 0; j < half; ++j) {
    const float exponent = static_cast<float>(2 * j) / static_cast<float>(c.head_dim);
    const float pos = Sleef_powf_u10(static_cast<float>(c.rope.theta), exponent);
    const float ramp = std::fmin(std::fmax((static_cast<float>(j) - low) / (high - low), 0.0f), 1.0f);
    const float keep = 1.0f - ramp;
    const float interpolated = 1.0f / (factor * pos);
    const float extrapolated = 1.0f / pos;
    const float a = interpolated * (1.0f - keep);
    const float b = extrapolated * keep;
    fp32_range.inv_freq[j] = a + b;
  }
  std::string first;
  EXPECT_GT(mismatches(fp32_range.inv_freq, c.inv_freq, &first), 0) << "an fp32 ramp denominator went unnoticed";
  EXPECT_GT(mismatches(angles(fp32_range), c.angle, nullptr), 0);
}

}  // namespace
}  // namespace dflash
