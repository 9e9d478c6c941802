#include "compare/tokens.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace dflash {

const char* token_verdict_name(TokenVerdict verdict) {
  switch (verdict) {
    case TokenVerdict::kAgree: return "agree";
    case TokenVerdict::kTieExcused: return "tie-excused";
    case TokenVerdict::kMismatch: return "mismatch";
  }
  return "?";
}

TokenCheck compare_draft_tokens(const std::vector<int32_t>& expected, const std::vector<int32_t>& actual,
                                const Tensor& margin_logits, double rms_bound) {
  if (expected.size() != actual.size() || margin_logits.rows() != static_cast<int64_t>(expected.size())) {
    throw internal_error("compare_draft_tokens: " + std::to_string(expected.size()) + " expected and " +
                         std::to_string(actual.size()) + " actual tokens against " +
                         std::to_string(margin_logits.rows()) + " logits rows");
  }
  const int64_t vocab = margin_logits.cols();
  TokenCheck check;
  for (size_t i = 0; i < expected.size(); ++i) {
    TokenRow row;
    row.row = static_cast<int64_t>(i);
    row.expected = expected[i];
    row.actual = actual[i];
    if (row.expected == row.actual) {
      row.verdict = TokenVerdict::kAgree;
      ++check.agree;
      check.rows.push_back(row);
      continue;
    }
    const float* logits = margin_logits.row(row.row);
    double top = -std::numeric_limits<double>::infinity(), sum_squares = 0;
    bool finite = true;
    for (int64_t v = 0; v < vocab; ++v) {
      if (!std::isfinite(logits[v])) finite = false;
      top = std::max(top, static_cast<double>(logits[v]));
      sum_squares += static_cast<double>(logits[v]) * logits[v];
    }
    const auto in_vocab = [vocab](int32_t token) { return token >= 0 && token < vocab; };
    row.threshold = 2.0 * rms_bound * std::sqrt(sum_squares / static_cast<double>(std::max<int64_t>(vocab, 1)));
    if (!finite || !in_vocab(row.expected) || !in_vocab(row.actual)) {
      row.gap = std::numeric_limits<double>::infinity();
    } else {
      row.gap = top - std::min<double>(logits[row.expected], logits[row.actual]);
    }
    row.verdict = row.gap <= row.threshold ? TokenVerdict::kTieExcused : TokenVerdict::kMismatch;
    (row.verdict == TokenVerdict::kTieExcused ? check.excused : check.mismatch) += 1;
    check.rows.push_back(row);
  }
  return check;
}

void excuse_walk_ties(TokenCheck* check, const Tensor& topk_ids, const Tensor& walk_scores, const Tensor& margin_logits,
                      double walk_rms_bound) {
  const int64_t k = topk_ids.cols();
  if (topk_ids.rows() != static_cast<int64_t>(check->rows.size()) || walk_scores.shape != topk_ids.shape) {
    throw internal_error("excuse_walk_ties: " + std::to_string(check->rows.size()) + " token rows against selector taps of " +
                         std::to_string(topk_ids.rows()) + " and " + std::to_string(walk_scores.rows()) + " rows");
  }
  const auto slot_of = [&](int64_t t, int32_t token) -> int64_t {
    for (int64_t c = 0; c < k; ++c) {
      if (topk_ids.row(t)[c] == static_cast<float>(token)) return c;
    }
    return -1;
  };
  bool diverged = false;  // an earlier row was a walk tie: later rows follow another predecessor
  for (TokenRow& row : check->rows) {
    const int64_t t = row.row;
    if (row.verdict == TokenVerdict::kAgree) continue;
    const int64_t want = slot_of(t, row.expected), got = slot_of(t, row.actual);
    bool excused = false;
    if (got < 0 && want >= 0 && row.threshold > 0 && row.actual >= 0 && row.actual < margin_logits.cols()) {
      // The actual walk took a candidate the expected row does not hold: a tie at the K boundary
      // when its logit is within the tie threshold of the expected row's lowest candidate.
      const float* logits = margin_logits.row(t);
      double lowest = std::numeric_limits<double>::infinity();
      for (int64_t c = 0; c < k; ++c) lowest = std::min<double>(lowest, logits[static_cast<int64_t>(topk_ids.row(t)[c])]);
      excused = static_cast<double>(logits[row.actual]) >= lowest - row.threshold;
    } else if (got >= 0 && want >= 0) {
      const float* scores = walk_scores.row(t);
      double sum_squares = 0;
      for (int64_t c = 0; c < k; ++c) sum_squares += static_cast<double>(scores[c]) * scores[c];
      const double threshold = 2.0 * walk_rms_bound * std::sqrt(sum_squares / static_cast<double>(k));
      const double gap = static_cast<double>(scores[want]) - scores[got];
      excused = diverged || gap <= threshold;
      if (row.verdict == TokenVerdict::kMismatch && excused) row.gap = gap, row.threshold = diverged ? 0 : threshold;
    }
    if (row.verdict == TokenVerdict::kMismatch && excused) {
      row.verdict = TokenVerdict::kTieExcused;
      --check->mismatch;
      ++check->excused;
    }
    diverged = diverged || row.verdict == TokenVerdict::kTieExcused;
  }
}

}  // namespace dflash
