#include "compare/rounding_bias.h"

#include <algorithm>
#include <cmath>
#include <limits>

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
  for (size_t i = 0; i < expected.values.size(); ++i) {
    const double e = expected.values[i], a = actual.values[i];
    if (!std::isfinite(e) || !std::isfinite(a) || e == 0) continue;
    // Clamped: a value far from its own scale (a small element of a row moved by its neighbours'
    // errors) counts as one ulp, so no single element decides the mean.
    const double signed_ulps = std::clamp((a - e) / bf16_ulp(e) * (e > 0 ? 1.0 : -1.0), -1.0, 1.0);
    sum += signed_ulps;
    sum_squares += signed_ulps * signed_ulps;
    ++bias.elements;
  }
  if (bias.elements == 0) {
    bias.bound = std::numeric_limits<double>::infinity();
    return bias;
  }
  const double n = static_cast<double>(bias.elements);
  bias.mean_ulp = sum / n;
  bias.second_moment = sum_squares / n;
  const double variance = std::max(kRoundingBiasMinVariance, bias.second_moment);
  bias.bound = std::max(kRoundingBiasFloorUlp, kRoundingBiasSigmas * std::sqrt(variance / n));
  return bias;
}

std::string describe_rounding_bias(const RoundingBias& bias) {
  const char* four = "%.4g";
  return "mean signed error " + format_number(bias.mean_ulp, four) + " bf16 ulp" +
         (bias.mean_ulp < 0 ? " (toward zero)" : bias.mean_ulp > 0 ? " (away from zero)" : "") + " over " +
         std::to_string(bias.elements) + " elements " + (bias.passed() ? "<= bound " : "> bound ") +
         format_number(bias.bound, four);
}

}  // namespace dflash
