// The readable report of `dflash-harness replay` and `bisect`: the drafters' settings once, one
// table line per passing fixture (one per comparison for a failing one), and the first-divergence
// report of every failing fixture.
#pragma once
#include <ostream>
#include <vector>

#include "compare/replay.h"

namespace dflash {

// fixture | comparison | precision | steps | stage (error/bound) | max TV | tokens
// agree/excused/mismatch | graph replays | verdict, a row for every fixture in the order given; then
// an acceptance line per fixture with a target side (compare/acceptance_text.h). A passing fixture
// is one line (its comparisons joined by "; ", the worst stage over all of them, the tokens summed);
// a failing one has a line per comparison, whose stage is its first divergence (forward order,
// earliest step), not its worst; a fixture that could not run is one line "could not run: WHY".
void print_replay_table(std::ostream& out, const std::vector<FixtureOutcome>& outcomes);

// Every drafter the results ran, once: "drafter NAME (PRECISION)", and with `full` its describe()
// entries one per line (an entry that differs between fixtures lists each fixture's value).
void print_drafter_settings(std::ostream& out, const std::vector<FixtureOutcome>& outcomes, bool full);

// The drafters and their describe() levers.
void print_levers(std::ostream& out, const ReplayResult& result);

// The verdict and the drafters' levers; for a failure also the first divergence with both values
// and the bound, the stage-by-stage walk of that (step, sequence, comparison) up to and including
// the failing stage, and the invariant failures. `replay` prints it for failing fixtures only.
void print_result_report(std::ostream& out, const ReplayResult& result);

// The stage-by-stage walk of one (step, sequence) for every comparison: `bisect`'s report.
// Returns false when no such propose was replayed.
bool print_bisect_report(std::ostream& out, const ReplayResult& result, int step, int seq);

}  // namespace dflash
