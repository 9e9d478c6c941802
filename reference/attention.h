// Attention of one sequence's block rows (docs/spec/drafter.md §3): keys and values are the cached context
// window (position order, ending at the anchor's position - 1) followed by the block's own rows.
// Full layers: no mask (every block row sees the whole window and every block row). DFlash2 sliding
// non-causal layers (docs/spec/dflash2.md §3.3): block row i sees context positions down to
// s + i - (W - 1) and every block row. softmax(q·kᵀ·d^-1/2)·v per query head, GQA by head groups.
#pragma once
#include <cstdint>
#include <vector>

#include "reference/aligned_matrix.h"

namespace dflash {

struct AttentionGeometry {
  int num_heads = 0;     // nh
  int num_kv_heads = 0;  // nkv; query head h reads kv head h / (nh / nkv)
  int head_dim = 0;      // d
};

// One task of a batched attention: query heads of kv head `kv_head` for the block rows
// [row0, row0 + block_width) of one sequence. Reads head kv_head of the pool rows at
// `window_slots` and of the block rows of k_block / v_block; writes those query heads' columns of
// the same rows of `out`. window_left = W - 1 for a sliding layer, -1 for a full one. Depends on
// nothing but these inputs (not on other sequences or threads). causal_block (a planted fault,
// Dflash2Fault::kCausalBlock): block row i sees block rows j <= i only. kv_source (a planted fault,
// TpFault::kWrongShardKvHeads; -1: kv_head): the K/V head read instead of kv_head.
template <typename T>
void attend_kv_group(const AttentionGeometry& geometry, int kv_head, int64_t row0, int64_t block_width,
                     const AlignedMatrix<T>& q, const AlignedMatrix<T>& k_block, const AlignedMatrix<T>& v_block,
                     const AlignedMatrix<T>& k_pool, const AlignedMatrix<T>& v_pool,
                     const std::vector<int64_t>& window_slots, int64_t window_left, AlignedMatrix<T>* out,
                     bool causal_block = false, int kv_source = -1);

}  // namespace dflash
