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

}  // namespace dflash
