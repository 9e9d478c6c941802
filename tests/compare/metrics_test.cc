// compute_metrics on examples small enough to check by hand.
#include "tests/support/harness_error.h"
#include "compare/metrics.h"

#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "core/error.h"

namespace dflash {
namespace {

TEST(Metrics, HandComputedTwoByTwo) {
  // Row 0: expected (3, 4), actual (3, 5): |d| = (0, 1), row max 4, row norm 5.
  // Row 1: expected all zero, so it borrows the largest row scales (max 4, norm 5); actual (0, 0.5).
  const Tensor expected({2, 2}, {3, 4, 0, 0});
  const Tensor actual({2, 2}, {3, 5, 0, 0.5f});
  const TensorMetrics m = compute_metrics(expected, actual);
  EXPECT_EQ(m.rows, 2);
  EXPECT_EQ(m.cols, 2);
  EXPECT_EQ(m.non_finite, 0);
  EXPECT_DOUBLE_EQ(m.max_abs, 1.0);
  EXPECT_EQ(m.worst_abs.row, 0);
  EXPECT_EQ(m.worst_abs.col, 1);
  EXPECT_DOUBLE_EQ(m.worst_abs.expected, 4.0);
  EXPECT_DOUBLE_EQ(m.worst_abs.actual, 5.0);
  EXPECT_DOUBLE_EQ(m.row_max_rel[0], 0.25);   // 1 / 4
  EXPECT_DOUBLE_EQ(m.row_max_rel[1], 0.125);  // 0.5 / 4 (borrowed)
  EXPECT_DOUBLE_EQ(m.max_rel, 0.25);
  EXPECT_DOUBLE_EQ(m.row_rel_rms[0], 0.2);  // 1 / 5
  EXPECT_DOUBLE_EQ(m.row_rel_rms[1], 0.1);  // 0.5 / 5 (borrowed)
  EXPECT_DOUBLE_EQ(m.max_row_rel_rms, 0.2);
  EXPECT_EQ(m.worst_rms_row, 0);
  EXPECT_DOUBLE_EQ(m.nmse, 1.25 / 25.0);  // (1 + 0.25) / (9 + 16)
  EXPECT_NEAR(m.cosine, 29.0 / (5.0 * std::sqrt(34.25)), 1e-12);
  // bf16 steps: 4 -> 5 is 32 steps (spacing 1/32 in [4, 8)); 0 -> 0.5 is 0x3f00 = 16128 steps.
  EXPECT_EQ(m.max_bf16_ulp, 16128);
  EXPECT_EQ(m.worst_ulp.row, 1);
  EXPECT_EQ(m.worst_ulp.col, 1);
  EXPECT_EQ(m.row_worst_col[0], 1);
  EXPECT_EQ(m.row_worst_col[1], 1);
}

TEST(Metrics, IdenticalTensorsMeasureZero) {
  const Tensor t({2, 3}, {1, -2, 3, 0.5f, 0.25f, -8});
  const TensorMetrics m = compute_metrics(t, t);
  EXPECT_EQ(m.max_abs, 0);
  EXPECT_EQ(m.max_rel, 0);
  EXPECT_EQ(m.max_row_rel_rms, 0);
  EXPECT_EQ(m.nmse, 0);
  EXPECT_DOUBLE_EQ(m.cosine, 1.0);
  EXPECT_EQ(m.max_bf16_ulp, 0);
}

TEST(Metrics, AllZeroTensorsFallBackToAbsoluteErrors) {
  const Tensor expected = Tensor::zeros({1, 4});
  const Tensor actual({1, 4}, {0, 0, 0, 2});
  const TensorMetrics m = compute_metrics(expected, actual);
  EXPECT_DOUBLE_EQ(m.max_rel, 2.0);          // scale 1
  EXPECT_DOUBLE_EQ(m.max_row_rel_rms, 1.0);  // ||d|| = 2 over sqrt(4)
  EXPECT_DOUBLE_EQ(m.cosine, 0.0);
}

TEST(Metrics, NonFiniteValuesAreCountedAndLocated) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const Tensor expected({2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor actual({2, 3}, {1, 2, 3, 4, nan, inf});
  const TensorMetrics m = compute_metrics(expected, actual);
  EXPECT_EQ(m.non_finite, 2);
  EXPECT_EQ(m.first_non_finite.row, 1);
  EXPECT_EQ(m.first_non_finite.col, 1);
  EXPECT_EQ(m.row_first_non_finite_col[0], -1);
  EXPECT_EQ(m.row_first_non_finite_col[1], 1);
  EXPECT_EQ(m.max_abs, 0);  // the finite elements agree
}

TEST(Metrics, Bf16UlpDistance) {
  EXPECT_EQ(bf16_ulp_distance(1.0f, 1.0078125f), 1);  // 0x3f80 -> 0x3f81
  EXPECT_EQ(bf16_ulp_distance(0.0f, -0.0f), 0);
  EXPECT_EQ(bf16_ulp_distance(-1.0f, 1.0f), 2 * 0x3f80);
  EXPECT_EQ(bf16_ulp_distance(1.0f, 1.001f), 0);  // both round to 1.0 in bf16
}

TEST(Metrics, ShapeMismatchIsAnInternalError) {
  const std::string message = testing::harness_error_message(
      [] { compute_metrics(Tensor::zeros({2, 3}), Tensor::zeros({3, 2})); }, ErrorKind::kInternal);
  testing::expect_mentions(message, "[2, 3]");
}

}  // namespace
}  // namespace dflash
