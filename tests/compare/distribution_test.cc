// Distribution distances between two sides' logits (compare/distribution.h): the measures against
// closed forms, the bounds of docs/tolerances.md §10 held by every row whose logits stay within the
// tail bound and nearly attained where the theory says, and planted controls that break them.
#include "compare/distribution.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "tests/support/harness_error.h"

namespace dflash {
namespace {

TEST(Distribution, IdenticalRowsAreAtDistanceZero) {
  const std::vector<float> row = {1.5f, -2.0f, 0.25f, 3.0f};
  const DistributionDistances d = measure_distances(row.data(), row.data(), 4, 1.0);
  EXPECT_EQ(d.tv, 0);
  EXPECT_EQ(d.kl_expected_actual, 0);
  EXPECT_EQ(d.kl_actual_expected, 0);
  EXPECT_EQ(d.top1_gap, 0);
}

TEST(Distribution, TwoTokensMatchTheirClosedForms) {
  // p = (1/2, 1/2); q = (s, 1 - s) with s = 1 / (1 + e^-x).
  const double x = 0.8;
  const std::vector<float> e = {0.0f, 0.0f}, a = {static_cast<float>(x), 0.0f};
  const double s = 1.0 / (1.0 + std::exp(-static_cast<double>(a[0])));
  const DistributionDistances d = measure_distances(e.data(), a.data(), 2, 1.0);
  EXPECT_NEAR(d.tv, s - 0.5, 1e-15);
  EXPECT_NEAR(d.kl_expected_actual, 0.5 * std::log(0.5 / s) + 0.5 * std::log(0.5 / (1 - s)), 1e-15);
  EXPECT_NEAR(d.kl_actual_expected, s * std::log(s / 0.5) + (1 - s) * std::log((1 - s) / 0.5), 1e-15);
  EXPECT_NEAR(d.top1_gap, s - 0.5, 1e-15);  // token 0 is the expected top (lowest index of the tie)
}

TEST(Distribution, TemperatureDividesTheLogits) {
  const std::vector<float> e = {2.0f, -1.0f, 0.5f}, a = {1.0f, 0.0f, 0.5f};
  const std::vector<float> e2 = {1.0f, -0.5f, 0.25f}, a2 = {0.5f, 0.0f, 0.25f};
  const DistributionDistances hot = measure_distances(e.data(), a.data(), 3, 2.0);
  const DistributionDistances halved = measure_distances(e2.data(), a2.data(), 3, 1.0);
  EXPECT_NEAR(hot.tv, halved.tv, 1e-15);
  EXPECT_NEAR(hot.kl_expected_actual, halved.kl_expected_actual, 1e-15);
}

TEST(Distribution, NonFiniteLogitsGiveNanAndFail) {
  const std::vector<float> e = {1.0f, 2.0f}, a = {1.0f, NAN};
  const DistributionDistances d = measure_distances(e.data(), a.data(), 2, 1.0);
  EXPECT_TRUE(std::isnan(d.tv));
  EXPECT_TRUE(std::isinf(distance_ratio(d, distance_bound(0.1, 2.0, 1.0))));
}

TEST(Distribution, BoundsFollowFromTheSpread) {
  const DistributionBound b = distance_bound(0.01, 5.0, 0.5);  // sigma = 2 · 0.01 · 5 / 0.5 = 0.2
  EXPECT_DOUBLE_EQ(b.sigma, 0.2);
  EXPECT_DOUBLE_EQ(b.tv, std::tanh(0.05));
  EXPECT_DOUBLE_EQ(b.kl, 0.04 / 8);
  EXPECT_DOUBLE_EQ(b.top1_gap, std::tanh(0.05));
}

// Every row whose logits move by at most delta per element stays inside the bounds, over random
// rows of several shapes and sizes (the theorem's claim, checked where it can be tight or loose).
TEST(Distribution, EveryRowWithinTheTailBoundIsWithinTheDistanceBounds) {
  std::mt19937_64 rng(12345);
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  for (int trial = 0; trial < 2000; ++trial) {
    const int64_t V = 2 + trial % 61;
    const double scale = 0.5 + 10.0 * (trial % 7);
    const double max_rel = std::pow(10.0, -1.0 - (trial % 5));
    const double temperature = trial % 3 == 0 ? 0.5 : (trial % 3 == 1 ? 1.0 : 2.0);
    std::vector<float> e(static_cast<size_t>(V)), a(static_cast<size_t>(V));
    double row_scale = 0;
    for (float& v : e) {
      v = static_cast<float>(scale * unit(rng));
      row_scale = std::max(row_scale, std::fabs(static_cast<double>(v)));
    }
    for (int64_t j = 0; j < V; ++j) {
      const double sign = trial % 4 == 0 ? (j % 2 ? 1.0 : -1.0) : unit(rng);  // extremes and random
      a[static_cast<size_t>(j)] = static_cast<float>(e[static_cast<size_t>(j)] + 0.999 * max_rel * row_scale * sign);
    }
    // The theorem's premise is the stored floats' difference (rounding moved it a little).
    double largest = 0;
    for (int64_t j = 0; j < V; ++j) {
      largest =
          std::max(largest, std::fabs(static_cast<double>(a[static_cast<size_t>(j)]) - e[static_cast<size_t>(j)]));
    }
    const DistributionDistances d = measure_distances(e.data(), a.data(), V, temperature);
    const DistributionBound b = distance_bound(largest / row_scale, row_scale, temperature);
    ASSERT_LE(distance_ratio(d, b), 1.0 + 1e-6)
        << "trial " << trial << ": tv " << d.tv << " <= " << b.tv << ", kl " << d.kl_expected_actual << " / "
        << d.kl_actual_expected << " <= " << b.kl;
  }
}

// The TV bound is attained by two tokens moved apart by the whole spread, and so is the KL bound
// in the limit of a small spread: no smaller bounds hold.
TEST(Distribution, TheTvBoundIsNearlyAttained) {
  const double delta = 0.05, sigma = 2 * delta;
  double best = 0;
  for (int i = -400; i <= 400; ++i) {
    const double x = i * 0.01;  // the expected gap between the two logits
    const std::vector<float> e = {static_cast<float>(x), 0.0f},
                             a = {static_cast<float>(x + delta), static_cast<float>(-delta)};
    best = std::max(best, measure_distances(e.data(), a.data(), 2, 1.0).tv);
  }
  EXPECT_LE(best, std::tanh(sigma / 4) * (1 + 1e-6));
  EXPECT_GE(best, 0.99 * std::tanh(sigma / 4));
  const std::vector<float> even = {0.0f, 0.0f}, apart = {static_cast<float>(delta), static_cast<float>(-delta)};
  const DistributionDistances d = measure_distances(even.data(), apart.data(), 2, 1.0);
  EXPECT_LE(d.kl_expected_actual, sigma * sigma / 8);
  EXPECT_GE(d.kl_expected_actual, 0.99 * sigma * sigma / 8);
}

Tensor rows_of(const std::vector<std::vector<float>>& rows) {
  Tensor t = Tensor::zeros({static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())});
  for (size_t r = 0; r < rows.size(); ++r) std::copy(rows[r].begin(), rows[r].end(), t.row(static_cast<int64_t>(r)));
  return t;
}

// The planted controls: rows at the edge of the tail bound pass; a row whose top token is pushed
// down by ten times the bound, and a row with a NaN, fail with the measure that broke.
TEST(Distribution, PlantedControlsFailAndTheEdgeOfTheBoundPasses) {
  const double max_rel = 1e-3;
  const Tensor expected = rows_of({{4.0f, 1.0f, -2.0f, 0.5f}, {0.0f, 3.0f, 2.9f, -1.0f}});
  const double delta0 = max_rel * 4.0, delta1 = max_rel * 3.0;  // the rows' scales are 4 and 3
  Tensor edge = expected;
  for (int64_t j = 0; j < 4; ++j) {
    edge.row(0)[j] += static_cast<float>((j % 2 ? 1 : -1) * 0.99 * delta0);
    edge.row(1)[j] += static_cast<float>((j % 2 ? -1 : 1) * 0.99 * delta1);
  }
  const DistanceCheck ok = check_distances(expected, edge, max_rel, {1.0, 0.7});
  EXPECT_TRUE(ok.passed) << ok.worst_ratio;
  EXPECT_EQ(ok.rows.size(), 4u);
  EXPECT_GT(ok.worst_ratio, 0.1);  // not vacuous: the edge of the logits bound uses a good part of it

  Tensor pushed = expected;
  pushed.row(1)[1] -= static_cast<float>(10 * delta1);  // row 1's top token, ten times the bound down
  const DistanceCheck bad = check_distances(expected, pushed, max_rel, {1.0});
  EXPECT_FALSE(bad.passed);
  ASSERT_TRUE(bad.first_failure.has_value());
  EXPECT_EQ(bad.first_failure->row, 1);
  EXPECT_GT(bad.worst_ratio, 2.0);
  EXPECT_FALSE(bad.fail_criterion.empty());

  Tensor nan = expected;
  nan.row(0)[2] = NAN;
  const DistanceCheck broken = check_distances(expected, nan, max_rel, {1.0});
  EXPECT_FALSE(broken.passed);
  EXPECT_EQ(broken.first_failure->row, 0);
}

TEST(Distribution, TemperaturesStartAtOneAndRefuseNonsense) {
  EXPECT_EQ(distance_temperatures({}, "--temperature"), std::vector<double>({1.0}));
  EXPECT_EQ(distance_temperatures({0.7, 1.0, 0.7, 1.3}, "--temperature"), std::vector<double>({1.0, 0.7, 1.3}));
  for (double bad : {0.0, -1.0, static_cast<double>(NAN), static_cast<double>(INFINITY)}) {
    testing::expect_mentions(testing::harness_error_message([&] { distance_temperatures({bad}, "--temperature"); }),
                             "--temperature: a temperature must be a finite number > 0");
  }
}

TEST(Distribution, PositionsSummarizeMaxAndMeanOverChecks) {
  const Tensor e = rows_of({{1.0f, 0.0f}, {0.0f, 1.0f}});
  const Tensor a1 = rows_of({{1.0f, 0.1f}, {0.0f, 1.0f}});
  const Tensor a2 = rows_of({{1.0f, 0.3f}, {0.0f, 1.0f}});
  const DistanceCheck c1 = check_distances(e, a1, 0.5, {1.0});
  const DistanceCheck c2 = check_distances(e, a2, 0.5, {1.0});
  const std::vector<PositionDistances> positions = summarize_positions({&c1, &c2}, {1.0});
  ASSERT_EQ(positions.size(), 2u);
  EXPECT_EQ(positions[0].row, 0);
  EXPECT_EQ(positions[0].count, 2);
  EXPECT_DOUBLE_EQ(positions[0].max.tv, c2.rows[0].distances.tv);
  EXPECT_DOUBLE_EQ(positions[0].mean.tv, 0.5 * (c1.rows[0].distances.tv + c2.rows[0].distances.tv));
  EXPECT_EQ(positions[1].max.tv, 0);
}

}  // namespace
}  // namespace dflash
