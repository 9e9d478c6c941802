// DFlash2's selector taps, aligned before they are compared (docs/spec/dflash2.md §5,
// docs/tolerances.md §7). Two drafters whose logits differ by rounding may order two close
// candidates differently, or swap the K-th candidate for the (K+1)-th: a legitimate difference
// exactly when those candidates' logits are within the tie threshold of the draft tokens (twice the
// logits' noise, on the expected side's logits). When every differing candidate of every row is
// such a tie, the actual side's selector taps are rearranged into the expected side's candidate
// order (a candidate the actual side does not hold has nothing to compare and takes the expected
// value); otherwise they are left as they are, and the exact check of selector.topk_ids fails.
// selector.walk_scores is always teacher-forced: the actual edge-score row at the expected walk's
// predecessor, so a walk that legitimately chose another slot is still compared row by row.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "core/proposer.h"
#include "core/tensor.h"

namespace dflash {

struct SelectorAlignment {
  std::vector<Tap> taps;  // the actual side's topk_ids, topk_values, unary, edge_scores, walk_scores, aligned
  int reordered_rows = 0;  // rows whose candidates differed (order or set), every difference a tie
  int untied_rows = 0;     // rows with a candidate difference that is not a tie (left unaligned)
};

// expected / actual: each side's taps (the selector's are looked up by name); margin_logits: the
// expected side's logits [n, V]; rms_bound: the logits' norm bound (StageBound::rel_rms);
// expected_drafts: the expected walk's tokens. nullopt when either side lacks a selector tap or
// the shapes disagree (the per-stage checks report that).
std::optional<SelectorAlignment> align_selector_taps(const std::vector<const Tap*>& expected,
                                                     const std::vector<Tap>& actual, const Tensor& margin_logits,
                                                     double rms_bound, const std::vector<int32_t>& expected_drafts);

}  // namespace dflash
