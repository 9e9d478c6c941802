// Deliberately broken proposers, each a working proposer with one fault of the kind the failure
// classes describe (docs/failure-classes.md). Every property must fail on its variant, so
// none can pass vacuously.
#pragma once
#include "tests/properties/backends.h"

namespace dflash::prop {

// Stores clamp(g, 2, max(gamma + 1, 2)): widths above gamma run one row too wide.
Backend clamp_off_by_one(const Backend& backend);
// Not atomic on a full pool: before reporting the exhaustion it admits the batch's first sequence.
Backend non_atomic_exhaustion(const Backend& backend);
// Writes one logits row past the block (a guard-band overrun).
Backend row_past_the_block(const Backend& backend);
// Attends to ctx_cap + 1 positions while reporting ctx_cap.
Backend window_off_by_one(const Backend& backend);
// Windowed eviction (docs/spec/dflash2.md §4) on an all-sliding DFlash2 drafter, while the config
// it reports says W: runs with W + kv_page_size, so it keeps a page of positions that slid out.
Backend keeps_evicted_page(const Backend& backend);
// The same with W - 1: it evicts one position too many (the newest W - 1 minus one are kept).
Backend evicts_one_position_too_many(const Backend& backend);
// In a batch of two or more, the first context row of the first sequence leaks into the second's.
Backend leaky_batch(const Backend& backend);
// The output picks up the physical page it sits on: one ulp on the first logit when the
// sequence's first page is odd.
Backend page_dependent(const Backend& backend);
// State shared by every instance (a process-wide counter) nudges the first logit.
Backend nondeterministic(const Backend& backend);
// Argmax ties go to the highest index.
Backend highest_index_ties(const Backend& backend);
// Claims fp32 but computes with bf16 storage at the stage boundaries.
Backend bf16_posing_as_fp32(const Backend& backend);
// rope_theta silently taken from its default (10000) instead of the config.
Backend default_rope_theta(const Backend& backend);
// Graph replay with stale parameters: a propose with the batch size and width of an earlier one
// returns that earlier one's logits and draft tokens.
Backend stale_graph_replay(const Backend& backend);

// Stale-graph classes, as a CUDA drafter with one graph per (width, batch) and one eager pass
// before each capture would show them (a shape's second propose captures, later ones replay):
// A graph keyed by the width alone: a propose whose width has a graph captured at another batch
// size replays that graph; the sequences past its batch get the logits and tokens the buffers
// still hold (what an earlier propose left in those rows, zeros before any).
Backend graph_keyed_by_width(const Backend& backend);
// Scratch shared between two widths: a propose whose batch size has a graph captured at a wider
// width replays that one (a padded block) and reads its logits back with its own width's layout.
Backend padded_width_graph(const Backend& backend);

// RMSNorm's eps silently dropped (every norm; 1e-30 stands in for 0, which the config refuses), while the config reports the real one.
Backend ignored_norm_eps(const Backend& backend);
// Widths below 2 are not floored: a propose at width 0 or 1 returns that many block rows
// (max(g, 1) - 1 logits rows) instead of clamping to 2.
Backend unfloored_clamp(const Backend& backend);
// A stale row written to the cache: in a propose that brings two or more context rows, the second
// carries the first's features.
Backend stale_context_row(const Backend& backend);

}  // namespace dflash::prop
