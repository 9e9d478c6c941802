// What a newcomer's mistakes get: one "error:" line on stderr with the reason and a hint, and
// exit code 2.
#include <filesystem>

#include <gtest/gtest.h>

#include "tests/cli/harness_runner.h"

namespace dflash::cli_test {
namespace {

const std::string kOracleDir = std::string(DFLASH_SOURCE_DIR) + "/fixtures/oracle";

// Every line of stderr starts with "error: ", and there is one.
void expect_error_lines(const RunResult& r, const std::string& what) {
  EXPECT_FALSE(r.err.empty()) << what;
  size_t begin = 0;
  while (begin < r.err.size()) {
    const size_t end = std::min(r.err.find('\n', begin), r.err.size());
    const std::string line = r.err.substr(begin, end - begin);
    EXPECT_EQ(line.rfind("error: ", 0), 0u) << what << ": a line of stderr without 'error: ':\n" << r.err;
    begin = end + 1;
  }
}

TEST(ErrorsCli, AnUnknownCommandIsNamedWithTheNearestOne) {
  const RunResult typo = run_harness({"replya", kOracleDir + "/tiny-mha"});
  EXPECT_EQ(typo.exit_code, 2);
  EXPECT_EQ(typo.err, "error: unknown command 'replya'; did you mean 'replay'?\n");
  EXPECT_EQ(run_harness({"reprot"}).err, "error: unknown command 'reprot'; did you mean 'report'?\n");
  const RunResult far = run_harness({"frobnicate"});
  EXPECT_EQ(far.exit_code, 2);
  EXPECT_EQ(far.err, "error: unknown command 'frobnicate'; the commands are replay, bisect, make-fixture, inspect, report\n");
  const RunResult none = run_harness({});
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_NE(none.err.find("error: no command given; the commands are replay, "), std::string::npos) << none.err;
}

TEST(ErrorsCli, EveryUsageAndInputErrorIsOneErrorLine) {
  const std::string fixture = kOracleDir + "/tiny-mha";
  const std::vector<std::vector<std::string>> cases = {
      {},
      {"replya"},
      {"-x", "replay", fixture},
      {"replay"},
      {"replay", "--backend", "tpu", fixture},
      {"replay", "--precision", "fp16", fixture},
      {"replay", "--no-such-flag", fixture},
      {"replay", "--warmup", "-1", fixture},
      {"replay", "--shard", "4/3", fixture},
      {"replay", kOracleDir + "/tiny-gq"},
      {"replay", kOracleDir},
      {"bisect", fixture, "--step", "x", "--seq", "0"},
      {"bisect", fixture, "--step", "1"},
      {"make-fixture"},
      {"make-fixture", "/tmp/x", "--geometry", "nope"},
      {"inspect"},
      {"inspect", kOracleDir + "/tiny-gq"},
      {"report"},
      {"report", kOracleDir + "/none.json"},
      {"report", fixture + "/fixture.json"},
  };
  for (const auto& args : cases) {
    std::string what = "dflash-harness";
    for (const std::string& a : args) what += " " + a;
    const RunResult r = run_harness(args);
    EXPECT_EQ(r.exit_code, 2) << what << "\n" << r.output;
    expect_error_lines(r, what);
  }
}

TEST(ErrorsCli, OptionErrorsSayWhereTheOptionsAreListed) {
  const RunResult r = run_harness({"replay", "--precision", "fp4", kOracleDir + "/tiny-mha"});
  EXPECT_EQ(r.err,
            "error: --precision: fp4 not in {fp64,fp32,bf16,fp8,w8a8} (dflash-harness replay --help lists the options)\n");
  // --backend takes a list (plugins included), so its items are checked by the command, naming them.
  const RunResult b = run_harness({"replay", "--backend", "reference,tpu", kOracleDir + "/tiny-mha"});
  EXPECT_EQ(b.exit_code, 2);
  EXPECT_EQ(b.err,
            "error: --backend 'reference,tpu': 'tpu' is not one of reference, cuda, both, plugin:PATH (a comma list "
            "of them is allowed)\n");
}

TEST(ErrorsCli, APathThatIsNoFixtureGetsItsReasonAndAHint) {
  const RunResult missing = run_harness({"replay", kOracleDir + "/tiny-gq"});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_EQ(missing.err, "error: no such file or directory: " + kOracleDir + "/tiny-gq; did you mean " + kOracleDir +
                             "/tiny-gqa?\n");
  int fixtures = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kOracleDir)) {
    fixtures += std::filesystem::exists(entry.path() / "fixture.json");
  }
  const RunResult parent = run_harness({"replay", kOracleDir});
  EXPECT_EQ(parent.exit_code, 2);
  EXPECT_NE(parent.err.find("error: not a fixture directory (no fixture.json): " + kOracleDir + "; it holds " +
                            std::to_string(fixtures) + " fixture directories (batch-widths-release, ...): name them, "
                            "e.g. " + kOracleDir + "/*/"),
            std::string::npos)
      << parent.err;
  const RunResult inspect = run_harness({"inspect", kOracleDir + "/tiny-gq"});
  EXPECT_EQ(inspect.exit_code, 2);
  EXPECT_NE(inspect.err.find("error: no such file or directory: " + kOracleDir + "/tiny-gq; did you mean"),
            std::string::npos)
      << inspect.err;
  const RunResult report = run_harness({"report", kOracleDir + "/none.json"});
  EXPECT_EQ(report.err, "error: no such file or directory: " + kOracleDir + "/none.json\n");
}

}  // namespace
}  // namespace dflash::cli_test
