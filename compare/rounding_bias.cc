#include "compare/rounding_bias.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "compare/text_format.h"
#include "core/error.h"

namespace dflash {

bool RoundingBias::passed() const { return std::fabs(mean_ulp) <= bound; }

double bf16_ulp(double x) {
  int exponent = 0;
  std::frexp(std::fabs(x), &exponent);  // |x| = m·2^exponent, m in [1/2, 1)
  return std::ldexp(1.0, std::max(exponent - 8, -133));
}

RoundingBias measure_rounding_bias(const Tensor& expected, const Tensor& actual) {
  if (expected.shape != actual.shape) {
    throw internal_error("measure_rounding_bias: shapes differ: expected " + shape_string(expected.shape) +
                         ", actual " + shape_string(actual.shape));
  }
  RoundingBias bias;
  double sum = 0, sum_squares = 0;
  int64_t beyond = 0;
  std::vector<double> row_means;
  const int64_t cols = std::max<int64_t>(expected.cols(), 1);
  for (int64_t r = 0; r * cols < static_cast<int64_t>(expected.values.size()); ++r) {
    double row_sum = 0;
    int64_t row_n = 0;
    for (int64_t c = 0; c < cols && r * cols + c < static_cast<int64_t>(expected.values.size()); ++c) {
      const size_t i = static_cast<size_t>(r * cols + c);
      const double e = expected.values[i], a = actual.values[i];
      if (!std::isfinite(e) || !std::isfinite(a) || e == 0) continue;
      // Clamped: a value far from its own scale (a small element of a row moved by its neighbours'
      // errors) counts as one ulp, so no single element decides the mean.
      const double unclamped = (a - e) / bf16_ulp(e) * (e > 0 ? 1.0 : -1.0);
      const double signed_ulps = std::clamp(unclamped, -1.0, 1.0);
      beyond += std::fabs(unclamped) > 1.0;
      sum += signed_ulps;
      sum_squares += signed_ulps * signed_ulps;
      row_sum += signed_ulps;
      ++row_n;
      ++bias.elements;
    }
    if (row_n > 0) row_means.push_back(row_sum / static_cast<double>(row_n));
  }
  bias.rows = static_cast<int64_t>(row_means.size());
  if (row_means.size() > 1) {
    double mean = 0, squares = 0;
    for (double m : row_means) mean += m;
    mean /= static_cast<double>(row_means.size());
    for (double m : row_means) squares += (m - mean) * (m - mean);
    bias.row_mean_sd = std::sqrt(squares / static_cast<double>(row_means.size() - 1));
  }
  if (bias.elements == 0) {
    bias.bound = std::numeric_limits<double>::infinity();
    return bias;
  }
  const double n = static_cast<double>(bias.elements);
  bias.mean_ulp = sum / n;
  bias.beyond_one_ulp = static_cast<double>(beyond) / n;
  bias.second_moment = sum_squares / n;
  const double variance = std::max(kRoundingBiasMinVariance, bias.second_moment);
  // The elements of a row share their upstream differences: the mean varies at least as much as the
  // rows' means do over √rows (rows as the independent samples, a cluster-robust standard error).
  const double row_error = bias.rows > 1 ? bias.row_mean_sd / std::sqrt(static_cast<double>(bias.rows)) : 0.0;
  bias.bound = std::max({kRoundingBiasFloorUlp, kRoundingBiasSigmas * std::sqrt(variance / n),
                         kRoundingBiasSigmas * row_error});
  return bias;
}

std::string describe_rounding_bias(const RoundingBias& bias) {
  const char* four = "%.4g";
  return "mean signed error " + format_number(bias.mean_ulp, four) + " bf16 ulp" +
         (bias.mean_ulp < 0 ? " (toward zero)" : bias.mean_ulp > 0 ? " (away from zero)" : "") + " over " +
         std::to_string(bias.elements) + " elements " + (bias.passed() ? "<= bound " : "> bound ") +
         format_number(bias.bound, four) + " (" + std::to_string(bias.rows) + " rows, their means' sd " +
         format_number(bias.row_mean_sd, "%.3g") + "; " + format_number(100.0 * bias.beyond_one_ulp, "%.3g") +
         " % more than one ulp apart)";
}

}  // namespace dflash
