// The GPU catch table (docs/catch-rate.md): reads the JSON reports of `dflash-harness replay
// --backend both` that ci/gpu-gate.sh --mutations wrote, one per planted mutation and precision
// (DIR/<id>.<precision>.json, and DIR/none.<precision>.json for the build with no mutation active),
// judges each mutation against its registry row (testing/fault_points.h) and prints the table in the
// format of compare/catch_table.h, with each mutation's change of the CUDA drafter's mean acceptance
// length over the known-acceptance fixtures (fixtures/acceptance/) against the unmutated build's.
//
//   mutation_catch_table --list              the ids, one per line (what the gate runs), each followed
//                                            by the replay's --tp N when it needs one
//   mutation_catch_table DIR [--markdown F]  the table; exit 0 when every mutation is caught as
//                                            declared and the unmutated control has no failure
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "compare/catch_table.h"
#include "compare/report_json.h"
#include "core/error.h"
#include "testing/fault_points.h"

namespace dflash {
namespace {

using nlohmann::json;

constexpr const char* kPrecisions[] = {"bf16", "fp8"};

struct Report {
  std::string precision;
  json document;
};

// The reports of one id; `missing` lists the files that are not there (a replay that did not run,
// timed out or died before writing).
std::vector<Report> read_reports(const std::string& dir, const std::string& id, std::vector<std::string>* missing) {
  std::vector<Report> reports;
  for (const char* precision : kPrecisions) {
    const std::string path = dir + "/" + id + "." + precision + ".json";
    if (!std::filesystem::exists(path)) {
      missing->push_back(path);
      continue;
    }
    reports.push_back({precision, read_report_document(path)});
  }
  return reports;
}

// The first failed CUDA property of a mutation the replays missed (DIR/<id>.property.txt), or "".
std::string failed_property(const std::string& dir, const std::string& id) {
  std::ifstream in(dir + "/" + id + ".property.txt");
  std::string line;
  std::getline(in, line);
  return line;
}

CatchCheck parse_check(const std::string& name) {
  for (CatchCheck c : {CatchCheck::kReplay, CatchCheck::kInvariant, CatchCheck::kProperty, CatchCheck::kGpuTest}) {
    if (name == catch_check_name(c)) return c;
  }
  throw internal_error("testing/fault_points.cc: declared check '" + name + "' is not a catch check");
}

// A result's directory ("fixtures/oracle/tiny-gqa/", as the replay was given it) is the fixture
// "oracle/tiny-gqa".
bool is_fixture(const std::string& path, const std::string& where) {
  std::string p = path;
  while (!p.empty() && p.back() == '/') p.pop_back();
  return p == where || (p.size() > where.size() && p.compare(p.size() - where.size(), where.size(), where) == 0 &&
                        p[p.size() - where.size() - 1] == '/');
}

// The failure one fixture's result names first.
std::optional<ReplayFailure> first_failure_of(const json& result) {
  std::optional<ReplayFailure> divergence;
  const json& d = result["first_divergence"];
  if (!d.is_null()) {
    divergence = ReplayFailure{d.value("step", -1), CatchCheck::kReplay, d["stage"].get<std::string>(),
                               d["text"].get<std::string>()};
  }
  std::vector<ReplayFailure> invariants;
  for (const json& f : result["invariant_failures"]) {
    invariants.push_back({f.value("step", -1), CatchCheck::kInvariant, f.value("invariant", std::string("?")),
                          f.value("proposer", std::string()) + ": " + f.value("detail", std::string())});
  }
  return first_failure(divergence, invariants);
}

// Every failure in the reports, as "what (fixture, precision)", for the control and the misses.
std::vector<std::string> every_failure(const std::vector<Report>& reports) {
  std::vector<std::string> out;
  for (const Report& r : reports) {
    for (const json& result : r.document["results"]) {
      if (const std::optional<ReplayFailure> f = first_failure_of(result)) {
        out.push_back(f->named + " (" + result["fixture"].get<std::string>() + ", " + r.precision + "): " + f->detail);
      }
    }
    for (const json& e : r.document["errors"]) {
      out.push_back("error (" + e["fixture"].get<std::string>() + ", " + r.precision + "): " + e["error"].get<std::string>());
    }
  }
  return out;
}

// The CUDA drafter's mean acceptance length over the fixtures with a target side (the
// known-acceptance fixtures, fixtures/acceptance/) in one report, and the acceptance checks its side
// failed ("canary", "pinned"); nullopt when no fixture has one.
std::optional<double> cuda_acceptance(const json& document, std::vector<std::string>* failed) {
  double sum = 0;
  int sides = 0;
  for (const json& result : document["results"]) {
    if (!result.contains("acceptance") || !result["acceptance"].is_object()) continue;
    std::vector<std::string> cuda_sides;
    for (const json& side : result["acceptance"].value("sides", json::array())) {
      const std::string name = side.value("name", std::string());
      if (name.rfind("cuda", 0) != 0 || !side["mean_length"].is_number()) continue;
      sum += side["mean_length"].get<double>();
      ++sides;
      cuda_sides.push_back(name);
    }
    for (const json& f : result["acceptance"].value("failures", json::array())) {
      const std::string side = f.value("side", std::string());
      if (std::find(cuda_sides.begin(), cuda_sides.end(), side) == cuda_sides.end()) continue;
      const std::string name = f.value("check", std::string()) == "canary" ? "canary" : "pinned";
      if (failed && std::find(failed->begin(), failed->end(), name) == failed->end()) failed->push_back(name);
    }
  }
  if (sides == 0) return std::nullopt;
  return sum / sides;
}

// The mutation's change of that length against the build with no mutation, at its precision.
std::string acceptance_change(const PlantedMutation& m, const std::vector<Report>& reports,
                              const std::vector<Report>& control) {
  std::optional<double> working, broken;
  std::vector<std::string> failed;
  for (const Report& r : control) {
    if (r.precision == m.precision) working = cuda_acceptance(r.document, nullptr);
  }
  for (const Report& r : reports) {
    if (r.precision == m.precision) broken = cuda_acceptance(r.document, &failed);
  }
  return format_acceptance_change(working, broken, failed);
}

// `control`: the reports of the build with no mutation, for the acceptance change.
CatchResult judge(const PlantedMutation& m, const std::string& dir, const std::vector<Report>& control) {
  std::vector<std::string> missing;
  const std::vector<Report> reports = read_reports(dir, m.id, &missing);
  CatchResult r;
  const std::string bug_class = m.bug_class + (m.tp > 1 ? " (tp " + std::to_string(m.tp) + ")" : std::string());
  r.bug = {m.id, bug_class, parse_check(m.check), m.stage, std::string(m.fixture) + " (" + m.precision + ")"};
  r.acceptance = acceptance_change(m, reports, control);
  bool found = false;
  for (const Report& report : reports) {
    if (report.precision != m.precision) continue;
    for (const json& result : report.document["results"]) {
      if (!is_fixture(result.value("dir", std::string()), m.fixture)) continue;
      found = true;
      if (const std::optional<ReplayFailure> f = first_failure_of(result)) {
        r.caught = true, r.check = f->check, r.named = f->named, r.detail = f->detail;
        return r;
      }
    }
  }
  // Not shown where declared: caught elsewhere (named with its fixture, so never "as declared"), or missed.
  const std::vector<std::string> elsewhere = every_failure(reports);
  const std::string property = failed_property(dir, m.id);
  if (!elsewhere.empty()) {
    r.caught = true, r.check = CatchCheck::kReplay, r.named = elsewhere.front(), r.detail = elsewhere.front();
  } else if (!property.empty()) {
    r.caught = true, r.check = CatchCheck::kProperty, r.named = property, r.detail = property;
  } else if (!missing.empty()) {
    r.detail = "no report " + missing.front();
  } else {
    r.detail = found ? "no check failed" : std::string("the declared fixture ") + m.fixture + " was not replayed";
  }
  return r;
}

int run(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "--list") {
    for (const PlantedMutation& m : mutation_registry()) {
      std::cout << m.id << (m.tp > 1 ? " --tp " + std::to_string(m.tp) : std::string()) << "\n";
    }
    return 0;
  }
  if (argc != 2 && !(argc == 4 && std::string(argv[2]) == "--markdown")) {
    std::cerr << "usage: mutation_catch_table --list | DIR [--markdown FILE]\n";
    return 2;
  }
  const std::string dir = argv[1];
  std::vector<std::string> missing;
  const std::vector<Report> control = read_reports(dir, "none", &missing);
  std::vector<std::string> false_alarms = every_failure(control);
  for (const std::string& path : missing) false_alarms.push_back("no report " + path);
  std::vector<CatchResult> results;
  for (const PlantedMutation& m : mutation_registry()) results.push_back(judge(m, dir, control));

  std::string text = format_catch_table(results) + "\n" + catch_summary(results) + "; control (no mutation): " +
                     (false_alarms.empty() ? "no failure" : std::to_string(false_alarms.size()) + " FAILURES") + "\n";
  for (const std::string& alarm : false_alarms) text += "  false alarm: " + alarm + "\n";
  for (const CatchResult& r : results) {
    if (!r.as_declared()) text += "  " + r.bug.id + ": " + (r.caught ? r.named : "missed: " + r.detail) + "\n";
  }
  std::cout << text;
  if (argc == 4) std::ofstream(argv[3]) << text;
  bool all = false_alarms.empty();
  for (const CatchResult& r : results) all = all && r.as_declared();
  return all ? 0 : 1;
}

}  // namespace
}  // namespace dflash

int main(int argc, char** argv) {
  try {
    return dflash::run(argc, argv);
  } catch (const dflash::HarnessError& e) {
    std::cerr << "mutation_catch_table: " << e.what() << "\n";
    return 2;
  }
}
