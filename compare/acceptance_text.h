// The readable report's distances and acceptance (compare/report_table.cc calls these): the
// table's "max TV" cell, one acceptance line per fixture with a target side, and the acceptance
// failures of a failing fixture.
#pragma once
#include <ostream>
#include <string>
#include <vector>

#include "compare/replay.h"

namespace dflash {

// The largest TV at T = 1 over the given pairs of a result ("-" when none compared logits).
std::string max_tv_cell(const ReplayResult& result, const std::vector<int>& pairs);

// "acceptance FIXTURE: fixture 4.00; reference-fp64 4.00 (+0.00), per position 1.00 1.00 1.00,
//  under sampling 3.98; pinned 1.00 1.00 1.00: pass" for every fixture that ran and measured
// acceptance.
void print_acceptance_lines(std::ostream& out, const std::vector<FixtureOutcome>& outcomes);

// "  acceptance canary: ..." / "  pinned acceptance: ...", one per failure.
void print_acceptance_failures(std::ostream& out, const ReplayResult& result);

}  // namespace dflash
