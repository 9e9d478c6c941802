// Per-head steps of q and k (docs/spec/drafter.md §3-4): RMSNorm over each head with q_norm / k_norm, then
// rotate-half RoPE at each row's absolute position, with core/rope.h's fp32 cos/sin.
#pragma once
#include <cstdint>
#include <vector>

#include "core/rope.h"
#include "reference/aligned_matrix.h"

namespace dflash {

// cos and sin (already scaled by the YaRN attention factor) of each position, [positions, d/2].
template <typename T>
struct RopeRows {
  AlignedMatrix<T> cos, sin;
};

template <typename T>
RopeRows<T> make_rope_rows(const RopeTable& table, const std::vector<int64_t>& positions);

// Rows [0, rows) of m hold `heads` heads of width d side by side. Each head is RMS-normalized with
// `norm_weight` [d] and rotated with row r's entry of `rope` (rope row = rope_row_begin + r).
template <typename T>
void norm_and_rotate_heads(AlignedMatrix<T>* m, int64_t rows, int heads, int head_dim, const std::vector<T>& norm_weight,
                           T eps, const RopeRows<T>& rope, int64_t rope_row_begin);

}  // namespace dflash
