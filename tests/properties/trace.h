// Traces: sequences joining and leaving, batched proposes with context lengths around the cap and
// page boundaries, widths from 0 to far above gamma. A trace names context row counts, not
// positions: the player computes each start from the sequence's next position, so the same trace
// stays valid when a propose is refused (pool exhausted) or replayed with steps removed.
#pragma once
#include <cstdint>
#include <ostream>
#include <vector>

#include <rapidcheck.h>

namespace dflash::prop {

struct TraceEntry {
  int seq = 0;
  int64_t count = 0;  // C; a sequence's first propose is played with at least one row
  int anchor = 0;
};

struct TraceStep {
  int id = 0;                       // index in the generated trace: outputs are keyed by it
  bool release = false;
  std::vector<TraceEntry> entries;  // propose: one per sequence
  int width = 0;                    // propose: the requested block width
  std::vector<int> released;        // release
};

struct Trace {
  std::vector<TraceStep> steps;
  std::vector<int> sequence_ids() const;
};
std::ostream& operator<<(std::ostream& os, const Trace& trace);

struct TraceShape {
  int max_steps = 6;
  int max_batch = 1;       // entries per propose
  int max_active = 1;      // sequences active at once
  int max_sequences = 1;   // distinct ids over the trace
  int64_t ctx_cap = 0;     // 0 = uncapped
  int page_size = 16;
  int gamma = 8;
  int vocab = 16;
  int64_t max_positions = 96;  // per sequence, keeps cases small
  bool releases = true;
  std::vector<int> width_choices;  // non-empty: widths drawn from these only (repeated shapes)
};

// An index in [0, n), uniform at every RapidCheck size (inRange narrows with the size, which
// would make the later alternatives of a categorical choice rare); shrinks towards 0.
rc::Gen<int> any_of(int n);

// Context row count for a sequence at `next`: small counts, counts that land at and around the
// cap and page boundaries, prompts longer than the cap.
rc::Gen<int64_t> gen_context_count(int64_t next, const TraceShape& shape);
// Requested widths: 0, 1, 2, gamma, gamma+1, anything up to 3·gamma+20, and 1000.
rc::Gen<int> gen_width(int gamma);
rc::Gen<Trace> gen_trace(const TraceShape& shape);

// The sub-trace of one sequence: its entries and its release, step ids kept.
Trace only_sequence(const Trace& trace, int seq);
// The trace without the steps whose id is in `ids`.
Trace without_steps(const Trace& trace, const std::vector<int>& ids);

}  // namespace dflash::prop
