// Observed error against bound per stage, over every step and sequence of one comparison: how close
// a clean run comes to its bounds (docs/tolerances.md's tables are made of these).
#pragma once
#include <string>
#include <vector>

#include "compare/replay.h"

namespace dflash {

struct StageRatio {
  std::string stage;
  int order = -1;
  int checks = 0;
  double rel_rms = 0, rel_rms_bound = 0;  // the check with the largest rel-RMS / bound
  double max_rel = 0, max_rel_bound = 0;  // the check with the largest max-rel / bound
  // Stages with the rounding-bias check: the check with the largest |mean| / bound (bias_bound 0: none).
  double bias_mean = 0, bias_bound = 0, bias_beyond = 0;
  double rel_rms_ratio() const { return rel_rms / rel_rms_bound; }
  double max_rel_ratio() const { return max_rel / max_rel_bound; }
};

// One entry per stage the pair compared, in forward order.
std::vector<StageRatio> stage_ratios(const ReplayResult& result, int pair);

// The ratios as a table, one line per stage, each line starting with `prefix`.
std::string format_stage_ratios(const std::vector<StageRatio>& ratios, const std::string& prefix);

}  // namespace dflash
