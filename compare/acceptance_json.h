// The report's distribution distances (per pair) and acceptance (per fixture), version 2 of the
// report format (docs/report-format.md): written into each result by compare/report_json.cc and
// checked when a document is read back.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "compare/replay.h"

namespace dflash {

// Per block position over every (step, sequence) of one pair (compare/distribution.h
// summarize_positions), in temperature order, then position order.
std::vector<PositionDistances> pair_positions(const ReplayResult& result, int pair);

// The largest TV at T = 1 over one pair, or nothing when the pair compared no logits.
std::optional<double> pair_max_tv(const ReplayResult& result, int pair);

// pairs[i].distribution: {passed, worst_ratio, checks, positions: [...]}, or null when the pair
// compared no logits.
nlohmann::json pair_distribution_json(const ReplayResult& result, int pair);

// The result's acceptance: {pin, false_alarm, sides, comparisons, failures}, or null without a
// target side.
nlohmann::json acceptance_json(const ReplayResult& result);

// Checks what the HTML writer and the verdict read of the version 2 fields of one result (`where`
// names the file and result): from version 2 (kReportVersionWithRunAndAcceptance) they must be
// present; in version 1 they are absent and ignored.
void check_acceptance_fields(const nlohmann::json& result, int version, const std::string& where);

}  // namespace dflash
