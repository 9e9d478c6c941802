// Invariant checks that hold for ANY proposer after every step (docs/spec/drafter.md §5), read through the
// proposer's introspection only: the block-width clamp and logits shape, the context window, and
// the cache-slot invariants 1-4. An empty result means every invariant holds.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/proposer.h"

namespace dflash {

struct InvariantViolation {
  std::string invariant;  // "clamp", "logits-shape", "window", "slot-unique", "slot-layers",
                          // "window-slots", "pool-accounting", ...
  std::string detail;     // what was seen vs what was expected, naming sequence/position/slot/page
};

// clamp(requested, 2, max(gamma, 2)) in force, logits [B-1, V], B-1 draft tokens in [0, V).
std::vector<InvariantViolation> check_propose_output(const DraftProposer& proposer, int requested_width,
                                                     const ProposeOutput& output);

// Every active sequence's window is exactly the most recent min(total, retained_context) positions, given
// the total context positions each sequence has received (seq -> next position).
std::vector<InvariantViolation> check_windows(const DraftProposer& proposer,
                                              const std::map<int, int64_t>& expected_next_position);

// Invariants 1-4: a slot holds at most one (sequence, position); all layers share the slots (one
// block table per sequence); exactly the window positions have slots (and block rows none);
// free + owned = pool size, pages owned by exactly the sequence whose block table lists them, no
// page of a released sequence still owned.
std::vector<InvariantViolation> check_cache_slots(const DraftProposer& proposer);

// All of the above after one step.
std::vector<InvariantViolation> check_all_invariants(const DraftProposer& proposer,
                                                     const std::map<int, int64_t>& expected_next_position);

}  // namespace dflash
