// First divergence on a hand-made list of stage checks.
#include "compare/divergence.h"

#include <gtest/gtest.h>

#include "core/stages.h"

namespace dflash {
namespace {

// A 4x3 stage whose row `bad_row` is off by `error` in column `bad_col`.
StageCheck stage(const std::string& name, int64_t bad_row, int64_t bad_col, float error) {
  Tensor expected({4, 3}, std::vector<float>(12, 1.0f));
  Tensor actual = expected;
  if (bad_row >= 0) actual.row(bad_row)[bad_col] += error;
  const StageBound bound = {0.01, 0.05, 0.005};
  return check_stage(name, stage_order_index(name, 2), expected, actual, bound);
}

TEST(Divergence, FirstFailingStageInForwardOrderWhateverTheListOrder) {
  // Given out of order: logits and L1.q fail, L0.attn fails, the rest pass.
  const std::vector<StageCheck> checks = {
      stage("logits", 0, 0, 3.0f), stage("L1.q", 1, 1, 1.0f), stage("ctx_proj", -1, 0, 0),
      stage("L0.attn", 2, 1, 0.5f), stage("L0.q", -1, 0, 0), stage("embed", 3, 2, 0.001f),
  };
  const auto d = first_divergence(checks, 2);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->stage, "L0.attn");
  EXPECT_EQ(d->layer, 0);
  EXPECT_EQ(d->row, 2);
  EXPECT_EQ(d->col, 1);
  EXPECT_DOUBLE_EQ(d->expected, 1.0);
  EXPECT_DOUBLE_EQ(d->actual, 1.5);
  // Row 2: ||d|| / ||e|| = 0.5 / sqrt(3) > 0.01, so the norm criterion is the one named.
  EXPECT_EQ(d->criterion, "rel-rms");
  EXPECT_NEAR(d->value, 0.5 / std::sqrt(3.0), 1e-7);
  EXPECT_DOUBLE_EQ(d->bound, 0.01);
  const std::string text = describe_divergence(*d);
  EXPECT_NE(text.find("L0.attn (layer 0), row 2, column 1"), std::string::npos) << text;
}

TEST(Divergence, NothingFailsNothingReported) {
  const std::vector<StageCheck> checks = {stage("ctx_proj", -1, 0, 0), stage("embed", 0, 0, 0.001f)};
  EXPECT_FALSE(first_divergence(checks, 2).has_value());
}

TEST(Divergence, FirstRowOverTheBoundIsReported) {
  Tensor expected({3, 3}, std::vector<float>(9, 1.0f));
  Tensor actual = expected;
  actual.row(2)[0] = 9.0f;  // the worst row
  actual.row(1)[2] = 1.2f;  // an earlier row, also over the 0.05 tail bound
  const StageCheck check = check_stage("final_norm", stage_order_index("final_norm", 2), expected, actual,
                                       StageBound{1.0, 0.05, 0.0});
  ASSERT_FALSE(check.passed);
  EXPECT_EQ(check.fail_row, 1);
  EXPECT_EQ(check.fail_col, 2);
  EXPECT_EQ(check.fail_criterion, "max-rel");
  const auto d = first_divergence({check}, 2);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->layer, -1);
  EXPECT_NEAR(d->actual, 1.2, 1e-6);
}

}  // namespace
}  // namespace dflash
