#include "compare/distribution.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "compare/text_format.h"
#include "core/error.h"

namespace dflash {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// log Σ exp(x_j / T) over a finite row, from its maximum (no overflow, no underflow of the sum).
double log_sum_exp(const float* x, int64_t n, double temperature) {
  double top = -kInf;
  for (int64_t j = 0; j < n; ++j) top = std::max(top, static_cast<double>(x[j]) / temperature);
  double sum = 0;
  for (int64_t j = 0; j < n; ++j) sum += std::exp(static_cast<double>(x[j]) / temperature - top);
  return top + std::log(sum);
}

double ratio_of(double value, double bound) {
  if (std::isnan(value)) return kInf;
  if (value <= 0) return 0;
  return bound > 0 ? value / bound : kInf;
}

}  // namespace

DistributionDistances measure_distances(const float* expected, const float* actual, int64_t cols, double temperature) {
  DistributionDistances d;
  for (int64_t j = 0; j < cols; ++j) {
    if (!std::isfinite(expected[j]) || !std::isfinite(actual[j])) {
      const double nan = std::numeric_limits<double>::quiet_NaN();
      return {nan, nan, nan, nan};
    }
  }
  if (cols <= 0) return d;
  const double lse_e = log_sum_exp(expected, cols, temperature);
  const double lse_a = log_sum_exp(actual, cols, temperature);
  int64_t top = 0;
  for (int64_t j = 1; j < cols; ++j) {
    if (expected[j] > expected[top]) top = j;
  }
  double tv = 0, kl_pq = 0, kl_qp = 0;
  for (int64_t j = 0; j < cols; ++j) {
    const double lp = static_cast<double>(expected[j]) / temperature - lse_e;
    const double lq = static_cast<double>(actual[j]) / temperature - lse_a;
    const double p = std::exp(lp), q = std::exp(lq);
    // p - q = -p · expm1(lq - lp): exact to the last bits when the two are close.
    const double diff = -p * std::expm1(lq - lp);
    tv += std::fabs(diff);
    kl_pq += p * (lp - lq);
    kl_qp += q * (lq - lp);
    if (j == top) d.top1_gap = std::fabs(diff);
  }
  d.tv = 0.5 * tv;
  // Both divergences are >= 0; a sum of terms of both signs may round just below.
  d.kl_expected_actual = std::max(0.0, kl_pq);
  d.kl_actual_expected = std::max(0.0, kl_qp);
  return d;
}

DistributionBound distance_bound(double max_rel, double row_scale, double temperature) {
  DistributionBound b;
  b.sigma = 2.0 * max_rel * row_scale / temperature;
  b.tv = std::tanh(b.sigma / 4.0);
  b.kl = b.sigma * b.sigma / 8.0;
  b.top1_gap = b.tv;
  return b;
}

double distance_ratio(const DistributionDistances& d, const DistributionBound& b) {
  return std::max({ratio_of(d.tv, b.tv), ratio_of(d.kl_expected_actual, b.kl), ratio_of(d.kl_actual_expected, b.kl),
                   ratio_of(d.top1_gap, b.top1_gap)});
}

std::string worst_measure(const DistributionDistances& d, const DistributionBound& b) {
  const double tv = ratio_of(d.tv, b.tv);
  const double kl = std::max(ratio_of(d.kl_expected_actual, b.kl), ratio_of(d.kl_actual_expected, b.kl));
  const double top1 = ratio_of(d.top1_gap, b.top1_gap);
  if (tv >= kl && tv >= top1) return "tv";
  return kl >= top1 ? "kl" : "top1-gap";
}

std::vector<double> distance_temperatures(const std::vector<double>& extra, const std::string& what) {
  std::vector<double> temperatures = {1.0};
  for (double t : extra) {
    if (!std::isfinite(t) || !(t > 0)) {
      throw bad_input(what + ": a temperature must be a finite number > 0, got " + std::to_string(t));
    }
    if (std::find(temperatures.begin(), temperatures.end(), t) == temperatures.end()) temperatures.push_back(t);
  }
  return temperatures;
}

