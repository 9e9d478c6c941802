// The reference's candidate selector (docs/spec/dflash2.md §3.4) on rows written by hand: the
// top-K order (larger values first, lower ids first on equal values, NaN above every number, as
// torch.topk), the unary scores, the edge scores and the greedy walk (first maximum, lowest slot on
// ties). Every expectation is written out, not computed by the selector's own code.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "reference/candidate_selector.h"

namespace dflash {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

Dflash2Config config(int top_k, int rank) {
  Dflash2Config c;
  c.enabled = true;
  c.selector_top_k = top_k;
  c.selector_rank = rank;
  c.output_multiplier = 0.5;
  return c;
}

AlignedMatrix<float> matrix(const std::vector<std::vector<float>>& rows) {
  AlignedMatrix<float> m(static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size()));
  for (size_t r = 0; r < rows.size(); ++r) {
    for (size_t c = 0; c < rows[r].size(); ++c) m.row(static_cast<int64_t>(r))[c] = rows[r][c];
  }
  return m;
}

TEST(ReferenceSelector, TopKOrderWithNaNTiesAndInfinities) {
  // ids:                        0     1     2     3      4      5     6     7
  const auto logits = matrix({{1.0f, kNaN, 3.0f, 3.0f, -kInf, kNaN, kInf, 0.0f}});
  PreparedSelector<float> w;
  w.predecessor.assign(8, 0.0f);  // rank 1, every edge term zero: edge = unary
  w.successor.assign(8, 0.0f);
  const auto hidden = matrix({{1.0f}});
  const SelectorResult<float> s = select_candidates(config(6, 1), w, /*anchor=*/0, logits, hidden, 0, 1);
  EXPECT_EQ(s.topk_ids, (std::vector<int32_t>{1, 5, 6, 2, 3, 0}));
  ASSERT_EQ(s.unary.size(), 6u);
  EXPECT_TRUE(std::isnan(s.unary[0]) && std::isnan(s.unary[1]));
  EXPECT_EQ(s.unary[2], kInf);
  EXPECT_EQ(s.unary[3], 1.5f);
  EXPECT_EQ(s.unary[5], 0.5f);
  // The walk: slot 0's score is NaN, and a scan that moves only to a larger score stays there.
  EXPECT_EQ(s.walk_index, (std::vector<int32_t>{0}));
  EXPECT_EQ(s.draft_tokens, (std::vector<int32_t>{1}));
}

TEST(ReferenceSelector, TheWalkFollowsItsPredecessorAndTakesTheLowestSlotOnTies) {
  // Two mask rows, K 3, rank 1: edge[t, p, c] = unary[t, c] + A[pred] · Hh[t] · Bs[id].
  const auto logits = matrix({{4.0f, 2.0f, 3.0f, 0.0f}, {0.0f, 1.0f, 2.0f, 2.0f}});
  // Row 0's top 3: ids 0, 2, 1 (unary 2, 1.5, 1); row 1's: ids 2, 3, 1 (unary 1, 1, 0.5).
  PreparedSelector<float> w;
  w.predecessor = {0.0f, 0.0f, 4.0f, 0.0f};  // only id 2 as predecessor adds anything
  w.successor = {0.0f, 1.0f, 0.0f, 0.0f};    // and only to candidate id 1
  const auto hidden = matrix({{1.0f}, {1.0f}});
  const SelectorResult<float> s = select_candidates(config(3, 1), w, /*anchor=*/3, logits, hidden, 0, 2);
  EXPECT_EQ(s.topk_ids, (std::vector<int32_t>{0, 2, 1, 2, 3, 1}));
  // Slot 0 (predecessor: the anchor, id 3): scores 2, 1.5, 1: slot 0, token 0.
  // Slot 1, from predecessor slot 0 (id 0): scores 1, 1, 0.5: a tie, the lower slot 0, token 2.
  EXPECT_EQ(s.walk_index, (std::vector<int32_t>{0, 0}));
  EXPECT_EQ(s.draft_tokens, (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(s.walk_scores, (std::vector<float>{2.0f, 1.5f, 1.0f, 1.0f, 1.0f, 0.5f}));
  // From predecessor slot 1 (id 2) the candidate id 1 gains 4: edge[1, 1, 2] = 0.5 + 4.
  EXPECT_EQ(s.edge_scores[(1 * 3 + 1) * 3 + 2], 4.5f);
}

}  // namespace
}  // namespace dflash
