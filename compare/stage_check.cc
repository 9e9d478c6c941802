#include "compare/stage_check.h"

#include <algorithm>
#include <limits>

namespace dflash {

StageCheck check_stage(const std::string& stage, int order, const Tensor& expected, const Tensor& actual,
                       const StageBound& bound) {
  StageCheck check;
  check.stage = stage;
  check.order = order;
  check.bound = bound;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  if (expected.shape != actual.shape) {
    check.shape_ok = false;
    check.shape_detail = "expected " + shape_string(expected.shape) + ", actual " + shape_string(actual.shape);
    check.passed = false;
    check.ratio = kInf;
    check.fail_criterion = "shape";
    return check;
  }
  check.metrics = compute_metrics(expected, actual);
  const TensorMetrics& m = check.metrics;
  check.ratio = std::max(m.max_row_rel_rms / bound.rel_rms, m.max_rel / bound.max_rel);
  if (m.non_finite > 0) check.ratio = kInf;
  for (int64_t r = 0; r < m.rows; ++r) {
    if (m.row_first_non_finite_col[r] >= 0) {
      check.fail_criterion = "non-finite";
      check.fail_col = m.row_first_non_finite_col[r];
      check.fail_value = kInf;
      check.fail_bound = bound.max_rel;
    } else if (m.row_rel_rms[r] > bound.rel_rms) {
      check.fail_criterion = "rel-rms";
      check.fail_col = m.row_worst_col[r];
      check.fail_value = m.row_rel_rms[r];
      check.fail_bound = bound.rel_rms;
    } else if (m.row_max_rel[r] > bound.max_rel) {
      check.fail_criterion = "max-rel";
      check.fail_col = m.row_worst_col[r];
      check.fail_value = m.row_max_rel[r];
      check.fail_bound = bound.max_rel;
    } else {
      continue;
    }
    check.fail_row = r;
    check.fail_expected = expected.row(r)[check.fail_col];
    check.fail_actual = actual.row(r)[check.fail_col];
    check.passed = false;
    break;
  }
  if (bound.rounding_bias && m.non_finite == 0) {
    check.bias = measure_rounding_bias(expected, actual);
    if (check.passed && !check.bias->passed()) {
      check.passed = false;
      check.fail_criterion = "rounding-bias";
      check.fail_value = check.bias->mean_ulp;
      check.fail_bound = check.bias->bound;
    }
  }
  return check;
}

}  // namespace dflash
