// `dflash-harness make-fixture`: a synthetic fixture replays clean; the same seed writes the same
// bytes; a different seed does not.
#include <filesystem>

#include <gtest/gtest.h>

#include "tests/cli/harness_runner.h"

namespace dflash::cli_test {
namespace {

namespace fs = std::filesystem;

const std::vector<std::string> kFiles = {"fixture.json", "trace.safetensors", "target.safetensors",
                                         "drafter/config.json", "drafter/model.safetensors"};

RunResult make(const std::string& dir, const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"make-fixture", dir};
  args.insert(args.end(), extra.begin(), extra.end());
  return run_harness(args);
}

TEST(MakeFixtureCli, RoundTripReplaysClean) {
  const std::string dir = scratch_dir("gqa");
  const RunResult made = make(dir, {"--seed", "7", "--geometry", "tiny-gqa", "--steps", "7", "--sequences", "3",
                                    "--widths", "3,8,20,1", "--max-batch", "2"});
  ASSERT_EQ(made.exit_code, 0) << made.output;
  EXPECT_NE(made.output.find("seed 7"), std::string::npos) << made.output;
  for (const std::string& f : kFiles) EXPECT_TRUE(fs::exists(dir + "/" + f)) << f;
  const RunResult replay = run_harness({"replay", dir});
  EXPECT_EQ(replay.exit_code, 0) << replay.output;
  const RunResult inspect = run_harness({"inspect", dir});
  EXPECT_EQ(inspect.exit_code, 0) << inspect.output;
  EXPECT_NE(inspect.output.find("release"), std::string::npos) << "no sequence left:\n" << inspect.output;
}

TEST(MakeFixtureCli, SameSeedSameBytesOtherSeedOtherBytes) {
  const std::vector<std::string> options = {"--seed", "11", "--geometry", "tiny-mha", "--steps", "4"};
  const std::string a = scratch_dir("a"), b = scratch_dir("b"), c = scratch_dir("c");
  ASSERT_EQ(make(a, options).exit_code, 0);
  ASSERT_EQ(make(b, options).exit_code, 0);
  ASSERT_EQ(make(c, {"--seed", "12", "--geometry", "tiny-mha", "--steps", "4"}).exit_code, 0);
  for (const std::string& f : kFiles) {
    const std::string bytes = read_file(a + "/" + f);
    ASSERT_FALSE(bytes.empty()) << f;
    EXPECT_EQ(bytes, read_file(b + "/" + f)) << f << " differs between two runs with the same seed";
  }
  EXPECT_NE(read_file(a + "/drafter/model.safetensors"), read_file(c + "/drafter/model.safetensors"));
  EXPECT_NE(read_file(a + "/trace.safetensors"), read_file(c + "/trace.safetensors"));
}

TEST(MakeFixtureCli, Bf16ExpectationsOfOtherGeometriesPassTheBf16Model) {
  // Expectations from the reference emulating a bf16 engine, replayed by the fp64 reference: the
  // bf16-engine bound must hold on geometries beyond the captures (bias, MQA, YaRN, a small window).
  for (const char* geometry : {"tiny-mqa-bias", "tiny-yarn"}) {
    const std::string dir = scratch_dir(geometry);
    const RunResult made = make(dir, {"--seed", "3", "--geometry", geometry, "--expect-precision", "bf16",
                                      "--ctx-cap", "24", "--page-size", "8", "--steps", "5"});
    ASSERT_EQ(made.exit_code, 0) << made.output;
    const RunResult replay = run_harness({"replay", dir});
    EXPECT_EQ(replay.exit_code, 0) << geometry << "\n" << replay.output;
    EXPECT_NE(replay.output.find("fixture(bf16) vs reference-fp64"), std::string::npos) << replay.output;
  }
}

TEST(MakeFixtureCli, ContextRowsMakeOneFixedBatch) {
  const std::string dir = scratch_dir("rows");
  const RunResult made = make(dir, {"--geometry", "tiny-gqa", "--context-rows", "3,0,2/9,1", "--without-taps"});
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const RunResult inspect = run_harness({"inspect", dir});
  ASSERT_EQ(inspect.exit_code, 0) << inspect.output;
  EXPECT_NE(inspect.output.find("[seq 0, 3 rows, start 3, width 8] [seq 1, 9 rows, start 9, width 8]"), std::string::npos)
      << inspect.output;
  EXPECT_NE(inspect.output.find("step 2: propose [seq 0, 2 rows, start 5, width 8]\n"), std::string::npos)
      << inspect.output;
  EXPECT_NE(inspect.output.find("taps 0"), std::string::npos) << inspect.output;
  EXPECT_EQ(run_harness({"replay", dir}).exit_code, 0);
  for (const char* bad : {"3,,2", "0,1", "3,x", "3,", "1/1/1"}) {
    const RunResult refused = make(scratch_dir("bad"), {"--context-rows", bad});
    EXPECT_EQ(refused.exit_code, 2) << bad << "\n" << refused.output;
    EXPECT_NE(refused.output.find("--context-rows"), std::string::npos) << refused.output;
  }
}

TEST(MakeFixtureCli, ScriptMakesItsTraceAndRefusesBadStepsByName) {
  const std::string dir = scratch_dir("script");
  const RunResult made = make(dir, {"--geometry", "tiny-gqa", "--max-batch", "2", "--without-taps", "--script",
                                    "8:0+3; 4:1+5,0+1; r:0; 8:2+2,1+0"});
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const RunResult inspect = run_harness({"inspect", dir});
  ASSERT_EQ(inspect.exit_code, 0) << inspect.output;
  EXPECT_NE(inspect.output.find("step 1: propose [seq 1, 5 rows, start 5, width 4] [seq 0, 1 rows, start 4, width 4]"),
            std::string::npos)
      << inspect.output;
  EXPECT_NE(inspect.output.find("step 2: release 0"), std::string::npos) << inspect.output;
  EXPECT_NE(inspect.output.find("step 3: propose [seq 2, 2 rows, start 2, width 8] [seq 1, 0 rows, start 5, width 8]"),
            std::string::npos)
      << inspect.output;
  EXPECT_EQ(run_harness({"replay", dir}).exit_code, 0);
  // Syntax, a sequence that joins empty, one that comes back, twice in a batch, too many at once.
  for (const char* bad : {"8:0+3;;", "8:0", "x:0+1", "8:0+0", "8:0+1; r:0; 8:0+1", "8:0+1,0+2", "8:0+1,1+1,2+1",
                          "r:3"}) {
    const RunResult refused = make(scratch_dir("bad"), {"--max-batch", "2", "--script", bad});
    EXPECT_EQ(refused.exit_code, 2) << bad << "\n" << refused.output;
    EXPECT_NE(refused.output.find("--script"), std::string::npos) << bad << "\n" << refused.output;
    EXPECT_NE(refused.output.find("step"), std::string::npos) << bad << "\n" << refused.output;
  }
}

TEST(MakeFixtureCli, BadOptionsExitTwo) {
  EXPECT_EQ(make(scratch_dir("x"), {"--geometry", "tiny-moe"}).exit_code, 2);
  const RunResult steps = make(scratch_dir("y"), {"--steps", "0"});
  EXPECT_EQ(steps.exit_code, 2) << steps.output;
  EXPECT_NE(steps.output.find("--steps"), std::string::npos) << steps.output;
}

}  // namespace
}  // namespace dflash::cli_test
