// The bf16 wire's share of a tensor-parallel bound (docs/spec/tensor-parallel.md §9.2): for each
// row-parallel reduction, ρ² and ρ∞ measured on the ranks' partials, which stage_paths turns into
// the boundaries a side with a bf16 wire adds.
#pragma once
#include <vector>

#include "core/proposer.h"

namespace dflash {

// Per reduction j, in forward order (j = 2l: L{l}.o_proj, j = 2l + 1: L{l}.mlp), the largest over
// the rows of a propose of
//   ρ²  = Σ_r ‖p_r‖² / ‖y‖²          ρ∞ = max_i Σ_r |p_{r,i}| / max_i |y_i|,   y = Σ_r p_r
// A reduction without partials to measure, or whose every row sums to zero, keeps ρ = ρ∞ = 1, the
// value §9.2 gives uncorrelated partials.
struct WireRounding {
  std::vector<double> rho2;
  std::vector<double> rho_inf;
};

// ρ² = ρ∞ = 1 for each of the 2·num_layers reductions.
WireRounding uncorrelated_wire(int num_layers);

// Measured from the taps "L{l}.o_proj.partial@r{r}" and "L{l}.mlp.partial@r{r}", r < tp_size (the
// reference's, or a drafter's that taps them). A reduction is measured only where every rank's
// partial is present with one shape.
WireRounding measure_wire_rounding(const std::vector<const Tap*>& taps, int num_layers, int tp_size);

}  // namespace dflash
