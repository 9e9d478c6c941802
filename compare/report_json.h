// The machine-readable report: one JSON document per `replay --json`, read back by `report` to make
// the HTML page. Layout in docs/report-format.md.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "compare/replay.h"

namespace dflash {

constexpr const char* kReportFormat = "dflash-harness-report";
// Version 2 added, over version 1: "run" (backend, precision, every fixture, the shard), each
// entry's "index" and "path", pairs[i].first_divergence, and the distances and acceptance (result
// "temperatures" and "acceptance", pairs[i].distribution; compare/acceptance_json.h). Version 1
// stays readable: an unsharded run without any of them.
constexpr int kReportVersion = 2;
// The version from which a reader requires the fields version 2 added.
constexpr int kReportVersionWithRunAndAcceptance = 2;

// What one `replay` was asked to do (the "run" object): the shards of one run agree on all but
// `shard`.
struct ReportRun {
  std::string backend, precision;
  std::vector<std::string> fixtures;  // every fixture of the run as given, in order (all shards')
  int shard = 0, shards = 0;          // this report holds shard `shard` (1-based) of `shards`; 0, 0: unsharded
};

// One fixture's replay. Non-finite numbers (an error of NaN, an infinite ratio) are written as null.
nlohmann::json replay_result_to_json(const ReplayResult& result);

// The document of one run: `outcomes` are the fixtures this report holds (all of run.fixtures, or
// one shard's), each at its position `indices[i]` in run.fixtures.
nlohmann::json make_report_document(const ReportRun& run, const std::vector<FixtureOutcome>& outcomes,
                                    const std::vector<size_t>& indices);
void write_report_document(const std::string& path, const nlohmann::json& document);

// Reads a report document (version 1 or 2), checking the fields the HTML writer, the merge and the
// tally rely on, and that each verdict is what its sequences, invariant failures, distances and
// acceptance say (recomputed_pass); kBadInput naming the file and field on any defect.
nlohmann::json read_report_document(const std::string& path);

// Whether a result passes, recomputed from its fields: every sequence's stages passed, no problem,
// no draft-token mismatch, and no invariant failure.
bool recomputed_pass(const nlohmann::json& result);

}  // namespace dflash
