// Every Highway kernel against its scalar twin, on every target this build compiles and this CPU
// supports (hwy::TestWithParamTarget forces each in turn), in float and double.
//
// Bounds (u = unit roundoff of T: 2^-24 float, 2^-53 double; an ulp is at most 2u relative):
//  - add_inplace, rope_rotate_half, argmax: same operations in the same order, no fused multiply-add
//    (ops.cc is built with -ffp-contract=off): bit-identical.
//  - rms_norm: the two sums of n squares each carry relative error <= γ_n = n·u/(1-n·u), so they
//    differ by <= 2γ_n; the square root halves that; the division, +eps, sqrt, reciprocal and the
//    two output products add at most 6 roundings that may land differently: |Δ| <= (γ_n + 6u)·|out|.
//  - silu_mul: contrib Exp and std::exp are each within 1 ulp, so they differ by <= 4u relative;
//    1+e, g·e, the division and the product by up add <= 4 roundings: |Δ| <= 12u·|out| (+ the
//    subnormal floor below, where relative error is meaningless).
//  - softmax: each exp differs by <= 4u; the sums by <= 2γ_n + 4u; the division 2u:
//    |Δ| <= (2γ_n + 10u)·|p|.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "hwy/highway.h"
#include "hwy/tests/hwy_gtest.h"
#include "reference/ops/ops.h"
#include "reference/ops/scalar_ops.h"

