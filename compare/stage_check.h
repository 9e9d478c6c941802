// One stage of one propose held to its bound: the measures, the verdict, and where it first fails.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "compare/metrics.h"
#include "compare/rounding_bias.h"
#include "compare/tolerance.h"
#include "core/tensor.h"

namespace dflash {

struct StageCheck {
  std::string stage;  // tap name or "logits"
  int order = -1;     // index in forward_stage_order
  bool shape_ok = true;
  std::string shape_detail;  // "expected [8, 96], actual [8, 32]" when !shape_ok
  TensorMetrics metrics;
  StageBound bound;
  bool passed = true;
  // max(max_row_rel_rms / bound.rel_rms, max_rel / bound.max_rel); +inf for non-finite or shape faults.
  double ratio = 0;
  // Where the bound asks for it (StageBound::rounding_bias): the mean signed error in bf16 ulps.
  std::optional<RoundingBias> bias;
  // The first row (in row order) over a bound, the column shown for it (its first non-finite
  // element, else its largest error) and which criterion it broke: "non-finite", "rel-rms",
  // "max-rel" or "shape"; or, every row within its bounds, "rounding-bias" (row and column -1,
  // value and bound the bias's). -1 / empty when the stage passes.
  int64_t fail_row = -1, fail_col = -1;
  std::string fail_criterion;
  double fail_value = 0, fail_bound = 0;  // the broken criterion's measure and bound for that row
  double fail_expected = 0, fail_actual = 0;  // both values at (fail_row, fail_col)
};

StageCheck check_stage(const std::string& stage, int order, const Tensor& expected, const Tensor& actual,
                       const StageBound& bound);

}  // namespace dflash
