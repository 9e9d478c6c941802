// Plays a trace on any proposer, checking after every step what must hold for every proposer:
// the propose output (clamp, logits shape, draft tokens = lowest-index argmax), the windows and the
// cache-slot invariants (compare/invariants.h), the stored K/V and the window attention read where
// the proposer has a read-back (compare/kv_invariants.h), the taps' names and shapes when asked for, and, for
// a refused propose, that it was a pool exhaustion the pool model allows and that nothing changed.
// Any violation fails the current RapidCheck case with the step and the sequence named.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/proposer.h"
#include "tests/properties/trace.h"

namespace dflash::prop {

// The stream a (trace sequence, position) row is drawn from (context_row).
using StreamOf = std::function<uint64_t(int seq, int64_t position)>;
uint64_t default_stream(int seq, int64_t position);

struct RunOptions {
  bool want_taps = false;
  // A propose refused with kPoolExhausted is recorded (and checked) instead of failing the case.
  bool tolerate_exhaustion = false;
  // Reorder each batch's entries with this seed (0 keeps the trace's order).
  uint64_t shuffle_seed = 0;
  StreamOf stream = default_stream;
  // Proposer sequence id = trace id + offset (replays on one proposer use fresh ids).
  int seq_offset = 0;
  // The K/V the pools must hold for context rows (kv-stored); empty: that check is not run.
  ContextKvFunction recompute_kv = {};
};

struct StepResult {
  int step_id = 0;
  bool exhausted = false;                  // refused for a full pool
  std::map<int, ProposeOutput> outputs;    // by trace sequence id
  std::map<int, int64_t> starts;           // anchor position played, by trace sequence id
  std::map<int, int64_t> counts;           // context rows played, by trace sequence id
  std::vector<int> order;                  // trace sequence ids in the batch order played
};

struct TraceRun {
  std::vector<StepResult> steps;
  std::vector<int> exhausted_steps() const;
  const StepResult* step(int step_id) const;
};

TraceRun run_trace(DraftProposer& proposer, const Trace& trace, const RunOptions& options = {});

// "" when every output of `part` is in `full` with the same bits (taps present on both sides, in
// forward order, then logits, draft tokens, width); otherwise the first difference, naming step,
// sequence, stage, row and column. With `both_ways`, every output of `full` must also be in `part`.
std::string first_difference(const TraceRun& full, const TraceRun& part, bool both_ways);

// "" when the logits are bit-identical; else where they first differ.
std::string logits_difference(const Tensor& a, const Tensor& b);

// The taps docs/spec/drafter.md §7 names for one propose, with their shapes.
std::vector<std::pair<std::string, std::vector<int64_t>>> expected_taps(const DrafterConfig& config, int width,
                                                                        int64_t new_rows);

}  // namespace dflash::prop
