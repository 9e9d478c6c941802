// How far one tensor is from another, element by element and row by row. Pure measurement: no
// bounds here (tolerance.h decides what is allowed, stage_check.h applies it).
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace dflash {

// One coordinate with the values on both sides.
struct ValuePair {
  int64_t row = -1, col = -1;
  double expected = 0, actual = 0;
};

// Every measure is taken over the 2-D view (rows = leading dims, cols = last dim). "Relative" always
// means relative to the EXPECTED side (the fixture, or the reference drafter): its row's largest
// magnitude for element errors, its row norm for row errors. A row of the expected side that is all
// zeros borrows the largest row scale of the tensor, and an all-zero tensor falls back to absolute
// errors (scale 1, norm sqrt(cols)), so that no division is by zero and no error hides.
struct TensorMetrics {
  int64_t rows = 0, cols = 0;

  int64_t non_finite = 0;      // elements where either side is NaN or Inf
  ValuePair first_non_finite;  // in row-major order

  double max_abs = 0;         // max |a - e|
  ValuePair worst_abs;
  double max_rel = 0;         // max |a - e| / max_j |e[row, j]|
  ValuePair worst_rel;
  double max_row_rel_rms = 0;  // max over rows of ||a - e|| / ||e|| (= sqrt of the row's NMSE)
  int64_t worst_rms_row = -1;
  double nmse = 0;             // sum (a - e)^2 / sum e^2 over the whole tensor
  double cosine = 1;           // <a, e> / (||a|| ||e||) over the whole tensor
  int64_t max_bf16_ulp = 0;    // max distance in bf16 steps after rounding both sides to bf16
  ValuePair worst_ulp;

  // Per row, for bisection: the row's measures and the column of its largest |a - e|.
  std::vector<double> row_rel_rms;
  std::vector<double> row_max_rel;
  std::vector<int64_t> row_worst_col;
  std::vector<int64_t> row_first_non_finite_col;  // -1 when the row is finite on both sides
};

// Both tensors must have the same shape (HarnessError kInternal otherwise: callers check shapes and
// report a mismatch themselves). Non-finite elements are counted and skipped by the other measures.
TensorMetrics compute_metrics(const Tensor& expected, const Tensor& actual);

// Distance in bf16 steps between round_to_bf16(a) and round_to_bf16(b) (0 for +0 vs -0).
int64_t bf16_ulp_distance(float a, float b);

}  // namespace dflash
