// Tie-aware draft-token agreement on hand-made logits.
#include "compare/tokens.h"

#include <limits>

#include <gtest/gtest.h>

namespace dflash {
namespace {

// Three logits rows of a 5-token vocabulary. Row RMS: row 0 sqrt(204.8001 / 5) = 6.400001,
// row 2 sqrt(126.1125 / 5) = 5.022200.
Tensor three_rows() {
  return Tensor({3, 5}, {
                            10.0f, 9.99f, 1.0f, 0.0f, -2.0f,  // tokens 0 and 1 within 0.01
                            10.0f, 5.0f, 1.0f, 0.0f, -2.0f,   // a clear winner
                            -10.0f, 3.0f, 2.9f, 2.95f, 0.0f,  // row max magnitude 10, top is token 1 (3.0)
                        });
}

TEST(Tokens, AgreeTieExcusedAndMismatch) {
  // Norm bound 1e-3: row 0's threshold is 2 · 1e-3 · 6.400001 = 0.0128.
  const TokenCheck check = compare_draft_tokens({0, 0, 1}, {1, 1, 1}, three_rows(), 1e-3);
  ASSERT_EQ(check.rows.size(), 3u);
  EXPECT_EQ(check.rows[0].verdict, TokenVerdict::kTieExcused);  // gap 0.01 <= 0.0128
  EXPECT_NEAR(check.rows[0].gap, 0.01, 1e-6);
  EXPECT_NEAR(check.rows[0].threshold, 0.0128, 1e-7);
  EXPECT_EQ(check.rows[1].verdict, TokenVerdict::kMismatch);  // gap 5 > threshold
  EXPECT_NEAR(check.rows[1].gap, 5.0, 1e-6);
  EXPECT_EQ(check.rows[2].verdict, TokenVerdict::kAgree);
  EXPECT_EQ(check.agree, 1);
  EXPECT_EQ(check.excused, 1);
  EXPECT_EQ(check.mismatch, 1);
}

TEST(Tokens, TheExcuseNeedsBothTokensNearTheTop) {
  // Row 2: the sides picked tokens 3 (2.95) and 2 (2.9); the top is 3.0. Gap to the top of the lower
  // one is 0.1: a bound of 9e-3 (threshold 2 · 9e-3 · 5.0222 = 0.0904) refuses it, 1.1e-2
  // (threshold 0.1105) excuses it.
  const Tensor logits = three_rows();
  EXPECT_EQ(compare_draft_tokens({0, 0, 3}, {0, 0, 2}, logits, 9e-3).mismatch, 1);
  EXPECT_EQ(compare_draft_tokens({0, 0, 3}, {0, 0, 2}, logits, 1.1e-2).excused, 1);
}

TEST(Tokens, AWrongExpectedTokenFarBelowTheTopIsAMismatch) {
  // A corrupted expectation: token 4 (-2.0) where the logits say 0. Its gap is 12.
  const TokenCheck check = compare_draft_tokens({4, 0, 1}, {0, 0, 1}, three_rows(), 1e-3);
  EXPECT_EQ(check.mismatch, 1);
  EXPECT_EQ(check.rows[0].verdict, TokenVerdict::kMismatch);
  EXPECT_NEAR(check.rows[0].gap, 12.0, 1e-6);
}

TEST(Tokens, OutOfVocabularyOrNonFiniteIsAMismatch) {
  EXPECT_EQ(compare_draft_tokens({0, 0, 1}, {7, 0, 1}, three_rows(), 1.0).mismatch, 1);
  Tensor logits = three_rows();
  logits.row(0)[3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(compare_draft_tokens({0, 0, 1}, {1, 0, 1}, logits, 1.0).mismatch, 1);
}

// DFlash2 walk ties (excuse_walk_ties): 3 mask rows, K = 2, V = 4. The expected walk drafts
// 1, 2, 0; the actual drafts 2 at row 0 (walk scores 5.0 vs 4.9: a tie at bound 0.02), then at row
// 1 another candidate (excused: the walks now follow different predecessors), and at row 2 a
// token that is no candidate and far below them (never excused).
TEST(WalkTies, ExcusedOnlyWithinTheWalkScoresBoundOrAsItsConsequence) {
  const Tensor logits({3, 4}, {0.0f, 3.0f, 2.9f, 0.5f, 0.0f, 1.0f, 2.0f, 0.3f, 4.0f, 3.9f, 0.1f, -3.0f});
  const Tensor ids({3, 2}, {1, 2, 2, 1, 0, 1});
  const Tensor walk({3, 2}, {5.0f, 4.9f, 3.0f, 1.0f, 2.0f, 1.9f});
  const std::vector<int32_t> expected = {1, 2, 0}, actual = {2, 1, 3};
  TokenCheck check = compare_draft_tokens(expected, actual, logits, 1e-3);
  ASSERT_EQ(check.mismatch, 3);
  excuse_walk_ties(&check, ids, walk, logits, 0.02);
  EXPECT_EQ(check.rows[0].verdict, TokenVerdict::kTieExcused);
  EXPECT_EQ(check.rows[1].verdict, TokenVerdict::kTieExcused);
  EXPECT_EQ(check.rows[2].verdict, TokenVerdict::kMismatch);
  EXPECT_EQ(check.mismatch, 1);
  EXPECT_EQ(check.excused, 2);
  // Negative control: the same first difference at a bound 10 times tighter is a mismatch, and so
  // is every later row (no tie opened the walks' divergence).
  TokenCheck tight = compare_draft_tokens(expected, actual, logits, 1e-3);
  excuse_walk_ties(&tight, ids, walk, logits, 0.002);
  EXPECT_EQ(tight.mismatch, 3);
}

}  // namespace
}  // namespace dflash
