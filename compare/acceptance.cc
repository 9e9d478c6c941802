#include "compare/acceptance.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "compare/text_format.h"
#include "core/error.h"

namespace dflash {
namespace {

double log_sum_exp(const float* x, int64_t n) {
  double top = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < n; ++j) top = std::max(top, static_cast<double>(x[j]));
  double sum = 0;
  for (int64_t j = 0; j < n; ++j) sum += std::exp(static_cast<double>(x[j]) - top);
  return top + std::log(sum);
}

bool all_finite(const float* x, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    if (!std::isfinite(x[j])) return false;
  }
  return true;
}

// log P(X = k) for X ~ Binomial(n, p), 0 < p < 1.
double log_binomial_term(int k, int n, double p) {
  return std::lgamma(n + 1.0) - std::lgamma(k + 1.0) - std::lgamma(n - k + 1.0) + k * std::log(p) +
         (n - k) * std::log1p(-p);
}

}  // namespace

int greedy_accepted(const std::vector<int32_t>& drafts, const std::vector<int32_t>& target) {
  const size_t n = std::min(drafts.size(), target.size());
  size_t k = 0;
  while (k < n && drafts[k] == target[k]) ++k;
  return static_cast<int>(k);
}

double sampling_acceptance(const TargetSide& target, int64_t row, const float* draft_logits, int64_t vocab) {
  if (!target.has_distribution()) throw internal_error("sampling_acceptance: the target side has no logits");
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (!all_finite(draft_logits, vocab)) return nan;
  const double lse_q = log_sum_exp(draft_logits, vocab);
  double alpha = 0;
  if (target.logits) {
    const float* p_logits = target.logits->row(row);
    if (!all_finite(p_logits, vocab)) return nan;
    const double lse_p = log_sum_exp(p_logits, vocab);
    for (int64_t j = 0; j < vocab; ++j) {
      alpha +=
          std::exp(std::min(static_cast<double>(p_logits[j]) - lse_p, static_cast<double>(draft_logits[j]) - lse_q));
    }
  } else {
    const float* values = target.topk_values->row(row);
    const int64_t k = target.k;
    if (!all_finite(values, k)) return nan;
    const double lse_p = log_sum_exp(values, k);
    for (int64_t c = 0; c < k; ++c) {
      const int32_t id = target.topk_ids[static_cast<size_t>(row * k + c)];
      alpha +=
          std::exp(std::min(static_cast<double>(values[c]) - lse_p, static_cast<double>(draft_logits[id]) - lse_q));
    }
  }
  return std::min(1.0, alpha);
}

BlockAcceptance measure_block(int step, int seq, const TargetSide& target, const std::vector<int32_t>& drafts,
                              const Tensor* draft_logits) {
  BlockAcceptance block;
  block.step = step;
  block.seq = seq;
  block.rows = static_cast<int>(std::min(drafts.size(), target.tokens.size()));
  block.accepted = greedy_accepted(drafts, target.tokens);
  for (int i = 0; i < block.rows; ++i) {
    block.match.push_back(drafts[static_cast<size_t>(i)] == target.tokens[static_cast<size_t>(i)]);
  }
  // A drafter's logits of another width (a shape fault, reported by the stage check) give no alpha.
  bool fits = draft_logits != nullptr && target.has_distribution() && draft_logits->rows() >= block.rows;
  if (fits && target.logits) fits = draft_logits->cols() == target.logits->cols();
  if (fits && target.topk_values) {
    for (int32_t id : target.topk_ids) fits = fits && id < draft_logits->cols();
  }
  if (fits) {
    for (int i = 0; i < block.rows; ++i) {
      block.sampling.push_back(sampling_acceptance(target, i, draft_logits->row(i), draft_logits->cols()));
    }
  }
  return block;
}

