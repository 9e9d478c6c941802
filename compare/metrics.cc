#include "compare/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "core/dtype.h"
#include "core/error.h"

namespace dflash {
namespace {

// bf16 bit patterns mapped onto a line where adjacent values differ by one (sign-magnitude to
// two's complement), so that a difference of ranks is a distance in representable steps.
int64_t bf16_rank(float f) {
  const uint16_t bits = float_to_bf16_bits(f);
  const int64_t magnitude = bits & 0x7fff;
  return (bits & 0x8000) ? -magnitude : magnitude;
}

struct RowScale {
  double max_magnitude;
  double norm;
};

}  // namespace

int64_t bf16_ulp_distance(float a, float b) { return std::llabs(bf16_rank(a) - bf16_rank(b)); }

TensorMetrics compute_metrics(const Tensor& expected, const Tensor& actual) {
  if (expected.shape != actual.shape) {
    throw internal_error("compute_metrics: shapes differ: expected " + shape_string(expected.shape) +
                         ", actual " + shape_string(actual.shape));
  }
  TensorMetrics m;
  m.rows = expected.numel() == 0 ? 0 : expected.rows();
  m.cols = expected.cols();
  m.row_rel_rms.assign(m.rows, 0.0);
  m.row_max_rel.assign(m.rows, 0.0);
  m.row_worst_col.assign(m.rows, -1);
  m.row_first_non_finite_col.assign(m.rows, -1);

  // Scales of the expected side, per row, with the fallbacks described in the header.
  std::vector<RowScale> scales(m.rows);
  double largest_max = 0, largest_norm = 0;
  for (int64_t r = 0; r < m.rows; ++r) {
    const float* e = expected.row(r);
    double max_magnitude = 0, sum_squares = 0;
    for (int64_t c = 0; c < m.cols; ++c) {
      if (!std::isfinite(e[c])) continue;
      max_magnitude = std::max(max_magnitude, std::fabs(static_cast<double>(e[c])));
      sum_squares += static_cast<double>(e[c]) * e[c];
    }
    scales[r] = {max_magnitude, std::sqrt(sum_squares)};
    largest_max = std::max(largest_max, max_magnitude);
    largest_norm = std::max(largest_norm, scales[r].norm);
  }
  if (largest_max == 0) largest_max = 1;
  if (largest_norm == 0) largest_norm = std::sqrt(static_cast<double>(std::max<int64_t>(m.cols, 1)));

  double total_diff_squares = 0, total_expected_squares = 0, total_actual_squares = 0, total_dot = 0;
  for (int64_t r = 0; r < m.rows; ++r) {
    const float* e = expected.row(r);
    const float* a = actual.row(r);
    const double row_max = scales[r].max_magnitude > 0 ? scales[r].max_magnitude : largest_max;
    const double row_norm = scales[r].norm > 0 ? scales[r].norm : largest_norm;
    double diff_squares = 0, row_worst = -1;
    for (int64_t c = 0; c < m.cols; ++c) {
      if (!std::isfinite(e[c]) || !std::isfinite(a[c])) {
        if (m.non_finite == 0) m.first_non_finite = {r, c, e[c], a[c]};
        if (m.row_first_non_finite_col[r] < 0) m.row_first_non_finite_col[r] = c;
        ++m.non_finite;
        continue;
      }
      const double ev = e[c], av = a[c];
      const double diff = std::fabs(av - ev);
      diff_squares += diff * diff;
      total_expected_squares += ev * ev;
      total_actual_squares += av * av;
      total_dot += ev * av;
      if (diff > row_worst) {
        row_worst = diff;
        m.row_worst_col[r] = c;
      }
      if (diff > m.max_abs || m.worst_abs.row < 0) {
        m.max_abs = diff;
        m.worst_abs = {r, c, ev, av};
      }
      const double rel = diff / row_max;
      if (rel > m.row_max_rel[r]) m.row_max_rel[r] = rel;
      if (rel > m.max_rel || m.worst_rel.row < 0) {
        m.max_rel = rel;
        m.worst_rel = {r, c, ev, av};
      }
      const int64_t ulp = bf16_ulp_distance(e[c], a[c]);
      if (ulp > m.max_bf16_ulp || m.worst_ulp.row < 0) {
        m.max_bf16_ulp = ulp;
        m.worst_ulp = {r, c, ev, av};
      }
    }
    total_diff_squares += diff_squares;
    m.row_rel_rms[r] = std::sqrt(diff_squares) / row_norm;
    if (m.row_rel_rms[r] > m.max_row_rel_rms || m.worst_rms_row < 0) {
      m.max_row_rel_rms = m.row_rel_rms[r];
      m.worst_rms_row = r;
    }
  }
  m.nmse = total_expected_squares > 0 ? total_diff_squares / total_expected_squares : total_diff_squares;
  if (total_expected_squares > 0 && total_actual_squares > 0) {
    m.cosine = total_dot / (std::sqrt(total_expected_squares) * std::sqrt(total_actual_squares));
  } else {
    m.cosine = (total_expected_squares == 0 && total_actual_squares == 0) ? 1.0 : 0.0;
  }
  return m;
}

}  // namespace dflash
