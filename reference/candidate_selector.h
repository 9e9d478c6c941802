// DFlash2's candidate selector for one sequence (docs/spec/dflash2.md §3.4): top-K of each mask
// row's raw logits (descending value, lower id first on equal values), unary = multiplier then
// softcap, edge scores from the codebooks and the projected final-normed rows, and the greedy walk
// (predecessor slot 0 first, lowest slot on ties). Its tokens replace the per-row argmax.
#pragma once
#include <cstdint>
#include <vector>

#include "core/config.h"
#include "reference/aligned_matrix.h"
#include "reference/prepared_weights.h"

namespace dflash {

template <typename T>
struct SelectorResult {
  int64_t slots = 0, k = 0, rank = 0;  // n = B-1, K, r
  std::vector<int32_t> topk_ids;       // [n, K]
  std::vector<T> topk_values, unary;   // [n, K]
  std::vector<T> hidden_proj;          // [n, r]
  std::vector<T> edge_scores;          // [n, K, K]: [slot, predecessor slot, candidate slot]
  std::vector<T> walk_scores;          // [n, K]: the edge row the walk read
  std::vector<int32_t> walk_index;     // [n]
  std::vector<int32_t> draft_tokens;   // [n]
};

// Rows [row0, row0 + n) of `logits` ([*, V]) and `hidden_proj` ([*, r]) belong to this sequence.
template <typename T>
SelectorResult<T> select_candidates(const Dflash2Config& config, const PreparedSelector<T>& weights, int anchor,
                                    const AlignedMatrix<T>& logits, const AlignedMatrix<T>& hidden_proj, int64_t row0,
                                    int64_t n);

}  // namespace dflash
