// Where a divergence lies at TP = N (docs/spec/tensor-parallel.md §7): a failing column-parallel
// stage's column slice per rank scored with the stage's own criteria (the per-element argument of
// docs/tolerances.md §1 holds for any subset of a row), and the ranks that own two differing draft
// tokens. Stages that are sums or replicas over the ranks name none.
#pragma once
#include <cstdint>
#include <string>

#include "compare/tolerance.h"
#include "core/config.h"
#include "core/tensor.h"

namespace dflash {

struct TpPartition {
  int ranks = 1;
  int num_heads = 0, num_kv_heads = 0, head_dim = 0;
  int64_t vocab_size = 0;
  int num_layers = 0;
};

// `config` split over `ranks` (one definition for replay and the K/V pool checks).
TpPartition tp_partition(const DrafterConfig& config, int ranks);

// The columns one rank holds of a column-parallel value (a replicated KV head: its group of ranks).
struct TpColumnSlice {
  std::string owner;  // "rank 2", "ranks 4..5"
  std::string what;   // "query heads 16..23", "KV head 1", "tokens 32..47"
  int64_t first = 0, count = 0;
};
// Every rank's slice of stage `stage` of `cols` columns: L{l}.q and L{l}.attn (query heads),
// L{l}.k and L{l}.v (KV heads, split or replicated), logits (the vocabulary); empty for any other
// stage or a width that is not the partition's.
std::vector<TpColumnSlice> tp_column_slices(const std::string& stage, int64_t cols, const TpPartition& partition);
// The slice's columns of every row of `t`.
Tensor tp_columns(const Tensor& t, const TpColumnSlice& slice);
// "rank 1 (KV head 1, columns 16..31)"
std::string describe_slice(const TpColumnSlice& slice);

// L{l}.q and L{l}.attn (query heads), L{l}.k and L{l}.v (KV heads: split, or replicated over
// N / nkv ranks each) and logits (the vocabulary): every rank (or group of replicas) whose slice
// breaks `bound`, else the one with the largest ratio, e.g. "rank 2 (query heads 16..23, columns
// 2048..3071)"; a rank's partial ("L{l}.o_proj.partial@r{rank}") names its rank; the DFlash2
// candidates (selector.topk_ids, global ids) name the vocabulary shards of their first differing
// pair. "" for any other stage, for ranks 1, or where the shape is not the partition's.
std::string attribute_stage(const std::string& stage, const Tensor& expected, const Tensor& actual,
                            const StageBound& bound, const TpPartition& partition);

// The pool that holds column `column` of a layer's K or V (§6: rank r's pool holds its own KV
// heads; a replicated head is held by its R ranks): "rank 1 (KV head 2)", "ranks 2..3 (KV head
// 1)"; "" for ranks 1 or a column outside the partition.
std::string kv_column_owner(int64_t column, const TpPartition& partition);

// "expected token 180 on rank 1, actual token 52 on rank 0"; "" for ranks 1.
std::string attribute_tokens(int64_t expected, int64_t actual, const TpPartition& partition);

}  // namespace dflash
