// The stage names of docs/spec/drafter.md §7: spelled, ordered, parsed and shaped in one place.
#include "core/stages.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace dflash {
namespace {

TEST(Stages, ForwardOrderOfATwoLayerDrafter) {
  const std::vector<std::string> order = forward_stage_order(2);
  ASSERT_EQ(order.size(), 2u + 2 * 9 + 2);
  EXPECT_EQ(order[0], "ctx_proj");
  EXPECT_EQ(order[1], "embed");
  const std::vector<std::string> layer0 = {"L0.attn_norm", "L0.q", "L0.k", "L0.v", "L0.attn",
                                           "L0.o_proj", "L0.mlp_norm", "L0.mlp", "L0.out"};
  for (size_t i = 0; i < layer0.size(); ++i) EXPECT_EQ(order[2 + i], layer0[i]);
  EXPECT_EQ(order[11], "L1.attn_norm");
  EXPECT_EQ(order[20], "final_norm");
  EXPECT_EQ(order[21], "logits");
  for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(stage_order_index(order[i], 2), static_cast<int>(i));
}

TEST(Stages, NamesOutsideTheDrafterAreNotStages) {
  EXPECT_EQ(stage_order_index("L2.q", 2), -1);
  EXPECT_EQ(stage_order_index("L0.qq", 2), -1);
  EXPECT_EQ(stage_order_index("L01.q", 2), -1);
  EXPECT_EQ(stage_order_index("Lx.q", 2), -1);
  EXPECT_EQ(stage_order_index("draft_tokens", 2), -1);
  StageId id;
  ASSERT_TRUE(parse_stage_name("L1.mlp_norm", 2, &id));
  EXPECT_EQ(id.kind, StageKind::kMlpNorm);
  EXPECT_EQ(id.layer, 1);
}

TEST(Stages, NamesAndShapesOfEachKind) {
  EXPECT_EQ(stage_name(StageKind::kCtxProj), "ctx_proj");
  EXPECT_EQ(stage_name(StageKind::kLogits), "logits");
  EXPECT_EQ(stage_name(StageKind::kOProj, 3), "L3.o_proj");
  EXPECT_EQ(stage_name({StageKind::kAttnNorm, 12}), "L12.attn_norm");
  EXPECT_TRUE(is_layer_stage(StageKind::kQ));
  EXPECT_FALSE(is_layer_stage(StageKind::kFinalNorm));
  for (const std::string& name : forward_stage_order(3)) {
    StageId id;
    ASSERT_TRUE(parse_stage_name(name, 3, &id)) << name;
    EXPECT_EQ(stage_name(id), name);
  }
  EXPECT_EQ(stage_names_summary(4),
            "ctx_proj, embed, L{l}.attn_norm|q|k|v|attn|o_proj|mlp_norm|mlp|out for l < 4, final_norm, logits");

  DrafterConfig c;
  c.hidden_size = 32, c.num_heads = 4, c.num_kv_heads = 2, c.head_dim = 16, c.vocab_size = 97;
  auto shape = [&](const std::string& name) {
    StageId id;
    EXPECT_TRUE(parse_stage_name(name, 2, &id)) << name;
    return stage_shape(id, c, 5, 7);
  };
  EXPECT_EQ(shape("ctx_proj"), (std::vector<int64_t>{7, 32}));
  EXPECT_EQ(shape("embed"), (std::vector<int64_t>{5, 32}));
  EXPECT_EQ(shape("L1.q"), (std::vector<int64_t>{5, 64}));
  EXPECT_EQ(shape("L0.attn"), (std::vector<int64_t>{5, 64}));
  EXPECT_EQ(shape("L0.k"), (std::vector<int64_t>{5, 32}));
  EXPECT_EQ(shape("L1.v"), (std::vector<int64_t>{5, 32}));
  EXPECT_EQ(shape("L1.mlp"), (std::vector<int64_t>{5, 32}));
  EXPECT_EQ(shape("final_norm"), (std::vector<int64_t>{5, 32}));
  EXPECT_EQ(shape("logits"), (std::vector<int64_t>{4, 97}));
}

// docs/spec/tensor-parallel.md §7: at TP = N the ranks' partials of o_proj and mlp come just before
// their stage, in rank order; they parse only below N, only for the row-parallel stages, and are no
// stage at TP = 1.
TEST(Stages, TensorParallelPartialsComeBeforeTheirStage) {
  const std::vector<std::string> order = forward_stage_order(1, false, 2);
  const std::vector<std::string> want = {"ctx_proj", "embed", "L0.attn_norm", "L0.q", "L0.k", "L0.v", "L0.attn",
                                         "L0.o_proj.partial@r0", "L0.o_proj.partial@r1", "L0.o_proj", "L0.mlp_norm",
                                         "L0.mlp.partial@r0", "L0.mlp.partial@r1", "L0.mlp", "L0.out", "final_norm",
                                         "logits"};
  EXPECT_EQ(order, want);
  for (const std::string& name : forward_stage_order(2, true, 4)) {
    StageId id;
    ASSERT_TRUE(parse_stage_name(name, 2, &id, true, 4)) << name;
    EXPECT_EQ(stage_name(id), name);
  }
  StageId id;
  ASSERT_TRUE(parse_stage_name("L1.mlp.partial@r3", 2, &id, false, 4));
  EXPECT_EQ(id.kind, StageKind::kMlp);
  EXPECT_EQ(id.layer, 1);
  EXPECT_EQ(id.rank, 3);
  EXPECT_EQ(stage_order_index("L0.o_proj.partial@r1", 1, false, 2), 8);
  for (const char* bad : {"L0.o_proj.partial@r2", "L0.q.partial@r0", "L0.o_proj.partial@r01", "L0.o_proj.partial@r",
                          "L2.mlp.partial@r0", "logits.partial@r0"}) {
    EXPECT_FALSE(parse_stage_name(bad, 2, &id, false, 2)) << bad;
  }
  EXPECT_FALSE(parse_stage_name("L0.o_proj.partial@r0", 2, &id)) << "no partials at TP = 1";
  EXPECT_EQ(stage_order_index("L0.o_proj.partial@r0", 1), -1);
  // Every rank's partial shares its family, which no other stage name has.
  EXPECT_EQ(partial_family(StageKind::kMlp, 3), "L3.mlp.partial");
  EXPECT_EQ(partial_family_of(stage_name(StageKind::kMlp, 3, 1)), "L3.mlp.partial");
  EXPECT_EQ(partial_family_of("L0.o_proj.partial@r0"), partial_family(StageKind::kOProj, 0));
  for (const char* other : {"L0.o_proj", "L0.o_proj.partial", "logits", "selector.topk_ids"}) {
    EXPECT_EQ(partial_family_of(other), "") << other;
  }
}

}  // namespace
}  // namespace dflash
