// How far apart the token distributions are that two sides' logits imply, row by row (one row per
// drafted block position): softmax(logits / T) at T = 1 and at the temperatures asked for. Total
// variation bounds how far the actual side can move the acceptance probability of speculative
// sampling at that position (acceptance = 1 - TV(p_target, q_draft), and TV obeys the triangle
// inequality). Each distance has a bound derived from the pair's logits bound (docs/tolerances.md
// §10): per element |a_j - e_j| <= max_rel · scale(row) spreads the log-ratio of the two softmaxes
// over at most sigma = 2 · max_rel · scale / T, and then
//   TV <= tanh(sigma / 4),  KL(p||q), KL(q||p) <= sigma² / 8,  top-1 gap <= tanh(sigma / 4).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "compare/divergence.h"
#include "core/tensor.h"

namespace dflash {

// The distances of one row at one temperature. p = softmax(expected / T), q = softmax(actual / T).
struct DistributionDistances {
  double tv = 0;                  // (1/2) Σ |p_j - q_j|
  double kl_expected_actual = 0;  // KL(p || q) = Σ p_j log(p_j / q_j), in nats
  double kl_actual_expected = 0;  // KL(q || p)
  double top1_gap = 0;            // |p_t - q_t| at the expected side's top token t (lowest index on ties)
};

// The bounds of one row (same fields); `sigma` is the log-ratio spread they follow from.
struct DistributionBound {
  double sigma = 0;
  double tv = 0, kl = 0, top1_gap = 0;
};

// The four distances of one row pair of `cols` logits. Computed in double in log space (no
// underflow for any finite logits); a non-finite logit on either side gives NaN distances.
DistributionDistances measure_distances(const float* expected, const float* actual, int64_t cols, double temperature);

// The bounds for a row whose logits may differ by max_rel · row_scale per element (the tail
// criterion of docs/tolerances.md §1 with the row's largest expected magnitude as its scale).
DistributionBound distance_bound(double max_rel, double row_scale, double temperature);

// The worst of distance / bound over the four measures (0 / 0 = 0; x / 0 = inf; NaN = inf).
double distance_ratio(const DistributionDistances& d, const DistributionBound& b);

// One logits row of one propose held to its bounds at one temperature.
struct RowDistance {
  int64_t row = 0;  // logits row r: block row r + 1
  double temperature = 1;
  DistributionDistances distances;
  DistributionBound bound;
  double ratio = 0;
  bool passed = true;
};

// Every row of one (step, sequence) of one pair at every temperature.
struct DistanceCheck {
  std::vector<RowDistance> rows;  // temperature-major: every row at temperatures[0], then [1], ...
  bool passed = true;
  double worst_ratio = 0;
  // The first row over a bound, in order: which distance broke it ("tv", "kl", "top1-gap").
  std::optional<RowDistance> first_failure;
  std::string fail_criterion;
};

// The temperatures a replay measures at: 1, then `extra` in the given order without repeats. Each
// must be finite and > 0 (kBadInput naming the value and `what`, e.g. "--temperature").
std::vector<double> distance_temperatures(const std::vector<double>& extra, const std::string& what);

// `expected` and `actual` [rows, V] (same shape; kInternal otherwise, callers report shape faults).
// `max_rel` is the logits stage's tail bound (StageBound::max_rel). The row scale is the row's
// largest expected magnitude; an all-zero expected row borrows the largest of the tensor, and an
// all-zero tensor uses 1 (as compare/metrics.h does).
DistanceCheck check_distances(const Tensor& expected, const Tensor& actual, double max_rel,
                              const std::vector<double>& temperatures);

// Per block position over many (step, sequence) checks of one pair: what the report shows.
struct PositionDistances {
  double temperature = 1;
  int64_t row = 0;  // logits row; the block row is row + 1
  int count = 0;
  DistributionDistances max, mean;
  double worst_ratio = 0;
  DistributionBound bound_at_worst;  // the bound of the row with the worst ratio
  bool passed = true;
};
// In temperature order, then row order. Rows that no check reached are left out.
std::vector<PositionDistances> summarize_positions(const std::vector<const DistanceCheck*>& checks,
                                                   const std::vector<double>& temperatures);

// The failure of a check as a divergence at stage "distribution" (criterion "tv", "kl" or
// "top1-gap"), or nothing when it passed.
std::optional<Divergence> distance_divergence(const DistanceCheck& check);

// "tv", "kl", "top1-gap": which measure sets the ratio of a row.
std::string worst_measure(const DistributionDistances& d, const DistributionBound& b);

}  // namespace dflash
