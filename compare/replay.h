// The replay engine: walks a fixture's steps on one or more drafters (new sequence ids ->
// add_sequence, release -> release_sequence, propose -> set_block_g + propose), compares each
// drafter that is asked to with the fixture's expectations and pairs of drafters with each other,
// runs the invariant checks (compare/invariants.h, and on the stored K/V compare/kv_invariants.h)
// after every step, and returns a structured
// result that the table, JSON and HTML writers consume.
#pragma once
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "compare/acceptance.h"
#include "compare/distribution.h"
#include "compare/divergence.h"
#include "compare/stage_check.h"
#include "compare/tokens.h"
#include "compare/tolerance.h"
#include "core/proposer.h"
#include "fixtures/fixture.h"

namespace dflash {

struct ReplayLane {
  DraftProposer* proposer = nullptr;
  Precision precision = Precision::kFp64;  // what its numbers are (for the tolerance model)
  bool compare_with_fixture = true;
  // The K/V its pools must hold for context rows, at `precision` (compare/kv_invariants.h); when
  // set and the drafter has a read-back, every step checks the stored state against it.
  ContextKvFunction recompute_kv = {};
};

// lanes[reference] is the expected side, lanes[candidate] the actual side.
struct CrossCheck {
  int reference = 0;
  int candidate = 1;
};

struct ReplayOptions {
  int last_step = -1;  // stop after this step (bisection); -1 = all steps
  // Called after each step with (steps done, total steps), for progress display.
  std::function<void(int, int)> on_step;
  // Temperatures of the distribution distances besides T = 1 (compare/distribution.h).
  std::vector<double> temperatures;
  // The lanes' TP = N (docs/spec/tensor-parallel.md): a divergence then names its ranks (§7).
  int tp_size = 1;
};

// One comparison (fixture vs lane, or lane vs lane).
struct PairSummary {
  std::string label;
  TolerancePair tolerance;
  int expected_lane = -1;  // -1: the fixture
  int actual_lane = -1;
};

// One pair's comparison of one sequence in one propose step.
struct SequenceResult {
  int step = -1, seq = -1, pair = -1;
  int requested_width = 0, block_width = 0;
  int64_t start = 0, window = 0;
  std::vector<StageCheck> stages;     // forward order; the stages both sides have, logits last
  std::optional<TokenCheck> tokens;
  std::vector<std::string> problems;  // faults that are not numeric (a tap the drafter did not give)
  std::optional<Divergence> divergence;  // first failing check in forward order
  std::optional<DistanceCheck> distances;  // both sides' logits as distributions, per row and temperature
  bool passed() const;
};

struct InvariantFailure {
  int step = -1;
  std::string proposer;
  std::string invariant, detail;
};

// The path one drafter's judged outputs took in one propose step (core/proposer.h ForwardPath).
struct StepPath {
  int step = -1;
  int lane = -1;  // index into ReplayResult::proposers
  int block_width = 0, batch = 0;  // the shape of the propose (one graph per shape)
  std::string mode;
  bool pdl = false;
  bool taps_from_second_pass = false;
  std::vector<std::pair<std::string, std::string>> plan;  // ForwardPath::plan (empty: none reported)
};

struct ProposerSummary {
  std::string name;
  std::string precision;
  std::vector<std::pair<std::string, std::string>> levers;  // describe()
  // Propose steps per ForwardPath::mode ("cpu", "eager", "graph-capture", "graph-replay").
  std::map<std::string, int> path_counts = {};
  // The checks this drafter's introspection could not serve (a plugin without taps, K/V read-back or
  // page tables), each with why: listed, never passed silently.
  std::vector<std::string> checks_not_run = {};
};

// The drafter under test crashed, hung or failed a call (core/error.h DrafterFault): the replay
// stops there and the fixture fails.
struct DrafterFaultRecord {
  int step = -1;  // -1: while the drafter was made
  std::string proposer;
  std::string event;   // "plugin crashed: SIGSEGV", "plugin hung: no answer in 60 s", "plugin failed: ..."
  std::string during;  // "propose of sequences [0, 2]"
  std::string text() const {
    return event + " during " + (step >= 0 ? "step " + std::to_string(step) + ", " : std::string()) + during;
  }
};

struct ReplayResult {
  std::string fixture_name, fixture_dir, expect_precision;
  nlohmann::json provenance;  // the fixture's provenance object as it is (null: none)
  int num_layers = 0;
  int total_steps = 0, steps_run = 0;
  std::vector<ProposerSummary> proposers;
  std::vector<PairSummary> pairs;
  std::vector<SequenceResult> sequences;  // in step order, then batch order, then pair order
  std::vector<InvariantFailure> invariant_failures;
  std::vector<StepPath> paths;  // per propose step and drafter, in step order
  // The earliest failure: first step with one, then forward stage order, then batch order.
  std::optional<Divergence> first_divergence;
  std::vector<double> temperatures;  // of the distances: 1, then ReplayOptions::temperatures
  AcceptanceReport acceptance;       // from the fixture's target side, when it has one
  std::optional<DrafterFaultRecord> drafter_fault;  // the replay stopped at it

  bool passed() const;
};

// Walks `fixture` on `lanes`. HarnessErrors of the drafters (a full pool, a refused request) come
// back with the fixture and step prefixed; numeric disagreements are results, not errors.
ReplayResult replay_fixture(const Fixture& fixture, const std::vector<ReplayLane>& lanes,
                            const std::vector<CrossCheck>& cross_checks, const ReplayOptions& options = {});

// One fixture of a run over several: its result, or why it could not run.
struct FixtureOutcome {
  std::string path;                    // as given to the command
  std::optional<ReplayResult> result;  // when it ran
  std::string error;                   // otherwise the message (what the command prints after "error: ")
  int exit_code = 0;                   // and the exit code it earned (core/error.h)
};

// The earliest failure of comparison `pair` (-1: of any): the first step with one; within it the
// earliest stage in forward order (token and shape faults of a drafter count after every stage),
// then batch order. ReplayResult::first_divergence is this for pair -1.
std::optional<Divergence> earliest_divergence(const ReplayResult& result, int pair = -1);

// Aggregates for tables and plots.
struct PairTotals {
  int sequences = 0, failed_sequences = 0;
  int agree = 0, excused = 0, mismatch = 0;
  double worst_ratio = 0;     // largest error/bound over every stage check
  std::string worst_stage;    // where it was
  std::optional<Divergence> first_divergence;  // earliest_divergence of the pair
  double first_divergence_ratio = 0;  // that stage's error/bound in that propose (0 for a token fault)
  // The rounding-bias checks (same rounding points only): how many, and the largest |mean|/bound.
  int bias_checks = 0;
  double worst_bias_ratio = 0;
  double worst_bias_mean_ulp = 0;
  std::string worst_bias_stage;
};
PairTotals pair_totals(const ReplayResult& result, int pair);

}  // namespace dflash
