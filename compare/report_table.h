// The readable report of `dflash-harness replay` and `bisect`: one table line per fixture and
// comparison, the drafters' levers, and the first-divergence report of every failing fixture.
#pragma once
#include <ostream>
#include <vector>

#include "compare/replay.h"

namespace dflash {

// fixture | comparison | precision | steps | worst stage (error/bound) | tokens agree/excused/mismatch | verdict
void print_replay_table(std::ostream& out, const std::vector<ReplayResult>& results);

// The drafters and their describe() levers.
void print_levers(std::ostream& out, const ReplayResult& result);

// The verdict and the drafters' levers; for a failure also the first divergence with both values
// and the bound, the stage-by-stage walk of that (step, sequence, comparison) up to and including
// the failing stage, and the invariant failures.
void print_result_report(std::ostream& out, const ReplayResult& result);

// The stage-by-stage walk of one (step, sequence) for every comparison: `bisect`'s report.
// Returns false when no such propose was replayed.
bool print_bisect_report(std::ostream& out, const ReplayResult& result, int step, int seq);

}  // namespace dflash
