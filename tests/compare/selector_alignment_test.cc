// The DFlash2 selector taps' alignment (compare/selector_alignment.h): candidates that differ by a
// tie are put back in the expected order with their values; a difference that is not a tie is
// left for the exact check to fail (negative control); the walk rows are teacher-forced.
#include <gtest/gtest.h>

#include <stdexcept>

#include "compare/selector_alignment.h"
#include "core/stages.h"

namespace dflash {
namespace {

// Two mask rows, K = 2, V = 4. Row 0's candidates are tokens 1 and 2, row 1's tokens 3 and 0.
struct Side {
  std::vector<Tap> taps;
  Side(std::vector<float> ids, std::vector<float> values, std::vector<float> edges, std::vector<float> walk) {
    taps.push_back({stage_name(StageKind::kSelTopkIds), Tensor({2, 2}, ids)});
    taps.push_back({stage_name(StageKind::kSelTopkValues), Tensor({2, 2}, values)});
    taps.push_back({stage_name(StageKind::kSelUnary), Tensor({2, 2}, values)});
    taps.push_back({stage_name(StageKind::kSelEdgeScores), Tensor({2, 2, 2}, edges)});
    taps.push_back({stage_name(StageKind::kSelWalkScores), Tensor({2, 2}, walk)});
  }
  std::vector<const Tap*> pointers() const {
    std::vector<const Tap*> out;
    for (const Tap& t : taps) out.push_back(&t);
    return out;
  }
};

const Tensor& tap(const SelectorAlignment& a, StageKind kind) {
  for (const Tap& t : a.taps) {
    if (t.name == stage_name(kind)) return t.value;
  }
  throw std::runtime_error("no tap");
}

// Expected: row 0 ids {1, 2} (walk takes slot 0: token 1), row 1 ids {3, 0} from predecessor slot 0.
const Side kExpected({1, 2, 3, 0}, {5.0f, 4.99f, 3, 1}, {9, 8, 9, 8, 7, 6, 5, 4}, {9, 8, 7, 6});
// Logits per row (V = 4): row 0 has tokens 1 and 2 within a tie, row 1 tokens 3 and 0 far apart.
const Tensor kLogits({2, 4}, {0.0f, 5.0f, 4.99f, 0.1f, 1.0f, 0.2f, 0.3f, 3.0f});

TEST(SelectorAlignment, IdenticalSidesAreLeftAsTheyAre) {
  const auto a = align_selector_taps(kExpected.pointers(), kExpected.taps, kLogits, 0.01, {1, 3});
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->reordered_rows, 0);
  EXPECT_EQ(a->untied_rows, 0);
  EXPECT_EQ(tap(*a, StageKind::kSelEdgeScores).values, kExpected.taps[3].value.values);
  EXPECT_EQ(tap(*a, StageKind::kSelWalkScores).values, kExpected.taps[4].value.values);
}

TEST(SelectorAlignment, TiedCandidatesInTheOtherOrderAreAligned) {
  // Row 0's two candidates swapped (their logits 5.0 and 4.99 are a tie at rms_bound 0.01:
  // threshold 2 · 0.01 · RMS(row 0) = 0.071); the edge rows of row 1 follow the swapped predecessor.
  const Side actual({2, 1, 3, 0}, {4.99f, 5.0f, 3, 1}, {8, 9, 8, 9, 5, 4, 7, 6}, {8, 9, 7, 6});
  const auto a = align_selector_taps(kExpected.pointers(), actual.taps, kLogits, 0.01, {1, 3});
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->reordered_rows, 1);
  EXPECT_EQ(a->untied_rows, 0);
  EXPECT_EQ(tap(*a, StageKind::kSelTopkIds).values, kExpected.taps[0].value.values);
  EXPECT_EQ(tap(*a, StageKind::kSelTopkValues).values, kExpected.taps[1].value.values);
  EXPECT_EQ(tap(*a, StageKind::kSelEdgeScores).values, kExpected.taps[3].value.values);
  EXPECT_EQ(tap(*a, StageKind::kSelWalkScores).values, kExpected.taps[4].value.values);
}

TEST(SelectorAlignment, ADifferenceThatIsNotATieIsLeftToFail) {
  // Row 1's candidates swapped although their logits (3.0 and 1.0) are far apart.
  const Side actual({1, 2, 0, 3}, {5.0f, 4.99f, 1, 3}, {9, 8, 9, 8, 6, 7, 4, 5}, {9, 8, 6, 7});
  const auto a = align_selector_taps(kExpected.pointers(), actual.taps, kLogits, 0.01, {1, 3});
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->untied_rows, 1);
  EXPECT_EQ(tap(*a, StageKind::kSelTopkIds).values, actual.taps[0].value.values);
  EXPECT_NE(tap(*a, StageKind::kSelTopkIds).values, kExpected.taps[0].value.values);
  // The same swap is a tie at a bound 100 times looser: the threshold is derived, not fixed.
  const auto loose = align_selector_taps(kExpected.pointers(), actual.taps, kLogits, 1.0, {1, 3});
  ASSERT_TRUE(loose.has_value());
  EXPECT_EQ(loose->untied_rows, 0);
  EXPECT_EQ(tap(*loose, StageKind::kSelTopkIds).values, kExpected.taps[0].value.values);
}

TEST(SelectorAlignment, WalkRowsAreTeacherForced) {
  // The actual walk chose slot 1 at row 0 (token 2) and so read row 1's predecessor-1 edge row;
  // compared, it is the row at the expected predecessor (slot 0).
  const Side actual({1, 2, 3, 0}, {5.0f, 4.99f, 3, 1}, {9, 8, 9, 8, 7, 6, 5, 4}, {9, 8, 5, 4});
  const auto a = align_selector_taps(kExpected.pointers(), actual.taps, kLogits, 0.01, {1, 3});
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(tap(*a, StageKind::kSelWalkScores).values, kExpected.taps[4].value.values);
}

TEST(SelectorAlignment, MissingTapsOrShapesGiveNothing) {
  std::vector<Tap> partial(kExpected.taps.begin(), kExpected.taps.begin() + 3);
  EXPECT_FALSE(align_selector_taps(kExpected.pointers(), partial, kLogits, 0.01, {1, 3}).has_value());
}

}  // namespace
}  // namespace dflash
