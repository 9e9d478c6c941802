// Acceptance from a target side (compare/acceptance.h): greedy runs, the sampling acceptance
// 1 - TV, the binomial test of a pinned vector (its false-alarm rate measured by simulation), and
// the collapse canary.
#include "compare/acceptance.h"

#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <random>
#include <vector>

#include "compare/distribution.h"

namespace dflash {
namespace {

TargetSide tokens_only(std::vector<int32_t> tokens) {
  TargetSide t;
  t.tokens = std::move(tokens);
  return t;
}

TEST(Acceptance, GreedyRunStopsAtTheFirstDifference) {
  EXPECT_EQ(greedy_accepted({1, 2, 3}, {1, 2, 3}), 3);
  EXPECT_EQ(greedy_accepted({1, 2, 3}, {1, 5, 3}), 1);  // position 3 matches but the run stopped
  EXPECT_EQ(greedy_accepted({4, 2, 3}, {1, 2, 3}), 0);
  EXPECT_EQ(greedy_accepted({}, {1}), 0);
}

TEST(Acceptance, SamplingAcceptanceIsOneMinusTotalVariation) {
  TargetSide t = tokens_only({0, 2});
  t.logits = Tensor({2, 4}, {3.0f, 1.0f, -1.0f, 0.5f, 0.0f, 0.2f, 2.0f, -3.0f});
  const Tensor draft({2, 4}, {2.5f, 1.5f, -1.0f, 0.0f, 0.0f, 0.2f, 2.0f, -3.0f});
  for (int64_t r = 0; r < 2; ++r) {
    const double alpha = sampling_acceptance(t, r, draft.row(r), 4);
    const double tv = measure_distances(t.logits->row(r), draft.row(r), 4, 1.0).tv;
    EXPECT_NEAR(alpha, 1.0 - tv, 1e-12) << r;
  }
  EXPECT_NEAR(sampling_acceptance(t, 1, draft.row(1), 4), 1.0, 1e-12);  // identical rows
  // A drafter's logits of another width give no alpha (and read nothing out of bounds).
  const Tensor wide({2, 5}, std::vector<float>(10, 0.0f));
  EXPECT_TRUE(measure_block(0, 0, t, {0, 2}, &wide).sampling.empty());
  EXPECT_EQ(measure_block(0, 0, t, {0, 2}, &draft).sampling.size(), 2u);
}

TEST(Acceptance, TopKTargetSamplesFromItsKValues) {
  // Target top-2: ids 3 and 1 with values log 3 and 0: p = (0, 1/4, 0, 3/4). Draft uniform: q = 1/4 each.
  TargetSide t = tokens_only({3});
  t.k = 2;
  t.topk_values = Tensor({1, 2}, {static_cast<float>(std::log(3.0)), 0.0f});
  t.topk_ids = {3, 1};
  const std::vector<float> draft = {0.0f, 0.0f, 0.0f, 0.0f};
  EXPECT_NEAR(sampling_acceptance(t, 0, draft.data(), 4), 0.25 + 0.25, 1e-6);
}

TEST(Acceptance, SideSummaryCountsRunsMatchesAndExpectedLength) {
  TargetSide t = tokens_only({5, 6, 7});
  t.logits = Tensor::zeros({3, 8});
  std::vector<BlockAcceptance> blocks = {measure_block(0, 0, t, {5, 6, 7}, nullptr),
                                         measure_block(0, 1, t, {5, 0, 7}, nullptr)};
  const SideAcceptance side = summarize_side("d", 0, blocks);
  EXPECT_EQ(side.blocks, 2);
  EXPECT_EQ(side.drafted, 6);
  EXPECT_EQ(side.accepted, 4);
  EXPECT_DOUBLE_EQ(side.mean_length, (4.0 + 2.0) / 2);
  ASSERT_EQ(side.positions.size(), 3u);
  EXPECT_EQ(side.positions[2].reached, 1);
  EXPECT_EQ(side.positions[2].matched, 2);
  EXPECT_FALSE(side.sampling_length.has_value());  // no draft logits

  // With the draft's logits equal to the target's, alpha = 1 everywhere: expected length B.
  const Tensor same = *t.logits;
  const SideAcceptance sampled = summarize_side("d", 0, {measure_block(0, 0, t, {5, 6, 7}, &same)});
  ASSERT_TRUE(sampled.sampling_length.has_value());
  EXPECT_NEAR(*sampled.sampling_length, 4.0, 1e-12);
}

TEST(Acceptance, BinomialTailMatchesHandValues) {
  EXPECT_NEAR(binomial_lower_tail(2, 10, 0.5), (1 + 10 + 45) / 1024.0, 1e-15);
  EXPECT_NEAR(binomial_lower_tail(0, 3, 0.9), 0.001, 1e-15);
  EXPECT_EQ(binomial_lower_tail(4, 5, 1.0), 0.0);
  EXPECT_EQ(binomial_lower_tail(5, 5, 1.0), 1.0);
  EXPECT_EQ(binomial_lower_tail(0, 5, 0.0), 1.0);
  EXPECT_EQ(binomial_lower_tail(-1, 5, 0.3), 0.0);
  // Far in the tail of a large sample, no term underflows the sum away.
  const double tail = binomial_lower_tail(300, 1000, 0.5);
  EXPECT_GT(tail, 0.0);
  EXPECT_LT(tail, 1e-30);
}

SideAcceptance side_with(int blocks, int reached_at_1) {
  std::vector<BlockAcceptance> list;
  for (int b = 0; b < blocks; ++b) {
    TargetSide t = tokens_only({1, 1});
    list.push_back(
        measure_block(0, b, t, b < reached_at_1 ? std::vector<int32_t>{1, 0} : std::vector<int32_t>{0, 0}, nullptr));
  }
  return summarize_side("drafter", 0, list);
}

TEST(Acceptance, PinnedFullAcceptanceFailsOnOneMiss) {
  const AcceptancePin pin{{1.0}, "target is the drafter"};
  EXPECT_TRUE(test_pin(side_with(40, 40), pin)[0].passed);
  const std::vector<PinTest> one_miss = test_pin(side_with(40, 39), pin);
  ASSERT_EQ(one_miss.size(), 1u);
  EXPECT_FALSE(one_miss[0].passed);
  EXPECT_EQ(one_miss[0].least_passing, 40);
}

TEST(Acceptance, PinnedRateToleratesWhatTheSampleSizeExplains) {
  const AcceptancePin pin{{0.7}, ""};
  const PinTest near = test_pin(side_with(48, 28), pin)[0];  // 58 % of 48 against 70 %
  EXPECT_TRUE(near.passed) << near.p_value;
  const PinTest collapsed = test_pin(side_with(48, 5), pin)[0];
  EXPECT_FALSE(collapsed.passed) << collapsed.p_value;
  // The least passing count is the boundary: one fewer fails.
  EXPECT_GE(binomial_lower_tail(near.least_passing, 48, 0.7), near.level);
  EXPECT_LT(binomial_lower_tail(near.least_passing - 1, 48, 0.7), near.level);
}

// The stated false-alarm rate, measured: sides drawn from the pinned rate itself fail at most
// about kAcceptanceFalseAlarm of the time (the binomial test is exact, so less, by discreteness).
TEST(Acceptance, FalseAlarmRateOfThePinTestIsAtMostItsLevel) {
  std::mt19937_64 rng(7);
  const int trials = 20000, n = 48;
  const double p = 0.7;
  std::bernoulli_distribution accept(p);
  int failures = 0;
  for (int i = 0; i < trials; ++i) {
    int reached = 0;
    for (int b = 0; b < n; ++b) reached += accept(rng) ? 1 : 0;
    failures += test_pin(side_with(n, reached), AcceptancePin{{p}, ""})[0].passed ? 0 : 1;
  }
  std::cout << "[false-alarm] " << failures << " of " << trials << " sides at the pinned rate failed\n";
  EXPECT_LE(failures, static_cast<int>(2 * kAcceptanceFalseAlarm * trials) + 5) << failures << " of " << trials;
}

TEST(Acceptance, CanaryNamesACollapsedDrafter) {
  const SideAcceptance reference = side_with(20, 20);  // length 2
  const SideAcceptance collapsed = side_with(20, 0);   // length 1
  const std::optional<AcceptanceFailure> f = canary(reference, collapsed);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->check, "canary");
  EXPECT_NE(f->detail.find("quantized drafter"), std::string::npos) << f->detail;
  EXPECT_FALSE(canary(reference, side_with(20, 2)).has_value());  // 1.10 > 1.05
  EXPECT_FALSE(canary(side_with(20, 9), collapsed).has_value());  // reference 1.45, not above 1.5
}

TEST(Acceptance, TallyTestsDraftersNotTheFixture) {
  AcceptanceTally tally;
  const TargetSide t = tokens_only({1, 2});
  for (int b = 0; b < 10; ++b) {
    tally.add(0, "reference-fp64", 0, b, t, {1, 2}, nullptr);
    tally.add(-1, "fixture", 0, b, t, {0, 2}, nullptr);  // the fixture's own drafts miss: not under test
    tally.add(1, "broken", 0, b, t, {0, 0}, nullptr);
  }
  const AcceptanceReport report = tally.finish(AcceptancePin{{1.0, 1.0}, ""}, {{-1, 0}, {0, 1}});
  ASSERT_EQ(report.sides.size(), 3u);
  EXPECT_EQ(report.sides[0].name, "fixture");
  EXPECT_EQ(report.pin_tests.size(), 2u);
  int pinned = 0, canaries = 0;
  for (const AcceptanceFailure& f : report.failures) {
    EXPECT_EQ(f.side, "broken") << f.detail;
    pinned += f.check == "pinned-acceptance";
    canaries += f.check == "canary";
  }
  EXPECT_EQ(pinned, 2);
  EXPECT_EQ(canaries, 1);  // reference-fp64 (length 3) vs broken (length 1)
}

}  // namespace
}  // namespace dflash
