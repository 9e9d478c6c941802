// Which pairs judge a rank's partial (docs/spec/tensor-parallel.md §7): two drafters that round at
// the same points compare every rank's partial; across precisions (the fp8 envelope) only the
// reduced stages are judged, and they pass where a partial left the whole-row envelope (rows64-d64
// at TP 4: rank 2's down_proj partial 1.43 times its bound, on the CPU as on an H100).
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "compare/replay.h"
#include "fixtures/fixture.h"
#include "reference/reference_drafter.h"

namespace dflash {
namespace {

struct Judged {
  std::set<std::string> stages;
  bool passed = true;
};

Judged judge(const std::string& fixture_dir, int tp, Precision expected, Precision actual) {
  Fixture fixture = read_fixture(std::string(DFLASH_SOURCE_DIR) + "/fixtures/" + fixture_dir);
  fixture.load_weights();
  const auto head = [&](Precision p) {
    HeadSettings h = fixture.head;
    h.precision = p;
    h.tp_size = tp;
    return h;
  };
  const auto a = make_reference_drafter(fixture.config, fixture.weights, head(expected));
  const auto b = make_reference_drafter(fixture.config, fixture.weights, head(actual));
  const std::vector<ReplayLane> lanes = {{a.get(), expected, false, {}}, {b.get(), actual, false, {}}};
  ReplayOptions options;
  options.tp_size = tp;
  const ReplayResult result = replay_fixture(fixture, lanes, {{0, 1}}, options);
  Judged judged;
  for (const SequenceResult& seq : result.sequences) {
    judged.passed = judged.passed && seq.passed();
    for (const StageCheck& stage : seq.stages) judged.stages.insert(stage.stage);
  }
  return judged;
}

TEST(TpPartials, SameRoundingPointsJudgeEveryRanksPartial) {
  const Judged j = judge("blind-spots/rows64-d64", 4, Precision::kFp8, Precision::kFp8);
  EXPECT_TRUE(j.passed);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(j.stages.count("L0.o_proj.partial@r" + std::to_string(r)), 1u) << r;
    EXPECT_EQ(j.stages.count("L1.mlp.partial@r" + std::to_string(r)), 1u) << r;
  }
}

TEST(TpPartials, TheEnvelopeJudgesTheReducedStagesAlone) {
  const Judged j = judge("blind-spots/rows64-d64", 4, Precision::kBf16, Precision::kFp8);
  EXPECT_TRUE(j.passed);
  for (const std::string& stage : j.stages) EXPECT_EQ(stage.find(".partial@r"), std::string::npos) << stage;
  EXPECT_EQ(j.stages.count("L0.o_proj"), 1u);
  EXPECT_EQ(j.stages.count("L0.mlp"), 1u);
}

}  // namespace
}  // namespace dflash
