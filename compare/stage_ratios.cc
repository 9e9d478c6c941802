#include "compare/stage_ratios.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

namespace dflash {

std::vector<StageRatio> stage_ratios(const ReplayResult& result, int pair) {
  std::map<int, StageRatio> by_order;
  for (const SequenceResult& seq : result.sequences) {
    if (seq.pair != pair) continue;
    for (const StageCheck& check : seq.stages) {
      if (!check.shape_ok) continue;
      StageRatio& r = by_order[check.order];
      r.stage = check.stage;
      r.order = check.order;
      const double rms = check.metrics.max_row_rel_rms, tail = check.metrics.max_rel;
      if (r.checks == 0 || rms / check.bound.rel_rms > r.rel_rms_ratio()) {
        r.rel_rms = rms;
        r.rel_rms_bound = check.bound.rel_rms;
      }
      if (r.checks == 0 || tail / check.bound.max_rel > r.max_rel_ratio()) {
        r.max_rel = tail;
        r.max_rel_bound = check.bound.max_rel;
      }
      if (check.bias && std::isfinite(check.bias->bound) &&
          (r.bias_bound == 0 || std::fabs(check.bias->mean_ulp) / check.bias->bound > std::fabs(r.bias_mean) / r.bias_bound)) {
        r.bias_mean = check.bias->mean_ulp;
        r.bias_bound = check.bias->bound;
        r.bias_beyond = check.bias->beyond_one_ulp;
      }
      ++r.checks;
    }
  }
  std::vector<StageRatio> out;
  for (auto& [order, r] : by_order) out.push_back(r);
  return out;
}

std::string format_stage_ratios(const std::vector<StageRatio>& ratios, const std::string& prefix) {
  std::string text;
  char line[256];
  for (const StageRatio& r : ratios) {
    std::snprintf(line, sizeof line, "%s%-12s relRMS %.3e / bound %.3e = %.3f   maxRel %.3e / bound %.3e = %.3f",
                  prefix.c_str(), r.stage.c_str(), r.rel_rms, r.rel_rms_bound, r.rel_rms_ratio(), r.max_rel,
                  r.max_rel_bound, r.max_rel_ratio());
    text += line;
    if (r.bias_bound > 0) {
      std::snprintf(line, sizeof line, "   bias %+.4f / bound %.4f ulp (%.0f %% > 1 ulp)", r.bias_mean, r.bias_bound,
                    100.0 * r.bias_beyond);
      text += line;
    }
    text += "\n";
  }
  return text;
}

}  // namespace dflash
