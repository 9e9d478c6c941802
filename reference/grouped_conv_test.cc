// The reference's grouped dynamic convolution reads only its own block (docs/spec/dflash2.md §3.1):
// every row of z and of the coefficients outside [row0, row0 + B) (another sequence's block
// rows, context rows) may hold NaN without changing a bit of the block's output, and nothing
// outside the block is written. The planted wrap across the block boundary must let that NaN in
// (negative control). RapidCheck draws the geometry; a failing case prints its seed.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include "reference/grouped_conv.h"

namespace dflash {
namespace {

struct Case {
  ConvGeometry g;
  int side = 0;
  int64_t before = 0, width = 0, after = 0;  // rows before the block, the block, rows after it
  std::vector<double> base;
  AlignedMatrix<double> coef, z;
  int64_t rows() const { return before + width + after; }
};

Case draw_case(int min_taps = 1) {
  Case c;
  c.g.taps = *rc::gen::inRange(min_taps, 5);
  c.g.group_size = *rc::gen::element(1, 2, 4);
  c.g.channels = c.g.group_size * *rc::gen::inRange(1, 5);
  c.side = *rc::gen::inRange(0, 2);
  c.before = *rc::gen::inRange(1, 7);
  c.width = *rc::gen::inRange(1, 9);
  c.after = *rc::gen::inRange(0, 7);
  const int64_t coef_cols = 2 * c.g.taps * c.g.groups();
  auto value = [] { return static_cast<double>(*rc::gen::inRange(-1000, 1001)) / 250.0; };
  c.base.resize(static_cast<size_t>(2 * c.g.taps * c.g.channels));
  for (double& v : c.base) v = value();
  c.coef.resize(c.rows(), coef_cols);
  c.z.resize(c.rows(), c.g.channels);
  for (int64_t r = 0; r < c.rows(); ++r) {
    for (int64_t j = 0; j < coef_cols; ++j) c.coef.row(r)[j] = value();
    for (int64_t j = 0; j < c.g.channels; ++j) c.z.row(r)[j] = value();
  }
  return c;
}

// The rows outside the block set to NaN, in z and in the coefficients.
void poison_outside(Case& c) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (int64_t r = 0; r < c.rows(); ++r) {
    if (r >= c.before && r < c.before + c.width) continue;
    for (int64_t j = 0; j < c.coef.cols(); ++j) c.coef.row(r)[j] = nan;
    for (int64_t j = 0; j < c.z.cols(); ++j) c.z.row(r)[j] = nan;
  }
}

// The convolution of the block into an output whose every row starts as the sentinel -7.
AlignedMatrix<double> run(const Case& c, bool wraps) {
  AlignedMatrix<double> out(c.rows(), c.g.channels);
  for (int64_t r = 0; r < c.rows(); ++r) {
    for (int64_t j = 0; j < c.g.channels; ++j) out.row(r)[j] = -7.0;
  }
  grouped_conv_block(c.g, c.side, c.base, c.coef, c.z, c.before, c.width, &out, wraps);
  return out;
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

RC_GTEST_PROP(GroupedConv, ReadsAndWritesOnlyItsOwnBlock, ()) {
  Case c = draw_case();
  const AlignedMatrix<double> clean = run(c, false);
  poison_outside(c);
  const AlignedMatrix<double> poisoned = run(c, false);
  for (int64_t r = 0; r < c.rows(); ++r) {
    const bool in_block = r >= c.before && r < c.before + c.width;
    for (int64_t j = 0; j < c.g.channels; ++j) {
      RC_ASSERT(same_bits(clean.row(r)[j], poisoned.row(r)[j]));
      if (in_block) RC_ASSERT(std::isfinite(poisoned.row(r)[j]));
      if (!in_block) RC_ASSERT(poisoned.row(r)[j] == -7.0);
    }
  }
}

// Negative control: with the wrap planted, row t < τ reads the row τ - t before the block, which
// holds NaN here, so the check above fails whenever there are two taps or more.
RC_GTEST_PROP(GroupedConv, APlantedWrapReadsOutsideTheBlock, ()) {
  Case c = draw_case(2);
  poison_outside(c);
  const AlignedMatrix<double> out = run(c, true);
  RC_ASSERT(std::isnan(out.row(c.before)[0]));
}

}  // namespace
}  // namespace dflash
