#include "compare/run_tally.h"

#include "core/error.h"

namespace dflash {

RunTally tally_reports(const std::vector<nlohmann::json>& documents) {
  RunTally tally;
  bool internal = false, bad_input = false, cannot_run = false;
  for (const nlohmann::json& doc : documents) {
    for (const nlohmann::json& result : doc["results"]) {
      (result["verdict"] == "pass" ? tally.pass : tally.fail) += 1;
    }
    for (const nlohmann::json& error : doc["errors"]) {
      ++tally.could_not_run;
      const int code = error.value("exit_code", kExitBadInput);
      (code == kExitInternal ? internal : code == kExitCannotRun ? cannot_run : bad_input) = true;
    }
  }
  tally.exit_code = internal     ? kExitInternal
                    : bad_input  ? kExitBadInput
                    : cannot_run ? kExitCannotRun
                    : tally.fail ? kExitMismatch
                                 : kExitPass;
  return tally;
}

std::string count_line(const RunTally& tally) {
  return std::to_string(tally.pass) + " pass, " + std::to_string(tally.fail) + " fail, " +
         std::to_string(tally.could_not_run) + " could not run";
}

}  // namespace dflash
