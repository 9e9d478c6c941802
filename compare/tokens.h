// Draft-token agreement that knows about ties: two computations that are both within the logit
// bound of each other may legitimately pick different tokens when those tokens' logits are that
// close, and only then.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace dflash {

enum class TokenVerdict { kAgree, kTieExcused, kMismatch };
const char* token_verdict_name(TokenVerdict verdict);  // "agree", "tie-excused", "mismatch"

struct TokenRow {
  int64_t row = 0;  // block row i+1 drafts from logits row i; this is the logits row i
  int32_t expected = 0, actual = 0;
  TokenVerdict verdict = TokenVerdict::kAgree;
  // For a disagreement: how far below the row's top logit the lower of the two tokens sits, on the
  // margin side's logits, and the threshold it was held to (2 · rms_bound · RMS of the row).
  double gap = 0, threshold = 0;
};

struct TokenCheck {
  std::vector<TokenRow> rows;
  int agree = 0, excused = 0, mismatch = 0;
};

// `margin_logits` [rows, V] are the logits of the side that decides ties (the expected side when it
// has logits, else the actual side); `rms_bound` the logits' norm bound (StageBound::rel_rms). The
// noise of one logit is the RMS of the row's error, at most rms_bound · RMS(row); two tokens are in a
// tie when both logits sit within twice that of the row's top logit (each side may move by one noise
// level). A disagreement is excused iff it is such a tie: the lower of the two tokens' logits is at
// most 2 · rms_bound · RMS(row) below the top. When one side's token is the top, this is the
// top-1/top-2 margin for a top-2 pick. The sizes must agree (HarnessError kInternal otherwise;
// callers report shape faults).
TokenCheck compare_draft_tokens(const std::vector<int32_t>& expected, const std::vector<int32_t>& actual,
                                const Tensor& margin_logits, double rms_bound);

// DFlash2 (docs/spec/dflash2.md §5): the draft tokens are the selector's greedy walk, so a row's
// tokens may also differ by a tie of the walk. A mismatched row t is excused when both tokens are
// candidates of the expected row (topk_ids [n, K]) and their expected walk scores (walk_scores
// [n, K], read at the expected walk's own predecessor) sit within 2 · walk_rms_bound · RMS(walk row)
// of each other, or when the actual token is not an expected candidate but its logit (margin_logits,
// as compare_draft_tokens) is within the row's tie threshold of the expected row's lowest candidate
// (a tie at the top-k boundary that the walk then took). From there on the two walks follow
// different predecessors: a later mismatched row is excused when its actual token is one of the
// expected row's candidates (a token outside them stays a mismatch); its numbers are still compared
// teacher-forced (compare/selector_alignment.h).
void excuse_walk_ties(TokenCheck* check, const Tensor& topk_ids, const Tensor& walk_scores, const Tensor& margin_logits,
                      double walk_rms_bound);

}  // namespace dflash
