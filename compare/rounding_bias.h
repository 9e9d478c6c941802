// The rounding-bias check (docs/tolerances.md, "Rounding bias"). Two sides that round at the same
// points (the tight model: a drafter against the reference emulating it; a drafter's stored K/V
// against their recomputation) differ element by element only where fp32 noise moved a value
// across a bf16 rounding midpoint, as often up as down. A stage that truncates (rounds toward zero)
// instead moves half its elements one ulp toward zero: under every per-row bound, and a bias that
// compounds over layers and long contexts. The measure: the mean, over every element, of the
// signed error in units of the expected value's bf16 ulp, signed so that negative is toward zero;
// the bound follows from the element count and the spread of the rows' means.
#pragma once
#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace dflash {

// Standard deviations of the mean allowed (a two-sided Gaussian tail of 2e-9 per check).
constexpr double kRoundingBiasSigmas = 6.0;
// The variance assumed at least per element: one rounding error uniform within ±1/2 ulp.
constexpr double kRoundingBiasMinVariance = 1.0 / 12.0;
// The smallest bias the check claims to see, in ulps: an eighth of truncation's −1/2.
constexpr double kRoundingBiasFloorUlp = 1.0 / 16.0;

struct RoundingBias {
  int64_t elements = 0;      // measured: both finite, the expected value non-zero
  double mean_ulp = 0;       // mean of clamp((a − e)·sign(e) / ulp(e), −1, 1); negative: toward zero
  double second_moment = 0;  // mean of the squares of the same
  // max(floor, sigmas·sqrt(max(1/12, second_moment) / elements), sigmas·row_mean_sd / sqrt(rows));
  // +inf for none.
  double bound = 0;
  // The share of measured elements more than one ulp apart (differences carried from upstream, not
  // single rounding flips); reported, not judged.
  double beyond_one_ulp = 0;
  int64_t rows = 0;          // rows with a measured element
  double row_mean_sd = 0;    // sample standard deviation of those rows' means (0 for one row)
  bool passed() const;
};

// The gap between bf16 values at |x| (bf16 keeps 8 significant bits): 2^(e − 7) for |x| in
// [2^e, 2^(e+1)), 2^−133 below bf16's normal range; x finite and non-zero.
double bf16_ulp(double x);

// Over every element of two tensors of one shape (HarnessError kInternal otherwise).
RoundingBias measure_rounding_bias(const Tensor& expected, const Tensor& actual);

// "mean signed error -0.48 bf16 ulp (toward zero) over 768 elements > bound 0.0625 (8 rows, their
// means' sd 0.031; 0 % more than one ulp apart)"
std::string describe_rounding_bias(const RoundingBias& bias);

}  // namespace dflash
