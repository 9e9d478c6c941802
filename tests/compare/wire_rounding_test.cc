// ρ² and ρ∞ of docs/spec/tensor-parallel.md §9.2, measured on hand-made partials.
#include "compare/wire_rounding.h"

#include <gtest/gtest.h>

#include "core/stages.h"

namespace dflash {
namespace {

Tap tap(StageKind kind, int layer, int rank, std::vector<float> values, int64_t rows, int64_t cols) {
  return {stage_name(kind, layer, rank), Tensor({rows, cols}, std::move(values))};
}

std::vector<const Tap*> pointers(const std::vector<Tap>& taps) {
  std::vector<const Tap*> out;
  for (const Tap& t : taps) out.push_back(&t);
  return out;
}

TEST(WireRounding, LargestRatiosOverTheRowsByHand) {
  const std::vector<Tap> taps = {
      // Row 0 cancels: p0 = (3, 0), p1 = (-1, 0), y = (2, 0): ρ² = (9 + 1) / 4, ρ∞ = (3 + 1) / 2.
      // Row 1 agrees: p0 = p1 = (1, 1), y = (2, 2): ρ² = 4 / 8, ρ∞ = 2 / 2.
      tap(StageKind::kOProj, 0, 0, {3, 0, 1, 1}, 2, 2),
      tap(StageKind::kOProj, 0, 1, {-1, 0, 1, 1}, 2, 2),
      // Every row sums to zero: nothing to measure, ρ = 1.
      tap(StageKind::kMlp, 0, 0, {1, -1}, 1, 2),
      tap(StageKind::kMlp, 0, 1, {-1, 1}, 1, 2),
      // Layer 1: rank 1's o_proj partial is missing; the mlp partials disagree in shape.
      tap(StageKind::kOProj, 1, 0, {5, 5}, 1, 2),
      tap(StageKind::kMlp, 1, 0, {1, 2}, 1, 2),
      tap(StageKind::kMlp, 1, 1, {1, 2}, 2, 1),
  };
  const WireRounding w = measure_wire_rounding(pointers(taps), 2, 2);
  ASSERT_EQ(w.rho2.size(), 4u);
  ASSERT_EQ(w.rho_inf.size(), 4u);
  EXPECT_DOUBLE_EQ(w.rho2[0], 2.5);
  EXPECT_DOUBLE_EQ(w.rho_inf[0], 2.0);
  for (size_t j = 1; j < 4; ++j) {
    EXPECT_DOUBLE_EQ(w.rho2[j], 1.0) << j;
    EXPECT_DOUBLE_EQ(w.rho_inf[j], 1.0) << j;
  }
}

TEST(WireRounding, UncorrelatedPartialsGiveOneAndAlignedOnesLess) {
  // Orthogonal partials: their squared norms add up to ‖y‖² (ρ = 1); equal ones: ρ² = 1/N.
  const std::vector<Tap> orthogonal = {tap(StageKind::kOProj, 0, 0, {2, 0}, 1, 2),
                                       tap(StageKind::kOProj, 0, 1, {0, 3}, 1, 2)};
  EXPECT_DOUBLE_EQ(measure_wire_rounding(pointers(orthogonal), 1, 2).rho2[0], 1.0);
  std::vector<Tap> equal;
  for (int r = 0; r < 4; ++r) equal.push_back(tap(StageKind::kMlp, 0, r, {1, 2, 3}, 1, 3));
  const WireRounding w = measure_wire_rounding(pointers(equal), 1, 4);
  EXPECT_DOUBLE_EQ(w.rho2[1], 0.25);
  EXPECT_DOUBLE_EQ(w.rho_inf[1], 1.0);
}

TEST(WireRounding, NothingToMeasureAtOneRank) {
  const std::vector<Tap> taps = {tap(StageKind::kOProj, 0, 0, {3, 0}, 1, 2)};
  const WireRounding w = measure_wire_rounding(pointers(taps), 1, 1);
  EXPECT_EQ(w.rho2, std::vector<double>({1.0, 1.0}));
  EXPECT_EQ(w.rho_inf, std::vector<double>({1.0, 1.0}));
}

}  // namespace
}  // namespace dflash
