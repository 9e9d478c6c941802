#include "compare/wire_rounding.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/stages.h"

namespace dflash {
namespace {

const Tensor* find(const std::vector<const Tap*>& taps, const std::string& name) {
  for (const Tap* tap : taps) {
    if (tap != nullptr && tap->name == name) return &tap->value;
  }
  return nullptr;
}

// The largest ρ² and ρ∞ over the rows of the partials, or {1, 1} where nothing can be measured.
void measure(const std::vector<const Tensor*>& partials, double* rho2, double* rho_inf) {
  *rho2 = 1.0;
  *rho_inf = 1.0;
  const Tensor& first = *partials.front();
  if (first.shape.size() != 2) return;
  for (const Tensor* p : partials) {
    if (p->shape != first.shape) return;
  }
  bool measured = false;
  double worst2 = 0.0, worst_inf = 0.0;
  for (int64_t row = 0; row < first.rows(); ++row) {
    double parts2 = 0.0, sum2 = 0.0, parts_max = 0.0, sum_max = 0.0;
    for (int64_t i = 0; i < first.cols(); ++i) {
      double y = 0.0, magnitudes = 0.0;
      for (const Tensor* p : partials) {
        const double v = p->row(row)[i];
        y += v;
        magnitudes += std::fabs(v);
        parts2 += v * v;
      }
      sum2 += y * y;
      parts_max = std::max(parts_max, magnitudes);
      sum_max = std::max(sum_max, std::fabs(y));
    }
    // A row that sums to zero has no relative error to speak of; non-finite partials are the
    // comparison's to report, not a bound's to absorb.
    if (!(sum2 > 0.0) || !std::isfinite(parts2) || !std::isfinite(sum2)) continue;
    measured = true;
    worst2 = std::max(worst2, parts2 / sum2);
    worst_inf = std::max(worst_inf, parts_max / sum_max);
  }
  if (!measured) return;
  *rho2 = worst2;
  *rho_inf = worst_inf;
}

}  // namespace

WireRounding uncorrelated_wire(int num_layers) {
  const size_t n = static_cast<size_t>(2 * std::max(num_layers, 0));
  return {std::vector<double>(n, 1.0), std::vector<double>(n, 1.0)};
}

WireRounding measure_wire_rounding(const std::vector<const Tap*>& taps, int num_layers, int tp_size) {
  WireRounding wire = uncorrelated_wire(num_layers);
  if (tp_size < 2) return wire;
  for (int l = 0; l < num_layers; ++l) {
    const StageKind kinds[] = {StageKind::kOProj, StageKind::kMlp};
    for (int k = 0; k < 2; ++k) {
      std::vector<const Tensor*> partials;
      for (int r = 0; r < tp_size; ++r) {
        const Tensor* p = find(taps, stage_name(kinds[k], l, r));
        if (p == nullptr) break;
        partials.push_back(p);
      }
      if (static_cast<int>(partials.size()) != tp_size) continue;
      const size_t j = static_cast<size_t>(2 * l + k);
      measure(partials, &wire.rho2[j], &wire.rho_inf[j]);
    }
  }
  return wire;
}

}  // namespace dflash
