// The replay engine on a scripted drafter: call sequence, comparisons with the fixture, the cross
// comparison of two drafters, first divergence across steps, invariant checks, refused input.
#include "tests/support/harness_error.h"
#include "compare/replay.h"

#include <gtest/gtest.h>

#include "compare/report_json.h"
#include "core/error.h"
#include "tests/compare/scripted_proposer.h"

namespace dflash {
namespace {

using namespace testing_support;

ProposeEntry entry(int seq, int64_t rows, int64_t start, int anchor, int width) {
  ProposeEntry e;
  e.seq = seq;
  e.ctx_name = "s.q" + std::to_string(seq) + ".ctx";
  e.ctx = Tensor::zeros({rows, 4});
  e.start = start;
  e.anchor = anchor;
  e.block_width = width;
  const int b = clamp_block_width(width, 4);
  ExpectedOutputs x;
  x.logits = scripted_logits(anchor, b);
  x.draft_tokens = scripted_drafts(anchor, b);
  for (size_t t = 0; t < scripted_tap_names().size(); ++t) {
    x.taps.push_back({scripted_tap_names()[t], scripted_tap_tensor(seq, start, static_cast<int>(t), b)});
  }
  e.expect = x;
  return e;
}

// Two sequences, batched proposes, a release, a width that clamps.
Fixture scripted_fixture() {
  Fixture f;
  f.name = "scripted";
  f.expect_precision = "fp64";
  f.config = scripted_config();
  f.head = scripted_head(2);
  FixtureStep s0, s1, s2, s3;
  s0.propose = {entry(0, 5, 5, 1, 4)};
  s1.propose = {entry(0, 2, 7, 2, 4), entry(1, 3, 3, 3, 4)};
  s2.kind = FixtureStep::Kind::kRelease;
  s2.release = {0};
  s3.propose = {entry(1, 1, 4, 4, 9)};
  f.steps = {s0, s1, s2, s3};
  return f;
}

TEST(Replay, CleanFixturePassesAndDrivesTheDrafterLikeAnEngine) {
  ScriptedProposer drafter("scripted-a", scripted_head(2));
  const Fixture fixture = scripted_fixture();
  std::vector<int> progress;
  ReplayOptions options;
  options.on_step = [&](int done, int total) {
    progress.push_back(done);
    EXPECT_EQ(total, 4);
  };
  const ReplayResult r = replay_fixture(fixture, {{&drafter, Precision::kFp64, true}}, {}, options);
  EXPECT_TRUE(r.passed());
  EXPECT_TRUE(r.invariant_failures.empty());
  EXPECT_FALSE(r.first_divergence.has_value());
  EXPECT_EQ(r.steps_run, 4);
  EXPECT_EQ(progress, (std::vector<int>{1, 2, 3, 4}));
  EXPECT_EQ(drafter.calls, (std::vector<std::string>{"add 0", "propose 1 taps", "add 1", "propose 2 taps",
                                                     "release 0", "propose 1 taps"}));
  ASSERT_EQ(r.pairs.size(), 1u);
  EXPECT_EQ(r.pairs[0].label, "fixture(fp64) vs scripted-a");
  ASSERT_EQ(r.sequences.size(), 4u);  // 1 + 2 + 1 sequence proposes
  const SequenceResult& last = r.sequences.back();
  EXPECT_EQ(last.step, 3);
  EXPECT_EQ(last.requested_width, 9);
  EXPECT_EQ(last.block_width, 4);
  ASSERT_EQ(last.stages.size(), 4u);  // embed, L0.q, L0.v, logits in forward order
  EXPECT_EQ(last.stages[0].stage, "embed");
  EXPECT_EQ(last.stages[1].stage, "L0.q");
  EXPECT_EQ(last.stages[2].stage, "L0.v");
  EXPECT_EQ(last.stages[3].stage, "logits");
  ASSERT_TRUE(last.tokens.has_value());
  EXPECT_EQ(last.tokens->agree, 3);
  const PairTotals totals = pair_totals(r, 0);
  EXPECT_EQ(totals.agree, 3 + 3 + 3 + 3);
  EXPECT_EQ(totals.mismatch, 0);
}

TEST(Replay, OneCorruptedTapIsTheFirstDivergenceWithStepAndSequence) {
  Fixture fixture = scripted_fixture();
  fixture.steps[1].propose[1].expect->taps[1].value.row(2)[3] += 0.5f;  // step 1, sequence 1, L0.q
  ScriptedProposer drafter("scripted-a", scripted_head(2));
  const ReplayResult r = replay_fixture(fixture, {{&drafter, Precision::kFp64, true}}, {});
  EXPECT_FALSE(r.passed());
  ASSERT_TRUE(r.first_divergence.has_value());
  EXPECT_EQ(r.first_divergence->step, 1);
  EXPECT_EQ(r.first_divergence->seq, 1);
  EXPECT_EQ(r.first_divergence->stage, "L0.q");
  EXPECT_EQ(r.first_divergence->row, 2);
  EXPECT_EQ(r.first_divergence->col, 3);
  EXPECT_EQ(r.first_divergence->pair, "fixture(fp64) vs scripted-a");
  EXPECT_NEAR(r.first_divergence->actual - r.first_divergence->expected, -0.5, 1e-6);
}

TEST(Replay, OneCorruptedDraftTokenFails) {
  Fixture fixture = scripted_fixture();
  (*fixture.steps[3].propose[0].expect->draft_tokens)[1] = 0;  // the logits' top is (4 + 1) % 6 = 5
  ScriptedProposer drafter("scripted-a", scripted_head(2));
  const ReplayResult r = replay_fixture(fixture, {{&drafter, Precision::kFp64, true}}, {});
  EXPECT_FALSE(r.passed());
  ASSERT_TRUE(r.first_divergence.has_value());
  EXPECT_EQ(r.first_divergence->step, 3);
  EXPECT_EQ(r.first_divergence->seq, 1);
  EXPECT_EQ(r.first_divergence->stage, "draft_tokens");
  EXPECT_EQ(r.first_divergence->criterion, "draft-token");
  EXPECT_EQ(r.first_divergence->row, 1);
  EXPECT_EQ(pair_totals(r, 0).mismatch, 1);
}

TEST(Replay, CrossCheckFindsAPlantedFaultInTheCandidate) {
  // The candidate's L0.v of sequence 1 is off from step 1 on; the reference agrees with the fixture.
  ScriptedProposer reference("reference-fp8", scripted_head(2));
  ScriptedProposer candidate("cuda-fp8", scripted_head(2), [](ProposeOutput* out) {
    if (out->seq == 1) {
      for (Tap& tap : out->taps) {
        if (tap.name == "L0.v") tap.value.row(0)[0] *= 3.0f;
      }
    }
  });
  const Fixture fixture = scripted_fixture();
  const ReplayResult r = replay_fixture(
      fixture, {{&reference, Precision::kFp8, false}, {&candidate, Precision::kFp8, false}}, {{0, 1}});
  ASSERT_EQ(r.pairs.size(), 1u);
  EXPECT_EQ(r.pairs[0].label, "reference-fp8 vs cuda-fp8");
  EXPECT_TRUE(r.pairs[0].tolerance.shared_quantized_weights);
  EXPECT_FALSE(r.passed());
  ASSERT_TRUE(r.first_divergence.has_value());
  EXPECT_EQ(r.first_divergence->step, 1);
  EXPECT_EQ(r.first_divergence->seq, 1);
  EXPECT_EQ(r.first_divergence->stage, "L0.v");
  EXPECT_EQ(reference.calls, candidate.calls);
}

TEST(Replay, CandidateWithoutTapsFailsAtTheFirstMissingStage) {
  ScriptedProposer reference("reference-bf16", scripted_head(2));
  ScriptedProposer candidate("cuda-bf16", scripted_head(2), [](ProposeOutput* out) { out->taps.clear(); });
  const ReplayResult r = replay_fixture(
      scripted_fixture(), {{&reference, Precision::kBf16, false}, {&candidate, Precision::kBf16, false}}, {{0, 1}});
  ASSERT_TRUE(r.first_divergence.has_value());
  EXPECT_EQ(r.first_divergence->stage, "embed");
  EXPECT_EQ(r.first_divergence->criterion, "missing");
  EXPECT_EQ(r.first_divergence->step, 0);
}

TEST(Replay, BrokenProposeOutputIsAnInvariantFailure) {
  // A drafter that reports the wrong width (a head launched at gamma instead of the clamped width).
  ScriptedProposer drafter("scripted-a", scripted_head(2), [](ProposeOutput* out) { out->block_width = 7; });
  const ReplayResult r = replay_fixture(scripted_fixture(), {{&drafter, Precision::kFp64, true}}, {});
  EXPECT_FALSE(r.passed());
  ASSERT_FALSE(r.invariant_failures.empty());
  EXPECT_EQ(r.invariant_failures[0].invariant, "clamp");
  EXPECT_EQ(r.invariant_failures[0].step, 0);
  EXPECT_EQ(r.invariant_failures[0].proposer, "scripted-a");
}

TEST(Replay, RecordsEachDrafterPathPerProposeStep) {
  // A drafter whose first propose runs eager and whose later ones replay a graph.
  int proposes = 0;
  ScriptedProposer drafter("scripted-a", scripted_head(2), [&](ProposeOutput* out) {
    out->path.mode = proposes == 0 ? "eager" : "graph-replay";
    out->path.pdl = true;
  });
  const Fixture fixture = scripted_fixture();
  ReplayOptions options;
  options.on_step = [&](int done, int) { proposes = done; };
  const ReplayResult r = replay_fixture(fixture, {{&drafter, Precision::kFp64, true}}, {}, options);
  EXPECT_TRUE(r.passed());
  ASSERT_EQ(r.paths.size(), 3u);  // the release step proposes nothing
  EXPECT_EQ(r.paths[0].step, 0);
  EXPECT_EQ(r.paths[0].mode, "eager");
  EXPECT_EQ(r.paths[1].mode, "graph-replay");
  EXPECT_EQ(r.paths[2].step, 3);
  EXPECT_TRUE(r.paths[2].pdl);
  EXPECT_EQ(r.proposers[0].path_counts.at("eager"), 1);
  EXPECT_EQ(r.proposers[0].path_counts.at("graph-replay"), 2);
}

TEST(Replay, ALaunchPlanIsRecordedAndWrittenWhereTheDrafterReportsOne) {
  // Only the first propose reports a plan: the report carries it there, and no "plan" elsewhere.
  int proposes = 0;
  const std::vector<std::pair<std::string, std::string>> plan = {{"qkv", "mma e4m3, 64 columns"}, {"pdl", "on"}};
  ScriptedProposer drafter("scripted-a", scripted_head(2), [&](ProposeOutput* out) {
    if (proposes == 0) out->path.plan = plan;
  });
  ReplayOptions options;
  options.on_step = [&](int done, int) { proposes = done; };
  const ReplayResult r = replay_fixture(scripted_fixture(), {{&drafter, Precision::kFp64, true}}, {}, options);
  ASSERT_EQ(r.paths.size(), 3u);
  EXPECT_EQ(r.paths[0].plan, plan);
  EXPECT_TRUE(r.paths[1].plan.empty());
  const nlohmann::json json = replay_result_to_json(r);
  EXPECT_EQ(json["paths"][0]["plan"], nlohmann::json::parse(R"([["qkv", "mma e4m3, 64 columns"], ["pdl", "on"]])"));
  EXPECT_FALSE(json["paths"][1].contains("plan"));
}

TEST(Replay, ATappedPassThatDiffersFromTheJudgedPassIsItsOwnFinding) {
  // The judged outputs match the fixture; the drafter says its second, tapped pass computed
  // other logits: the replay fails with "taps-change-result", not with a stage divergence.
  ScriptedProposer drafter("scripted-a", scripted_head(2), [](ProposeOutput* out) {
    out->path.mode = "graph-replay";
    out->path.taps_from_second_pass = true;
    if (out->seq == 1) out->path.tap_pass_difference = "logits[0, 2]: judged pass 1, tapped pass 2";
  });
  const ReplayResult r = replay_fixture(scripted_fixture(), {{&drafter, Precision::kFp64, true}}, {});
  EXPECT_FALSE(r.passed());
  EXPECT_FALSE(r.first_divergence.has_value());
  ASSERT_EQ(r.invariant_failures.size(), 2u);  // sequence 1 in steps 1 and 3
  EXPECT_EQ(r.invariant_failures[0].invariant, "taps-change-result");
  EXPECT_EQ(r.invariant_failures[0].step, 1);
  EXPECT_NE(r.invariant_failures[0].detail.find("sequence 1"), std::string::npos);
  EXPECT_NE(r.invariant_failures[0].detail.find("logits[0, 2]"), std::string::npos);
  EXPECT_TRUE(r.paths[0].taps_from_second_pass);
}

TEST(Replay, StopsAfterTheRequestedStep) {
  ScriptedProposer drafter("scripted-a", scripted_head(2));
  ReplayOptions options;
  options.last_step = 1;
  const ReplayResult r = replay_fixture(scripted_fixture(), {{&drafter, Precision::kFp64, true}}, {}, options);
  EXPECT_EQ(r.steps_run, 2);
  EXPECT_EQ(r.sequences.size(), 3u);
}

TEST(Replay, WidthsClampingDifferentlyInOneProposeAreRefusedNamingTheStep) {
  Fixture fixture = scripted_fixture();
  fixture.steps[1].propose[1].block_width = 3;  // 4 and 3 in one batched call
  ScriptedProposer drafter("scripted-a", scripted_head(2));
  const std::string message =
      testing::harness_error_message([&] { replay_fixture(fixture, {{&drafter, Precision::kFp64, true}}, {}); });
  testing::expect_mentions(message, "step 1");
  testing::expect_mentions(message, "sequence 1");
}

TEST(Replay, DrafterErrorsComeBackWithFixtureAndStep) {
  Fixture fixture = scripted_fixture();
  // No new rows but a start of 9 where sequence 1's next context position is 3: a gap the
  // drafter refuses.
  fixture.steps[3].propose[0].ctx = Tensor::zeros({0, 4});
  fixture.steps[3].propose[0].start = 9;
  ScriptedProposer drafter("scripted-a", scripted_head(2));
  testing::expect_mentions(
      testing::harness_error_message([&] { replay_fixture(fixture, {{&drafter, Precision::kFp64, true}}, {}); }),
      "fixture 'scripted', step 3");
}

}  // namespace
}  // namespace dflash