namespace dflash {
namespace {

template <typename T>
constexpr T unit_roundoff() { return std::numeric_limits<T>::epsilon() / 2; }

template <typename T>
T gamma_n(size_t n) {
  const T nu = static_cast<T>(n) * unit_roundoff<T>();
  return nu / (T(1) - nu);
}

// Below the smallest normal number relative error has no meaning; this floor covers it.
template <typename T>
constexpr T subnormal_floor() { return 16 * std::numeric_limits<T>::min(); }

template <typename T>
std::vector<T> random_values(size_t n, T lo, T hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(dist(rng));
  return v;
}

template <typename T>
bool same_bits(T a, T b) { return std::memcmp(&a, &b, sizeof(T)) == 0; }

const size_t kSizes[] = {1, 2, 3, 7, 8, 15, 16, 17, 31, 33, 64, 100, 257, 1000};

class OpsTest : public hwy::TestWithParamTarget {
 protected:
  // Proves the dispatch really runs the target under test, not the best one.
  void ExpectTargetInUse() { EXPECT_STREQ(ops::dispatch_target_name(), hwy::TargetName(GetParam())); }
};
HWY_TARGET_INSTANTIATE_TEST_SUITE_P(OpsTest);

template <typename T>
void check_rms_norm() {
  const T u = unit_roundoff<T>();
  for (size_t n : kSizes) {
    const std::vector<T> x = random_values<T>(n, -3, 3, 100 + static_cast<uint32_t>(n));
    const std::vector<T> w = random_values<T>(n, -2, 2, 200 + static_cast<uint32_t>(n));
    for (T eps : {T(1e-6), T(1e-5)}) {
      std::vector<T> expected(n), got(n);
      scalar::rms_norm(x.data(), w.data(), n, eps, expected.data());
      ops::rms_norm(x.data(), w.data(), n, eps, got.data());
      const T rel = gamma_n<T>(n) + 6 * u;
      for (size_t i = 0; i < n; ++i) {
        ASSERT_LE(std::fabs(got[i] - expected[i]), rel * std::fabs(expected[i]) + subnormal_floor<T>())
            << "n=" << n << " i=" << i;
      }
      // In place (out aliases x) gives the same bits as out of place.
      std::vector<T> in_place = x;
      ops::rms_norm(in_place.data(), w.data(), n, eps, in_place.data());
      for (size_t i = 0; i < n; ++i) ASSERT_TRUE(same_bits(in_place[i], got[i])) << "n=" << n << " i=" << i;
    }
  }
  // A zero row stays zero (eps keeps the reciprocal finite).
  std::vector<T> zeros(33, T(0)), w(33, T(1)), out(33, T(7));
  ops::rms_norm(zeros.data(), w.data(), 33, T(1e-6), out.data());
  for (T v : out) ASSERT_EQ(v, T(0));
}

TEST_P(OpsTest, RmsNormMatchesScalar) {
  check_rms_norm<float>();
  check_rms_norm<double>();
  ExpectTargetInUse();
}

template <typename T>
void check_rope() {
  for (size_t half : {1, 3, 4, 8, 16, 32, 64, 65}) {
    const std::vector<T> x = random_values<T>(2 * half, -4, 4, 300 + static_cast<uint32_t>(half));
    const std::vector<T> c = random_values<T>(half, -1, 1, 400 + static_cast<uint32_t>(half));
    const std::vector<T> s = random_values<T>(half, -1, 1, 500 + static_cast<uint32_t>(half));
    std::vector<T> expected = x, got = x;
    scalar::rope_rotate_half(expected.data(), c.data(), s.data(), half);
    ops::rope_rotate_half(got.data(), c.data(), s.data(), half);
    for (size_t i = 0; i < 2 * half; ++i) ASSERT_TRUE(same_bits(got[i], expected[i])) << "half=" << half << " i=" << i;
  }
  // The pairing is (j, j + d/2): rotating e_0 by 90 degrees lands on e_{half}, not on e_1.
  const size_t half = 8;
  std::vector<T> x(2 * half, T(0)), c(half, T(0)), s(half, T(1));
  x[0] = T(1);
  ops::rope_rotate_half(x.data(), c.data(), s.data(), half);
  for (size_t i = 0; i < 2 * half; ++i) ASSERT_EQ(x[i], i == half ? T(1) : T(0)) << "i=" << i;
}

TEST_P(OpsTest, RopeRotateHalfIsBitExact) {
  check_rope<float>();
  check_rope<double>();
  ExpectTargetInUse();
}

template <typename T>
void check_softmax() {
  const T u = unit_roundoff<T>();
  for (size_t n : kSizes) {
    const std::vector<T> x = random_values<T>(n, -20, 20, 600 + static_cast<uint32_t>(n));
    std::vector<T> expected = x, got = x;
    scalar::softmax(expected.data(), n);
    ops::softmax(got.data(), n);
    const T rel = 2 * gamma_n<T>(n) + 10 * u;
    T total = 0;
    for (size_t i = 0; i < n; ++i) {
      ASSERT_LE(std::fabs(got[i] - expected[i]), rel * expected[i] + subnormal_floor<T>()) << "n=" << n << " i=" << i;
      total += got[i];
    }
    ASSERT_NEAR(total, T(1), 2 * gamma_n<T>(n) + 10 * u) << "n=" << n;
  }
  // Large equal scores do not overflow: exp is taken of x - max <= 0.
  std::vector<T> big(17, T(5000));
  ops::softmax(big.data(), big.size());
  for (T p : big) ASSERT_NEAR(p, T(1) / T(17), 4 * u);
}

TEST_P(OpsTest, SoftmaxMatchesScalar) {
  check_softmax<float>();
  check_softmax<double>();
  ExpectTargetInUse();
}

template <typename T>
void check_silu_mul() {
  const T u = unit_roundoff<T>();
  for (size_t n : kSizes) {
    std::vector<T> gate = random_values<T>(n, -30, 30, 700 + static_cast<uint32_t>(n));
    const std::vector<T> up = random_values<T>(n, -3, 3, 800 + static_cast<uint32_t>(n));
    // Edge inputs where overflow or a sign slip would show: 0, -0, tiny, and far out on both sides.
    const T edges[] = {T(0), -T(0), T(1e-30), T(-1e-30), T(-100), T(100), T(-1000), T(1000)};
    for (size_t i = 0; i < n && i < sizeof(edges) / sizeof(edges[0]); ++i) gate[(i * 7) % n] = edges[i];
    std::vector<T> expected(n), got(n);
    scalar::silu_mul(gate.data(), up.data(), n, expected.data());
    ops::silu_mul(gate.data(), up.data(), n, got.data());
    for (size_t i = 0; i < n; ++i) {
      ASSERT_TRUE(std::isfinite(got[i])) << "n=" << n << " gate=" << gate[i];
      ASSERT_LE(std::fabs(got[i] - expected[i]), 12 * u * std::fabs(expected[i]) + subnormal_floor<T>())
          << "n=" << n << " i=" << i << " gate=" << gate[i];
    }
  }
  // Known values: silu(0) = 0, silu(large) = large, silu(-large) -> -0 side, silu(1) = 1/(1+e^-1).
  const T g[] = {T(0), T(50), T(-50), T(1)};
  const T one[] = {T(1), T(1), T(1), T(1)};
  T out[4];
  ops::silu_mul(g, one, 4, out);
  EXPECT_EQ(out[0], T(0));
  EXPECT_EQ(out[1], T(50));
  EXPECT_LE(std::fabs(out[2]), T(1e-19));
  EXPECT_NEAR(out[3], T(0.7310585786300049), 8 * u);
}

TEST_P(OpsTest, SiluMulMatchesScalar) {
  check_silu_mul<float>();
  check_silu_mul<double>();
  ExpectTargetInUse();
}

template <typename T>
void check_add() {
  for (size_t n : kSizes) {
    const std::vector<T> a = random_values<T>(n, -1e3, 1e3, 900 + static_cast<uint32_t>(n));
    const std::vector<T> b = random_values<T>(n, -1, 1, 1000 + static_cast<uint32_t>(n));
    std::vector<T> expected = a, got = a;
    scalar::add_inplace(expected.data(), b.data(), n);
    ops::add_inplace(got.data(), b.data(), n);
    for (size_t i = 0; i < n; ++i) ASSERT_TRUE(same_bits(got[i], expected[i])) << "n=" << n << " i=" << i;
  }
}

TEST_P(OpsTest, AddInplaceIsBitExact) {
  check_add<float>();
  check_add<double>();
  ExpectTargetInUse();
}

template <typename T>
void check_argmax() {
  const T nan = std::numeric_limits<T>::quiet_NaN();
  const T inf = std::numeric_limits<T>::infinity();
  for (size_t n : kSizes) {
    const std::vector<T> x = random_values<T>(n, -5, 5, 1100 + static_cast<uint32_t>(n));
    ASSERT_EQ(ops::argmax(x.data(), n), scalar::argmax(x.data(), n)) << "n=" << n;
    // All equal: index 0.
    std::vector<T> flat(n, T(0.25));
    ASSERT_EQ(ops::argmax(flat.data(), n), 0u) << "n=" << n;
  }
  // Duplicate maxima far apart (the class that hit production: 1024 picked over 1).
  std::vector<T> x(2000, T(-1));
  x[1] = T(3);
  x[1024] = T(3);
  x[1999] = T(3);
  EXPECT_EQ(ops::argmax(x.data(), x.size()), 1u);
  // Tie between the vector body and the scalar tail: the body's lane wins.
  std::vector<T> tail(67, T(0));
  tail[5] = T(2);
  tail[66] = T(2);
  EXPECT_EQ(ops::argmax(tail.data(), tail.size()), 5u);
  // Maximum only in the tail.
  tail[5] = T(1);
  EXPECT_EQ(ops::argmax(tail.data(), tail.size()), 66u);
  // +0 and -0 compare equal: the first one wins.
  std::vector<T> zeros(40, T(-1));
  zeros[9] = -T(0);
  zeros[20] = T(0);
  EXPECT_EQ(ops::argmax(zeros.data(), zeros.size()), 9u);
  // NaN never wins; infinities behave as numbers; all NaN gives 0.
  std::vector<T> with_nan(50, T(0));
  with_nan[0] = nan;
  with_nan[3] = T(7);
  with_nan[40] = nan;
  EXPECT_EQ(ops::argmax(with_nan.data(), with_nan.size()), 3u);
  with_nan[45] = inf;
  EXPECT_EQ(ops::argmax(with_nan.data(), with_nan.size()), 45u);
  std::vector<T> all_nan(37, nan);
  EXPECT_EQ(ops::argmax(all_nan.data(), all_nan.size()), 0u);
  std::vector<T> all_minus_inf(37, -inf);
  EXPECT_EQ(ops::argmax(all_minus_inf.data(), all_minus_inf.size()), 0u);
  all_minus_inf[36] = T(-1e30);
  EXPECT_EQ(ops::argmax(all_minus_inf.data(), all_minus_inf.size()), 36u);
}

TEST_P(OpsTest, ArgmaxLowestIndexOnTies) {
  check_argmax<float>();
  check_argmax<double>();
  ExpectTargetInUse();
}

// The suite must really cover several targets on x86 (else the per-target claim is empty).
TEST(OpsTargets, SeveralTargetsCompiledAndSupported) {
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  std::string names;
  for (int64_t t : targets) names += std::string(hwy::TargetName(t)) + " ";
  std::printf("Highway targets tested: %s\n", names.c_str());
#if HWY_ARCH_X86
  EXPECT_GE(targets.size(), 2u) << names;
#endif
}

}  // namespace
}  // namespace dflash
