// The outcome of a run over many fixtures, from its report document(s): how many passed, failed
// and could not run, and the one exit code of the run (docs/cli.md). `replay` and `report` both
// take their count line and exit code from here.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dflash {

struct RunTally {
  int pass = 0, fail = 0, could_not_run = 0;
  // 3 if any fixture met an internal error, else 2 if any was bad input, else 125 if any could
  // not run here, else 1 if any failed, else 0.
  int exit_code = 0;
};

// Over documents that read_report_document accepts (or that make_report_document wrote): each
// result by its verdict, each error by its exit code.
RunTally tally_reports(const std::vector<nlohmann::json>& documents);

// "26 pass, 0 fail, 1 could not run"
std::string count_line(const RunTally& tally);

}  // namespace dflash
