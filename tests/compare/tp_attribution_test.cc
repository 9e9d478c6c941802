// Where a divergence lies at TP = N (compare/tp_attribution.h, docs/spec/tensor-parallel.md §7): a
// fault in one rank's columns names that rank alone, with its heads or tokens and columns; split
// and replicated KV heads; stages that are sums over the ranks name none; differing tokens name the
// ranks that own them.
#include "compare/tp_attribution.h"

#include <string>

#include <gtest/gtest.h>

namespace dflash {
namespace {

// nh 8, nkv 2, d 4, V 64, 2 layers.
TpPartition partition(int ranks) { return {ranks, 8, 2, 4, 64, 2}; }

Tensor filled(int64_t rows, int64_t cols) {
  Tensor t = Tensor::zeros({rows, cols});
  for (int64_t i = 0; i < rows * cols; ++i) t.values[static_cast<size_t>(i)] = 1.0f + 0.01f * static_cast<float>(i % 13);
  return t;
}

StageBound tight() {
  StageBound b;
  b.rel_rms = 1e-3;
  b.max_rel = 1e-3;
  return b;
}

TEST(TpAttribution, AFaultInOneRanksColumnsNamesThatRank) {
  const Tensor e = filled(3, 32);  // q: 8 heads x 4
  Tensor a = e;
  a.row(1)[21] += 0.5f;  // column 21: head 5, rank 2 of 4 (heads 4..5)
  EXPECT_EQ(attribute_stage("L1.q", e, a, tight(), partition(4)), "rank 2 (query heads 4..5, columns 16..23)");
  EXPECT_EQ(attribute_stage("L0.attn", e, a, tight(), partition(2)), "rank 1 (query heads 4..7, columns 16..31)");
  // Both halves off: both ranks.
  a.row(0)[2] += 0.5f;
  EXPECT_EQ(attribute_stage("L0.attn", e, a, tight(), partition(2)),
            "rank 0 (query heads 0..3, columns 0..15); rank 1 (query heads 4..7, columns 16..31)");
  // TP = 1, and a stage that is a sum over the ranks (o_proj) or a replica (attn_norm): none.
  EXPECT_EQ(attribute_stage("L0.attn", e, a, tight(), partition(1)), "");
  EXPECT_EQ(attribute_stage("L0.o_proj", e, a, tight(), partition(2)), "");
  EXPECT_EQ(attribute_stage("L0.attn_norm", e, a, tight(), partition(2)), "");
  // A shape that is not the partition's names none rather than a wrong range.
  EXPECT_EQ(attribute_stage("L0.q", filled(3, 30), filled(3, 30), tight(), partition(2)), "");
}

TEST(TpAttribution, KvHeadsSplitAndReplicated) {
  const Tensor e = filled(2, 8);  // k: 2 KV heads x 4
  Tensor a = e;
  a.row(0)[6] += 0.5f;  // KV head 1
  EXPECT_EQ(attribute_stage("L0.k", e, a, tight(), partition(2)), "rank 1 (KV head 1, columns 4..7)");
  // N = 4 on 2 KV heads: head 1 lives on ranks 2 and 3.
  EXPECT_EQ(attribute_stage("L1.v", e, a, tight(), partition(4)), "ranks 2..3 (KV head 1, columns 4..7)");
}

TEST(TpAttribution, LogitsAndTokensByVocabularyShard) {
  const Tensor e = filled(2, 64);
  Tensor a = e;
  a.row(1)[40] -= 0.5f;
  EXPECT_EQ(attribute_stage("logits", e, a, tight(), partition(4)), "rank 2 (tokens 32..47, columns 32..47)");
  EXPECT_EQ(attribute_tokens(40, 8, partition(2)), "expected token 40 on rank 1, actual token 8 on rank 0");
  EXPECT_EQ(attribute_tokens(40, 8, partition(1)), "");
}

// DFlash2's candidates are global token ids: the first pair that differs names the shards that
// gave each (V 64 at TP 2: ids 32..63 are rank 1's).
TEST(TpAttribution, CandidateIdsByTheShardThatGaveThem) {
  const Tensor e({2, 3}, {40, 7, 3, 41, 33, 9});
  Tensor a = e;
  a.row(1)[1] = 12.0f;  // rank 1's 33 replaced by rank 0's 12
  EXPECT_EQ(attribute_stage("selector.topk_ids", e, a, tight(), partition(2)),
            "expected candidate 33 from rank 1, actual candidate 12 from rank 0");
  EXPECT_EQ(attribute_stage("selector.topk_ids", e, e, tight(), partition(2)), "");
  EXPECT_EQ(attribute_stage("selector.topk_ids", e, a, tight(), partition(1)), "");
}

}  // namespace
}  // namespace dflash
