#include "compare/selector_alignment.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/stages.h"

namespace dflash {
namespace {

const Tensor* find(const std::vector<const Tap*>& taps, StageKind kind) {
  for (const Tap* tap : taps) {
    if (tap->name == stage_name(kind)) return &tap->value;
  }
  return nullptr;
}

const Tensor* find(const std::vector<Tap>& taps, StageKind kind) {
  for (const Tap& tap : taps) {
    if (tap.name == stage_name(kind)) return &tap.value;
  }
  return nullptr;
}

// 2 · rms_bound · RMS(row): the draft tokens' tie threshold (compare/tokens.h).
double tie_threshold(const float* logits, int64_t vocab, double rms_bound) {
  double sum_squares = 0;
  for (int64_t v = 0; v < vocab; ++v) sum_squares += static_cast<double>(logits[v]) * logits[v];
  return 2.0 * rms_bound * std::sqrt(sum_squares / static_cast<double>(std::max<int64_t>(vocab, 1)));
}

}  // namespace

std::optional<SelectorAlignment> align_selector_taps(const std::vector<const Tap*>& expected,
                                                     const std::vector<Tap>& actual, const Tensor& margin_logits,
                                                     double rms_bound, const std::vector<int32_t>& expected_drafts) {
  const StageKind kinds[] = {StageKind::kSelTopkIds, StageKind::kSelTopkValues, StageKind::kSelUnary,
                             StageKind::kSelEdgeScores, StageKind::kSelWalkScores};
  const Tensor* want[5];
  const Tensor* got[5];
  for (int i = 0; i < 5; ++i) {
    want[i] = find(expected, kinds[i]);
    got[i] = find(actual, kinds[i]);
    if (want[i] == nullptr || got[i] == nullptr || want[i]->shape != got[i]->shape) return std::nullopt;
  }
  const Tensor& want_ids = *want[0];
  const int64_t n = want_ids.rows(), k = want_ids.cols(), vocab = margin_logits.cols();
  if (margin_logits.rows() != n || static_cast<int64_t>(expected_drafts.size()) != n ||
      want[3]->values.size() != static_cast<size_t>(n * k * k)) {
    return std::nullopt;
  }
  SelectorAlignment result;
  // slot[t][c]: the actual side's slot holding the expected candidate c of row t, or -1.
  std::vector<std::vector<int64_t>> slot(static_cast<size_t>(n), std::vector<int64_t>(static_cast<size_t>(k), -1));
  for (int64_t t = 0; t < n; ++t) {
    const float* logits = margin_logits.row(t);
    const double threshold = tie_threshold(logits, vocab, rms_bound);
    bool differs = false, tied = true;
    for (int64_t c = 0; c < k; ++c) {
      const float e = want_ids.row(t)[c], a = got[0]->row(t)[c];
      for (int64_t s = 0; s < k; ++s) {
        if (got[0]->row(t)[s] == e) slot[static_cast<size_t>(t)][static_cast<size_t>(c)] = s;
      }
      if (a == e) continue;
      differs = true;
      const auto id = [vocab](float v) { return v >= 0 && v < static_cast<float>(vocab) && v == std::floor(v); };
      tied = tied && id(a) && id(e) &&
             std::fabs(static_cast<double>(logits[static_cast<int64_t>(a)]) - logits[static_cast<int64_t>(e)]) <=
                 threshold;
    }
    if (differs) (tied ? result.reordered_rows : result.untied_rows) += 1;
  }
  std::vector<Tensor> aligned;
  for (int i = 0; i < 5; ++i) aligned.push_back(*got[i]);
  if (result.untied_rows == 0) {
    aligned[0] = want_ids;
    for (int i : {1, 2}) {  // per candidate: [n, K]
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t c = 0; c < k; ++c) {
          const int64_t s = slot[static_cast<size_t>(t)][static_cast<size_t>(c)];
          aligned[static_cast<size_t>(i)].row(t)[c] = s >= 0 ? got[i]->row(t)[s] : want[i]->row(t)[c];
        }
      }
    }
    // Edge scores [t, predecessor slot, candidate slot]: slot 0's predecessor is the anchor for
    // every p (its rows are equal), later slots' the previous row's candidates.
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t p = 0; p < k; ++p) {
        const int64_t ap = t == 0 ? p : slot[static_cast<size_t>(t - 1)][static_cast<size_t>(p)];
        for (int64_t c = 0; c < k; ++c) {
          const int64_t ac = slot[static_cast<size_t>(t)][static_cast<size_t>(c)];
          const size_t at = static_cast<size_t>((t * k + p) * k + c);
          aligned[3].values[at] = ap >= 0 && ac >= 0 ? got[3]->values[static_cast<size_t>((t * k + ap) * k + ac)]
                                                     : want[3]->values[at];
        }
      }
    }
  }
  // Walk scores, teacher-forced: the (aligned) edge row at the expected walk's predecessor slot.
  int64_t prev = 0;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t c = 0; c < k; ++c) aligned[4].row(t)[c] = aligned[3].values[static_cast<size_t>((t * k + prev) * k + c)];
    prev = -1;
    for (int64_t c = 0; c < k; ++c) {
      if (want_ids.row(t)[c] == static_cast<float>(expected_drafts[static_cast<size_t>(t)])) prev = c;
    }
    if (prev < 0) {  // the expected draft is not among its candidates: no predecessor to force
      for (int64_t r = t + 1; r < n; ++r) {
        for (int64_t c = 0; c < k; ++c) aligned[4].row(r)[c] = got[4]->row(r)[c];
      }
      break;
    }
  }
  for (int i = 0; i < 5; ++i) result.taps.push_back({stage_name(kinds[i]), std::move(aligned[static_cast<size_t>(i)])});
  return result;
}

}  // namespace dflash
