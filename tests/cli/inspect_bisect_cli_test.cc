// `dflash-harness inspect` and `bisect`.
#include <gtest/gtest.h>

#include "tests/cli/fixture_surgery.h"
#include "tests/cli/harness_runner.h"

namespace dflash::cli_test {
namespace {

const std::string kOracleDir = std::string(DFLASH_SOURCE_DIR) + "/fixtures/oracle";

TEST(InspectCli, FixtureCheckpointAndSafetensors) {
  const RunResult fixture = run_harness({"inspect", kOracleDir + "/tiny-gqa"});
  EXPECT_EQ(fixture.exit_code, 0) << fixture.output;
  EXPECT_NE(fixture.output.find("geometry: H 96, layers 2, heads 6/2, head_dim 16"), std::string::npos) << fixture.output;
  EXPECT_NE(fixture.output.find("steps: 6"), std::string::npos) << fixture.output;
  EXPECT_NE(fixture.output.find("layers.0.self_attn.q_proj.weight  BF16 [96, 96]"), std::string::npos)
      << fixture.output;
  const RunResult checkpoint = run_harness({"inspect", kOracleDir + "/tiny-gqa/drafter"});
  EXPECT_EQ(checkpoint.exit_code, 0) << checkpoint.output;
  EXPECT_NE(checkpoint.output.find("fc.weight  BF16 [96, 288]"), std::string::npos) << checkpoint.output;
  const RunResult trace = run_harness({"inspect", kOracleDir + "/tiny-gqa/trace.safetensors"});
  EXPECT_EQ(trace.exit_code, 0) << trace.output;
  EXPECT_NE(trace.output.find("s0.q0.logits  F32 [7, 500]"), std::string::npos) << trace.output;
  EXPECT_EQ(run_harness({"inspect", kOracleDir + "/README.md"}).exit_code, 2);
}

TEST(BisectCli, NamesTheStageOfACorruptedTapAndPassesClean) {
  const std::string dir = scratch_dir("work") + "/tiny-gqa";
  copy_fixture(kOracleDir + "/tiny-gqa", dir);
  edit_trace_tensor(dir, "s2.q0.tap.L1.k", [](std::vector<float>& v) { v[40] += 1.0f; });
  const RunResult bad = run_harness({"bisect", dir, "--step", "2", "--seq", "0"});
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_NE(bad.output.find("step 2, sequence 0: first divergence at L1.k (layer 1), row 1, column 8"),
            std::string::npos)
      << bad.output;
  const RunResult clean = run_harness({"bisect", dir, "--step", "1", "--seq", "0"});
  EXPECT_EQ(clean.exit_code, 0) << clean.output;
  EXPECT_NE(clean.output.find("every stage within its bound"), std::string::npos) << clean.output;
  const RunResult later = run_harness({"bisect", dir, "--step", "3", "--seq", "0"});
  EXPECT_EQ(later.exit_code, 0) << later.output;
  EXPECT_NE(later.output.find("an earlier step already diverges"), std::string::npos) << later.output;
}

TEST(BisectCli, StepsAndSequencesOutsideTheFixtureExitTwo) {
  const RunResult step = run_harness({"bisect", kOracleDir + "/tiny-gqa", "--step", "99", "--seq", "0"});
  EXPECT_EQ(step.exit_code, 2) << step.output;
  EXPECT_NE(step.output.find("--step 99"), std::string::npos) << step.output;
  const RunResult seq = run_harness({"bisect", kOracleDir + "/batch-widths-release", "--step", "1", "--seq", "2"});
  EXPECT_EQ(seq.exit_code, 2) << seq.output;
  EXPECT_NE(seq.output.find("sequence(s) 0, 1"), std::string::npos) << seq.output;
  const RunResult release = run_harness({"bisect", kOracleDir + "/batch-widths-release", "--step", "3", "--seq", "1"});
  EXPECT_EQ(release.exit_code, 2) << release.output;
  EXPECT_EQ(run_harness({"bisect", kOracleDir + "/tiny-gqa", "--step", "1"}).exit_code, 2);  // no --seq
}

}  // namespace
}  // namespace dflash::cli_test
