#include "reference/candidate_selector.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace dflash {

template <typename T>
SelectorResult<T> select_candidates(const Dflash2Config& config, const PreparedSelector<T>& w, int anchor,
                                    const AlignedMatrix<T>& logits, const AlignedMatrix<T>& hidden_proj, int64_t row0,
                                    int64_t n) {
  SelectorResult<T> s;
  const int64_t K = config.selector_top_k, r = config.selector_rank, V = logits.cols();
  s.slots = n;
  s.k = K;
  s.rank = r;
  s.topk_ids.resize(static_cast<size_t>(n * K));
  s.topk_values.resize(static_cast<size_t>(n * K));
  s.unary.resize(static_cast<size_t>(n * K));
  s.hidden_proj.resize(static_cast<size_t>(n * r));
  s.edge_scores.resize(static_cast<size_t>(n * K * K));
  s.walk_scores.resize(static_cast<size_t>(n * K));
  s.walk_index.resize(static_cast<size_t>(n));
  s.draft_tokens.resize(static_cast<size_t>(n));
  std::vector<int32_t> order(static_cast<size_t>(V));
  const T multiplier = static_cast<T>(config.output_multiplier);
  const T cap = static_cast<T>(config.final_logit_softcapping);
  for (int64_t t = 0; t < n; ++t) {
    // 1. top-K by raw logit; equal values: lower token id first. NaN ranks above every number (as
    // torch.topk, and the CUDA kernels), so that the order stays total: a comparison that is not
    // a strict weak order makes partial_sort undefined.
    const T* row = logits.row(row0 + t);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int32_t a, int32_t b) {
      const bool a_nan = std::isnan(row[a]), b_nan = std::isnan(row[b]);
      if (a_nan != b_nan) return a_nan;
      if (!a_nan && row[a] != row[b]) return row[a] > row[b];
      return a < b;
    });
    for (int64_t c = 0; c < K; ++c) {
      const size_t i = static_cast<size_t>(t * K + c);
      s.topk_ids[i] = order[static_cast<size_t>(c)];
      s.topk_values[i] = row[order[static_cast<size_t>(c)]];
      // 2. unary: multiplier, then softcap, after the top-k.
      T u = s.topk_values[i] * multiplier;
      if (config.final_logit_softcapping > 0) u = cap * std::tanh(u / cap);
      s.unary[i] = u;
    }
    std::copy(hidden_proj.row(row0 + t), hidden_proj.row(row0 + t) + r, s.hidden_proj.begin() + t * r);
  }
  // 4. edge scores: predecessor of slot 0 is the anchor (every p), of slot t the candidates of t-1.
  const T* hh_all = s.hidden_proj.data();
  for (int64_t t = 0; t < n; ++t) {
    const T* hh = hh_all + t * r;
    for (int64_t p = 0; p < K; ++p) {
      const int32_t pred = t == 0 ? anchor : s.topk_ids[static_cast<size_t>((t - 1) * K + p)];
      const T* a = w.predecessor.data() + static_cast<int64_t>(pred) * r;
      for (int64_t c = 0; c < K; ++c) {
        const T* bs = w.successor.data() + static_cast<int64_t>(s.topk_ids[static_cast<size_t>(t * K + c)]) * r;
        T sum = 0;
        for (int64_t j = 0; j < r; ++j) sum += a[j] * hh[j] * bs[j];
        s.edge_scores[static_cast<size_t>((t * K + p) * K + c)] = s.unary[static_cast<size_t>(t * K + c)] + sum;
      }
    }
  }
  // 5. greedy walk: prev starts at slot 0; first maximum wins (lowest slot on ties).
  int64_t prev = 0;
  for (int64_t t = 0; t < n; ++t) {
    const T* scores = s.edge_scores.data() + (t * K + prev) * K;
    int64_t best = 0;
    for (int64_t c = 1; c < K; ++c) {
      if (scores[c] > scores[best]) best = c;
    }
    std::copy(scores, scores + K, s.walk_scores.begin() + t * K);
    s.walk_index[static_cast<size_t>(t)] = static_cast<int32_t>(best);
    s.draft_tokens[static_cast<size_t>(t)] = s.topk_ids[static_cast<size_t>(t * K + best)];
    prev = best;
  }
  return s;
}

template SelectorResult<float> select_candidates<float>(const Dflash2Config&, const PreparedSelector<float>&, int,
                                                        const AlignedMatrix<float>&, const AlignedMatrix<float>&,
                                                        int64_t, int64_t);
template SelectorResult<double> select_candidates<double>(const Dflash2Config&, const PreparedSelector<double>&, int,
                                                          const AlignedMatrix<double>&, const AlignedMatrix<double>&,
                                                          int64_t, int64_t);

}  // namespace dflash
