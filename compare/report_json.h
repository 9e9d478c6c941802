// The machine-readable report: one JSON document per `replay --json`, read back by `report` to make
// the HTML page. Layout in docs/report-format.md.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "compare/replay.h"

namespace dflash {

constexpr const char* kReportFormat = "dflash-harness-report";
constexpr int kReportVersion = 2;  // 2: distances and acceptance (compare/acceptance_json.h); 1 still read

// One fixture's replay. Non-finite numbers (an error of NaN, an infinite ratio) are written as null.
nlohmann::json replay_result_to_json(const ReplayResult& result);

// A fixture that could not be replayed: its path, the message and the exit code it earned.
nlohmann::json replay_error_to_json(const std::string& fixture, const std::string& message, int exit_code);

// {"format": ..., "version": 1, "results": [...], "errors": [...]}
nlohmann::json make_report_document(const std::vector<nlohmann::json>& results, const std::vector<nlohmann::json>& errors);
void write_report_document(const std::string& path, const nlohmann::json& document);

// Reads a report document, checking the fields the HTML writer relies on; kBadInput naming the file
// and field on any defect.
nlohmann::json read_report_document(const std::string& path);

}  // namespace dflash
