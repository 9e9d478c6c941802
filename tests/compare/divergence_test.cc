// First divergence on a hand-made list of stage checks.
#include "compare/divergence.h"

#include <gtest/gtest.h>

#include "compare/stages.h"

namespace dflash {
namespace {

TEST(Stages, ForwardOrderOfATwoLayerDrafter) {
  const std::vector<std::string> order = forward_stage_order(2);
  ASSERT_EQ(order.size(), 2u + 2 * 9 + 2);
  EXPECT_EQ(order[0], "ctx_proj");
  EXPECT_EQ(order[1], "embed");
  const std::vector<std::string> layer0 = {"L0.attn_norm", "L0.q", "L0.k", "L0.v", "L0.attn",
                                           "L0.o_proj", "L0.mlp_norm", "L0.mlp", "L0.out"};
  for (size_t i = 0; i < layer0.size(); ++i) EXPECT_EQ(order[2 + i], layer0[i]);
  EXPECT_EQ(order[11], "L1.attn_norm");
  EXPECT_EQ(order[20], "final_norm");
  EXPECT_EQ(order[21], "logits");
  for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(stage_order_index(order[i], 2), static_cast<int>(i));
}

TEST(Stages, NamesOutsideTheDrafterAreNotStages) {
  EXPECT_EQ(stage_order_index("L2.q", 2), -1);
  EXPECT_EQ(stage_order_index("L0.qq", 2), -1);
  EXPECT_EQ(stage_order_index("L01.q", 2), -1);
  EXPECT_EQ(stage_order_index("Lx.q", 2), -1);
  EXPECT_EQ(stage_order_index("draft_tokens", 2), -1);
  StageId id;
  ASSERT_TRUE(parse_stage_name("L1.mlp_norm", 2, &id));
  EXPECT_EQ(id.kind, StageKind::kMlpNorm);
  EXPECT_EQ(id.layer, 1);
}

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