SideAcceptance summarize_side(const std::string& name, int lane, std::vector<BlockAcceptance> blocks) {
  SideAcceptance side;
  side.name = name;
  side.lane = lane;
  std::map<int64_t, PositionAcceptance> positions;
  double length_sum = 0, sampling_sum = 0;
  bool every_block_sampled = !blocks.empty();
  for (const BlockAcceptance& b : blocks) {
    ++side.blocks;
    side.drafted += b.rows;
    side.accepted += b.accepted;
    length_sum += 1.0 + b.accepted;
    const bool sampled = static_cast<int>(b.sampling.size()) == b.rows;
    every_block_sampled = every_block_sampled && sampled;
    double run = 1.0, expected_length = 1.0;
    for (int i = 0; i < b.rows; ++i) {
      PositionAcceptance& p = positions[i + 1];
      p.position = i + 1;
      ++p.blocks;
      p.reached += b.accepted >= i + 1 ? 1 : 0;
      p.matched += b.match[static_cast<size_t>(i)] ? 1 : 0;
      if (sampled) {
        ++p.sampling_blocks;
        p.sampling_mean += b.sampling[static_cast<size_t>(i)];
        run *= b.sampling[static_cast<size_t>(i)];
        expected_length += run;
      }
    }
    sampling_sum += expected_length;
  }
  for (auto& [k, p] : positions) {
    if (p.sampling_blocks > 0) p.sampling_mean /= p.sampling_blocks;
    side.positions.push_back(p);
  }
  if (side.blocks > 0) side.mean_length = length_sum / side.blocks;
  if (every_block_sampled) side.sampling_length = sampling_sum / side.blocks;
  side.block_list = std::move(blocks);
  return side;
}

double binomial_lower_tail(int x, int n, double p) {
  if (n < 0 || p < 0 || p > 1 || std::isnan(p)) {
    throw internal_error("binomial_lower_tail: n " + std::to_string(n) + ", p " + std::to_string(p));
  }
  if (x < 0) return 0;
  if (x >= n || p == 0) return 1;
  if (p == 1) return 0;  // x < n: every trial succeeds
  // Σ_{k<=x} P(X = k) from its largest term, so no term underflows the sum away.
  std::vector<double> logs;
  double top = -std::numeric_limits<double>::infinity();
  for (int k = 0; k <= x; ++k) {
    logs.push_back(log_binomial_term(k, n, p));
    top = std::max(top, logs.back());
  }
  double sum = 0;
  for (double l : logs) sum += std::exp(l - top);
  return std::min(1.0, std::exp(top + std::log(sum)));
}

std::vector<PinTest> test_pin(const SideAcceptance& side, const AcceptancePin& pin) {
  std::vector<PinTest> tests;
  for (const PositionAcceptance& p : side.positions) {
    if (p.position > static_cast<int64_t>(pin.per_position.size()) || p.blocks == 0) continue;
    PinTest t;
    t.position = p.position;
    t.blocks = p.blocks;
    t.reached = p.reached;
    t.pinned = pin.per_position[static_cast<size_t>(p.position - 1)];
    tests.push_back(t);
  }
  const double level = kAcceptanceFalseAlarm / static_cast<double>(std::max<size_t>(tests.size(), 1));
  for (PinTest& t : tests) {
    t.level = level;
    t.p_value = binomial_lower_tail(t.reached, t.blocks, t.pinned);
    t.passed = t.p_value >= level;
    t.least_passing = t.blocks;
    for (int c = 0; c <= t.blocks; ++c) {
      if (binomial_lower_tail(c, t.blocks, t.pinned) >= level) {
        t.least_passing = c;
        break;
      }
    }
  }
  return tests;
}

