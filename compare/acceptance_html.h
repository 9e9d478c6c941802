// The HTML report's distribution plot (per pair) and acceptance section (per fixture), from the
// version 2 fields of a report document (compare/acceptance_json.h). Absent fields (a version 1
// document) render as nothing.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace dflash {

// Per block position at T = 1: the largest TV of the pair as a bar, its mean as a tick, the
// bound of the worst row as a dash (log scale), failing positions red; then a table of every
// distance (TV, KL both ways, top-1 gap) per temperature and block row, with its distance/bound.
std::string distribution_plot_html(const nlohmann::json& pair);

// Per side: mean acceptance length (greedy, and expected under sampling), per-position acceptance
// rates and pinned-acceptance verdicts; the change of each comparison; the failures.
std::string acceptance_section_html(const nlohmann::json& result);

}  // namespace dflash
