// The catch table: planted bugs, each declaring the check that must catch it and the first stage
// that check must name, and what the harness actually did. One format for the CPU catch suite
// (tests/catch/) and for planted kernel bugs on the GPU, so both tables read and compare alike.
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace dflash {

// The check that catches a planted bug: a fixture replay's numeric comparison, an invariant of
// compare/invariants.h after a replay step, a RapidCheck property, or a dedicated GPU test.
enum class CatchCheck { kReplay, kInvariant, kProperty, kGpuTest };

// "replay", "invariant", "property", "gpu-test".
const char* catch_check_name(CatchCheck check);

struct PlantedBug {
  std::string id;              // short and stable, e.g. "window-off-by-one"
  std::string bug_class;       // the failure class it stands for, e.g. "window edge"
  CatchCheck declared_check = CatchCheck::kReplay;
  // The first stage (drafter.md §7 name) the replay must name, or for the other checks the
  // invariant or property name the failure must carry.
  std::string declared_stage;
  std::string where;           // the fixture or property it runs on
};

struct CatchResult {
  PlantedBug bug;
  bool caught = false;
  CatchCheck check = CatchCheck::kReplay;  // what caught it (meaningful when caught)
  std::string named;                       // the first stage / invariant / property named
  std::string detail;                      // the harness's own words for the failure
  // The change of the mean acceptance length the bug causes, with the acceptance checks it failed
  // (docs/catch-rate.md "Acceptance change"), e.g. "-1.77 (2.77 -> 1.00; canary)"; "-" when not measured.
  std::string acceptance = "-";

  // Caught by the declared check, naming the declared stage.
  bool as_declared() const;
};

// One failure a replay reported: a stage's divergence (kReplay) or an invariant (kInvariant).
struct ReplayFailure {
  int step = -1;
  CatchCheck check = CatchCheck::kReplay;
  std::string named;  // the stage or the invariant
  std::string detail;
};

// The failure the harness names first, from a replay's first divergence and its invariant failures
// (in report order): the earliest step; within one step, in the order a propose computes them: a
// ctx_proj divergence, then kv-stored (the context K/V written before the block forward reads
// them), then any other divergence, then the other invariants (checked after the propose).
std::optional<ReplayFailure> first_failure(const std::optional<ReplayFailure>& divergence,
                                           const std::vector<ReplayFailure>& invariants);

// A Markdown table, one row per result in the given order:
// | id | class | caught | by | first stage named | declared | as declared | acceptance change | where |
std::string format_catch_table(const std::vector<CatchResult>& results);

// "N of M caught as declared".
std::string catch_summary(const std::vector<CatchResult>& results);

// CatchResult::acceptance: "-1.77 (2.77 -> 1.00; canary, pinned)", the broken drafter's mean
// acceptance length against the working one's, with the acceptance checks it failed ("canary",
// "pinned"); "-" when either length is unknown.
std::string format_acceptance_change(const std::optional<double>& working, const std::optional<double>& broken,
                                     const std::vector<std::string>& failed_checks);

}  // namespace dflash