std::optional<AcceptanceFailure> canary(const SideAcceptance& reference, const SideAcceptance& actual) {
  if (reference.blocks == 0 || actual.blocks == 0) return std::nullopt;
  if (!(actual.mean_length <= kCanaryCollapsedLength && reference.mean_length > kCanaryReferenceLength)) {
    return std::nullopt;
  }
  AcceptanceFailure f;
  f.side = actual.name;
  f.check = "canary";
  f.detail = "acceptance collapsed (quantized drafter): " + actual.name + " reaches a mean acceptance length of " +
             format_number(actual.mean_length, "%.3f") + " over " + std::to_string(actual.blocks) +
             " blocks (<= " + format_number(kCanaryCollapsedLength, "%.2f") + ") where " + reference.name +
             " reaches " + format_number(reference.mean_length, "%.3f") + " (> " +
             format_number(kCanaryReferenceLength, "%.1f") +
             "): its draft tokens no longer follow the target, the signature of a quantized drafter whose "
             "quantization path is broken";
  return f;
}

const SideAcceptance* AcceptanceReport::side_of_lane(int lane) const {
  for (const SideAcceptance& s : sides) {
    if (s.lane == lane) return &s;
  }
  return nullptr;
}

void AcceptanceTally::add(int lane, const std::string& name, int step, int seq, const TargetSide& target,
                          const std::vector<int32_t>& drafts, const Tensor* draft_logits) {
  auto it = std::find_if(sides_.begin(), sides_.end(), [lane](const auto& s) { return s.first == lane; });
  if (it == sides_.end()) it = sides_.insert(sides_.end(), {lane, Side{name, {}}});
  it->second.blocks.push_back(measure_block(step, seq, target, drafts, draft_logits));
}

AcceptanceReport AcceptanceTally::finish(const std::optional<AcceptancePin>& pin,
                                         const std::vector<std::pair<int, int>>& comparisons) const {
  AcceptanceReport report;
  report.pin = pin;
  std::vector<std::pair<int, Side>> ordered = sides_;
  std::stable_sort(ordered.begin(), ordered.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [lane, side] : ordered) report.sides.push_back(summarize_side(side.name, lane, side.blocks));
  if (pin) {
    for (size_t i = 0; i < report.sides.size(); ++i) {
      const SideAcceptance& side = report.sides[i];
      if (side.lane < 0) continue;  // the fixture is the data, not a drafter under test
      std::vector<PinTest> tests = test_pin(side, *pin);
      for (const PinTest& t : tests) {
        if (t.passed) continue;
        report.failures.push_back({side.name, "pinned-acceptance",
                                   side.name + ": block position " + std::to_string(t.position) + " accepted in " +
                                       std::to_string(t.reached) + " of " + std::to_string(t.blocks) + " blocks (" +
                                       format_number(100.0 * t.reached / t.blocks, "%.1f") + "%), below the pinned " +
                                       format_number(100.0 * t.pinned, "%.1f") +
                                       "%: P(X <= " + std::to_string(t.reached) + ") = " + format_number(t.p_value) +
                                       " under Binomial(" + std::to_string(t.blocks) + ", " + format_number(t.pinned) +
                                       ") is below the level " + format_number(t.level) + " (false-alarm rate " +
                                       format_number(kAcceptanceFalseAlarm) + " over " + std::to_string(tests.size()) +
                                       " positions); it passes from " + std::to_string(t.least_passing) + " blocks"});
      }
      report.pin_tests.emplace_back(static_cast<int>(i), std::move(tests));
    }
  }
  for (const auto& [expected, actual] : comparisons) {
    const SideAcceptance* reference = report.side_of_lane(expected);
    const SideAcceptance* candidate = report.side_of_lane(actual);
    if (reference == nullptr || candidate == nullptr) continue;
    if (std::optional<AcceptanceFailure> f = canary(*reference, *candidate)) {
      const bool seen = std::any_of(report.failures.begin(), report.failures.end(), [&](const AcceptanceFailure& g) {
        return g.check == f->check && g.detail == f->detail;
      });
      if (!seen) report.failures.push_back(*f);
    }
  }
  return report;
}

}  // namespace dflash