DistanceCheck check_distances(const Tensor& expected, const Tensor& actual, double max_rel,
                              const std::vector<double>& temperatures) {
  if (expected.shape != actual.shape || expected.shape.size() != 2) {
    throw internal_error("check_distances: expected " + shape_string(expected.shape) + ", actual " +
                         shape_string(actual.shape));
  }
  const int64_t rows = expected.rows(), cols = expected.cols();
  std::vector<double> scale(static_cast<size_t>(rows), 0.0);
  double largest = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < cols; ++j) {
      const double v = std::fabs(static_cast<double>(expected.row(r)[j]));
      if (std::isfinite(v)) scale[static_cast<size_t>(r)] = std::max(scale[static_cast<size_t>(r)], v);
    }
    largest = std::max(largest, scale[static_cast<size_t>(r)]);
  }
  for (double& s : scale) {
    if (s == 0) s = largest > 0 ? largest : 1.0;
  }
  DistanceCheck check;
  for (double t : temperatures) {
    for (int64_t r = 0; r < rows; ++r) {
      RowDistance row;
      row.row = r;
      row.temperature = t;
      row.distances = measure_distances(expected.row(r), actual.row(r), cols, t);
      row.bound = distance_bound(max_rel, scale[static_cast<size_t>(r)], t);
      row.ratio = distance_ratio(row.distances, row.bound);
      row.passed = row.ratio <= 1.0;
      check.worst_ratio = std::max(check.worst_ratio, row.ratio);
      if (!row.passed && check.passed) {
        check.passed = false;
        check.first_failure = row;
        check.fail_criterion = worst_measure(row.distances, row.bound);
      }
      check.rows.push_back(row);
    }
  }
  return check;
}

std::optional<Divergence> distance_divergence(const DistanceCheck& check) {
  if (check.passed || !check.first_failure) return std::nullopt;
  const RowDistance& row = *check.first_failure;
  const DistributionDistances& d = row.distances;
  const DistributionBound& b = row.bound;
  Divergence out;
  out.stage = "distribution";
  out.criterion = check.fail_criterion;
  out.row = row.row;
  out.value = check.fail_criterion == "tv"   ? d.tv
              : check.fail_criterion == "kl" ? std::max(d.kl_expected_actual, d.kl_actual_expected)
                                             : d.top1_gap;
  out.bound = check.fail_criterion == "tv" ? b.tv : check.fail_criterion == "kl" ? b.kl : b.top1_gap;
  const char* g = "%.6g";
  out.detail = "block row " + std::to_string(row.row + 1) + " at T = " + format_number(row.temperature, g) + ": TV " +
               format_number(d.tv, g) + " (bound " + format_number(b.tv, g) + "), KL " +
               format_number(d.kl_expected_actual, g) + " / " + format_number(d.kl_actual_expected, g) + " (bound " +
               format_number(b.kl, g) + "), top-1 gap " + format_number(d.top1_gap, g) + " (bound " +
               format_number(b.top1_gap, g) + ")";
  return out;
}

std::vector<PositionDistances> summarize_positions(const std::vector<const DistanceCheck*>& checks,
                                                   const std::vector<double>& temperatures) {
  std::map<std::pair<size_t, int64_t>, PositionDistances> cells;  // (temperature index, row)
  for (const DistanceCheck* check : checks) {
    for (const RowDistance& row : check->rows) {
      const size_t t = static_cast<size_t>(std::find(temperatures.begin(), temperatures.end(), row.temperature) -
                                           temperatures.begin());
      PositionDistances& cell = cells[{t, row.row}];
      cell.temperature = row.temperature;
      cell.row = row.row;
      const DistributionDistances& d = row.distances;
      cell.max.tv = std::max(cell.max.tv, d.tv);
      cell.max.kl_expected_actual = std::max(cell.max.kl_expected_actual, d.kl_expected_actual);
      cell.max.kl_actual_expected = std::max(cell.max.kl_actual_expected, d.kl_actual_expected);
      cell.max.top1_gap = std::max(cell.max.top1_gap, d.top1_gap);
      if (std::isnan(d.tv)) cell.max = d;  // a non-finite row stays visible as NaN
      cell.mean.tv += d.tv;
      cell.mean.kl_expected_actual += d.kl_expected_actual;
      cell.mean.kl_actual_expected += d.kl_actual_expected;
      cell.mean.top1_gap += d.top1_gap;
      if (cell.count == 0 || row.ratio > cell.worst_ratio) {
        cell.worst_ratio = row.ratio;
        cell.bound_at_worst = row.bound;
      }
      cell.passed = cell.passed && row.passed;
      ++cell.count;
    }
  }
  std::vector<PositionDistances> out;
  for (auto& [key, cell] : cells) {
    const double n = static_cast<double>(cell.count);
    cell.mean.tv /= n;
    cell.mean.kl_expected_actual /= n;
    cell.mean.kl_actual_expected /= n;
    cell.mean.top1_gap /= n;
    out.push_back(cell);
  }
  return out;
}

}  // namespace dflash
