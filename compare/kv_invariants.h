// Invariants of what a drafter actually stored and read (docs/spec/drafter.md §5), through its read-back
// (DraftProposer::read_kv, attention_spans) rather than the page table both drafters share:
//  kv-stored          every slot inside a sequence's window holds, in every layer, the K/V of that
//                     (sequence, position) recomputed from its context row, within the stage bound,
//                     and where both round at the same points without a rounding bias over the
//                     window (compare/rounding_bias.h);
//  kv-outside-window  no slot outside the windows changed during a propose (block rows never
//                     persist), except freed pages filled with NaN in the debug mode;
//  kv-poison          in the debug mode (HeadSettings::poison_freed_pages) every slot of a free page
//                     holds NaN in every layer;
//  attention-window   the context positions attention read for a sequence are exactly the spec's
//                     window: the most recent min(total, retained_context) positions before the anchor.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "compare/invariants.h"
#include "compare/tolerance.h"
#include "core/proposer.h"

namespace dflash {

// Every slot of every layer's pools; nullopt when the proposer has no read-back.
struct PoolSnapshot {
  std::vector<KvRows> layers;
};
std::optional<PoolSnapshot> snapshot_pools(const DraftProposer& proposer);

// The context row each (sequence, position) was fed: seq -> position -> row of nT·Ht floats.
using ContextRows = std::map<int, std::map<int64_t, const float*>>;

// kv-stored. `pair` holds the recomputation (expected side) against the drafter. The windows are the
// drafter's page tables when it shows them (Introspection::cache_view), else the spec's windows of
// the rows fed up to each sequence's `next_position`, read by position (DraftProposer::read_kv_at).
std::vector<InvariantViolation> check_stored_kv(const DraftProposer& proposer, const ContextKvFunction& recompute,
                                                const TolerancePair& pair, const ContextRows& rows,
                                                const std::map<int, int64_t>& next_position);

// kv-outside-window and kv-poison, from the pools before and after one propose (or release).
std::vector<InvariantViolation> check_kv_outside_windows(const DraftProposer& proposer, const PoolSnapshot& before,
                                                         const PoolSnapshot& after);

// attention-window for the sequences of the last propose, given each one's anchor position.
std::vector<InvariantViolation> check_attention_spans(const DraftProposer& proposer,
                                                      const std::map<int, int64_t>& anchor_of);

}  // namespace dflash
