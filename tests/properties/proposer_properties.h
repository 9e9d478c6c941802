// The properties every proposer must have (docs/spec/drafter.md §3, §5), each a body that draws its own case
// (a Scenario) inside a RapidCheck property and fails the case on a violation. The same body runs
// on the CPU reference, the CUDA drafter and the deliberately broken variants.
#pragma once
#include "tests/properties/backends.h"

namespace dflash::prop {

// 1. Width in force = clamp(requested, 2, max(gamma, 2)); logits [B-1, V], nothing past them;
//    taps of the clamped width.
void clamp_property(const Backend& backend);
// 2. Attention sees exactly the most recent min(total, ctx_cap) positions: after a long
//    incremental trace, a fresh sequence fed one prompt whose rows before the window are
//    different (garbage) gives the same bits; in fp32/fp64, changing the oldest row inside the
//    window changes them.
void context_window_property(const Backend& backend);
// 3. Cache-slot invariants after every step of random traces on small pools; a refused
//    (exhausted) propose changes nothing and happens only when the pool model allows it, and the
//    other sequences' outputs equal a run that never saw it.
void cache_slots_property(const Backend& backend);
// 4. A sequence's outputs are bit-identical alone or batched with others, in any order.
void batch_invariance_property(const Backend& backend);
// 5. Any assignment of physical pages (page_order_seed, pool size) gives bit-identical outputs.
void page_permutation_property(const Backend& backend);
// 6. Replaying a trace twice, on a fresh proposer or on the same one with new sequence ids,
//    gives identical bits.
void determinism_property(const Backend& backend);
// 10. Argmax: lowest index on ties, through the proposer, with an lm_head built to tie exactly
//     (all rows equal, duplicate maxima far apart).
void argmax_ties_property(const Backend& backend);
// 7. A candidate (the CUDA drafter) against the reference at the same precision: every tap and
//    the logits within compare/'s tolerance model (cross_pair, stage_bound), checked in forward
//    order so the first stage over its bound is named; draft tokens equal or tie-excused.
void matches_reference_property(const Backend& reference, const Backend& candidate);
// 8. Two backends (graphs on, graphs off) give bit-identical outputs, without taps, over traces
//    whose batch shapes repeat, with positions, widths and page tables changing between replays.
//    When `graphs` has graphs (Backend::graph_warmup >= 0), every propose past a shape's warmup
//    must report a graph capture or replay; cases with a replay at new positions are counted in
//    *cases_with_changed_replays (the caller asserts a minimum).
void same_bits_property(const Backend& eager, const Backend& graphs, int* cases_with_changed_replays = nullptr);

}  // namespace dflash::prop
