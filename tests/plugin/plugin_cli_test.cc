// Drafter plugins through `dflash-harness replay` (docs/plugin.md): the example plugin (the CPU
// reference behind the ABI) passes every oracle fixture isolated and in-process; each fault it can
// plant is reported with its stage or its signal and never stops the run; ABI mismatches are refused
// by name; a plugin without capabilities has its missing checks listed as not run.
#include <algorithm>
#include <chrono>
#include <filesystem>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/cli/harness_runner.h"

namespace dflash::cli_test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kOracleDir = std::string(DFLASH_SOURCE_DIR) + "/fixtures/oracle";
const std::string kExample = std::string("plugin:") + DFLASH_EXAMPLE_PLUGIN;
const std::string kMinimal = std::string("plugin:") + DFLASH_MINIMAL_PLUGIN;

std::vector<std::string> oracle_fixtures() {
  std::vector<std::string> dirs;
  for (const auto& entry : fs::directory_iterator(kOracleDir)) {
    if (entry.is_directory() && fs::exists(entry.path() / "fixture.json")) dirs.push_back(entry.path().string());
  }
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

struct Replay {
  RunResult run;
  json report;
};

// replay FIXTURES --json, with `extra` arguments.
Replay replay(const std::vector<std::string>& fixtures, const std::vector<std::string>& extra, const std::string& name) {
  const std::string json_path = scratch_dir(name) + "/report.json";
  std::vector<std::string> args = {"replay"};
  args.insert(args.end(), fixtures.begin(), fixtures.end());
  args.insert(args.end(), extra.begin(), extra.end());
  args.insert(args.end(), {"--json", json_path});
  Replay r{run_harness(args), json()};
  const std::string text = read_file(json_path);
  if (!text.empty()) r.report = json::parse(text);
  return r;
}

bool has_line_containing(const json& lines, const std::string& needle) {
  for (const json& line : lines) {
    if (line.get<std::string>().find(needle) != std::string::npos) return true;
  }
  return false;
}

TEST(PluginCli, EveryOracleFixturePassesThroughTheExamplePluginIsolatedAndInProcess) {
  const std::vector<std::string> fixtures = oracle_fixtures();
  ASSERT_GE(fixtures.size(), 8u);
  for (const char* mode : {"--isolate", "--no-isolate"}) {
    const Replay r = replay(fixtures, {"--backend", kExample, mode}, std::string("oracle") + mode);
    EXPECT_EQ(r.run.exit_code, 0) << mode << "\n" << r.run.output;
    ASSERT_EQ(r.report["results"].size(), fixtures.size()) << r.run.output;
    for (const json& result : r.report["results"]) {
      EXPECT_EQ(result["verdict"], "pass") << mode << " " << result["fixture"];
      const json& p = result["proposers"][0];
      EXPECT_EQ(p["name"], "plugin:reference-example-fp64");
      // --isolate runs it in a child process, --no-isolate in the harness's own.
      bool isolated = false;
      for (const json& lever : p["levers"]) isolated = isolated || lever[0] == "isolated";
      EXPECT_EQ(isolated, std::string(mode) == "--isolate") << mode << " " << p["levers"].dump();
      // The stage taps were compared (the example gives them): a worst stage besides the logits.
      bool tapped = false;
      for (const json& seq : result["sequences"]) tapped = tapped || seq["stages"].size() > 1;
      EXPECT_TRUE(tapped) << result["fixture"];
      // What the ABI cannot show is listed, not passed.
      EXPECT_TRUE(has_line_containing(p["checks_not_run"], "cache-slot invariants 1-4")) << p.dump();
      EXPECT_FALSE(has_line_containing(p["checks_not_run"], "kv-stored")) << "the example reads K/V back";
    }
    EXPECT_NE(r.run.output.find("not run: window, cache-slot invariants 1-4"), std::string::npos) << r.run.output;
  }
}

TEST(PluginCli, BesideTheReferenceThePluginIsComparedWithIt) {
  const Replay r = replay({kOracleDir + "/tiny-gqa"}, {"--backend", "reference," + kExample}, "beside");
  EXPECT_EQ(r.run.exit_code, 0) << r.run.output;
  ASSERT_EQ(r.report["results"].size(), 1u);
  const json& pairs = r.report["results"][0]["pairs"];
  ASSERT_EQ(pairs.size(), 2u) << pairs.dump();
  EXPECT_NE(pairs[1]["label"].get<std::string>().find("reference-fp64 vs plugin:reference-example-fp64"), std::string::npos)
      << pairs[1]["label"];
}

// w8a8 reaches the plugin (DFLASH_PRECISION_W8A8; the example computes it with the reference), and
// beside the reference it is held to the reference emulating w8a8 (the tight pair, quantized
// activations on both sides) and to the bf16 reference (the w8a8 envelope).
TEST(PluginCli, W8a8BesideTheReferenceGetsTheTightPairAndTheEnvelope) {
  const Replay r = replay({kOracleDir + "/tiny-gqa"}, {"--backend", "reference," + kExample, "--precision", "w8a8"}, "w8a8");
  EXPECT_EQ(r.run.exit_code, 0) << r.run.output;
  ASSERT_EQ(r.report["results"].size(), 1u);
  const json& pairs = r.report["results"][0]["pairs"];
  ASSERT_EQ(pairs.size(), 3u) << pairs.dump();
  EXPECT_EQ(pairs[1]["label"], "reference-w8a8 vs plugin:reference-example-w8a8");
  EXPECT_EQ(pairs[1]["same_rounding_points"], true);
  EXPECT_EQ(pairs[1]["actual_model"]["quantized_activations"], true);
  EXPECT_EQ(pairs[2]["label"], "reference-bf16 vs plugin:reference-example-w8a8");
  EXPECT_EQ(pairs[2]["same_rounding_points"], false);
  EXPECT_EQ(pairs[2]["expected_model"]["quantized_activations"], false);
  EXPECT_EQ(pairs[2]["actual_model"]["quantized_activations"], true);
}

// ABI version 2's tensor-parallel fields reach the plugin: the example runs the reference's TP = 2
// emulation, so beside the reference at TP = 2 every rank's partial is compared, and a fault in the
// query heads is named with the ranks that own them.
TEST(PluginCli, AtTp2ThePluginRunsTwoRanksAndItsDivergenceNamesThem) {
  for (const char* mode : {"--isolate", "--no-isolate"}) {
    const Replay r = replay({kOracleDir + "/tiny-gqa"},
                            {"--backend", "reference," + kExample, "--tp", "2", "--precision", "bf16", mode},
                            std::string("tp2") + mode);
    EXPECT_EQ(r.run.exit_code, 0) << mode << "\n" << r.run.output;
    ASSERT_EQ(r.report["results"].size(), 1u) << r.run.output;
    const json& result = r.report["results"][0];
    const json& pairs = result["pairs"];
    ASSERT_EQ(pairs.size(), 2u) << pairs.dump();
    EXPECT_EQ(pairs[1]["label"], "reference-bf16 vs plugin:reference-example-bf16");
    bool partial = false;
    for (const json& seq : result["sequences"]) {
      for (const json& stage : seq["stages"]) partial = partial || stage["stage"] == "L0.o_proj.partial@r1";
    }
    EXPECT_TRUE(partial) << "rank 1's partial compared (the bf16 pair rounds at the same points)";
  }
  const Replay rope = replay({kOracleDir + "/tiny-gqa"},
                             {"--backend", "reference," + kExample, "--tp", "2", "--plugin-option", "fault=rope-sign"},
                             "tp2-rope");
  EXPECT_EQ(rope.run.exit_code, 1) << rope.run.output;
  const json& first = rope.report["results"][0]["first_divergence"];
  EXPECT_EQ(first["stage"], "L0.q") << first.dump();
  EXPECT_NE(first["ranks"].get<std::string>().find("rank 1 (query heads 3..5, columns 48..95)"), std::string::npos)
      << first.dump();
}

// A plugin that cannot run the ranks asked for would run one and pass as TP = N: refused by name,
// whether it lacks the capability (the minimal plugin) or predates the fields (ABI version 1, still
// read at TP = 1).
TEST(PluginCli, TpIsRefusedForAPluginWithoutTheCapabilityOrOfVersion1) {
  const std::string v1 = "plugin:" + std::string(DFLASH_ABI_VARIANT_DIR) + "/libdflash_abi_variant_6.so";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {kMinimal, "does not announce DFLASH_CAP_TENSOR_PARALLEL"},
      {v1, "implements drafter plugin ABI version 1, which has no tensor-parallel fields"}};
  for (const auto& [plugin, words] : cases) {
    for (const char* mode : {"--isolate", "--no-isolate"}) {
      const RunResult r = run_harness({"replay", kOracleDir + "/tiny-gqa", "--backend", plugin, "--tp", "2", mode});
      EXPECT_EQ(r.exit_code, 125) << plugin << " " << mode << "\n" << r.output;  // unsupported (docs/cli.md)
      EXPECT_NE(r.output.find(words), std::string::npos) << plugin << " " << mode << "\n" << r.output;
    }
  }
  // Version 1 at TP = 1: loaded and run (its constant logits fail the fixture at the logits).
  const Replay r = replay({kOracleDir + "/tiny-gqa"}, {"--backend", v1}, "v1");
  EXPECT_EQ(r.run.exit_code, 1) << r.run.output;
  ASSERT_EQ(r.report["results"].size(), 1u) << r.run.output;
  EXPECT_EQ(r.report["results"][0]["first_divergence"]["stage"], "logits");
  const json& levers = r.report["results"][0]["proposers"][0]["levers"];
  EXPECT_NE(levers.dump().find("[\"abi\",\"1\"]"), std::string::npos) << "the version it implements: " << levers.dump();
}

TEST(PluginCli, RopeSignIsCaughtAtTheFirstQueryStage) {
  const Replay r = replay({kOracleDir + "/tiny-gqa"}, {"--backend", kExample, "--plugin-option", "fault=rope-sign"}, "rope");
  EXPECT_EQ(r.run.exit_code, 1) << r.run.output;
  const json& first = r.report["results"][0]["first_divergence"];
  EXPECT_EQ(first["stage"], "L0.q") << first.dump();
  EXPECT_EQ(first["step"], 0);
}

TEST(PluginCli, BisectWalksThePluginsStagesAgainstTheReference) {
  const RunResult r = run_harness({"bisect", kOracleDir + "/tiny-gqa", "--step", "0", "--seq", "0", "--backend",
                                   "reference," + kExample, "--plugin-option", "fault=rope-sign"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("first divergence at L0.q (layer 0)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[reference-fp64 vs plugin:reference-example-fp64]"), std::string::npos) << r.output;
  const RunResult clean = run_harness({"bisect", kOracleDir + "/tiny-gqa", "--step", "0", "--seq", "0", "--backend",
                                       "reference," + kExample});
  EXPECT_EQ(clean.exit_code, 0) << clean.output;
}

TEST(PluginCli, NanAtStep2IsCaughtInTheLogitsOfStep2) {
  const Replay r = replay({kOracleDir + "/tiny-gqa"}, {"--backend", kExample, "--plugin-option", "fault=nan-at-step-2"}, "nan");
  EXPECT_EQ(r.run.exit_code, 1) << r.run.output;
  const json& first = r.report["results"][0]["first_divergence"];
  EXPECT_EQ(first["stage"], "logits") << first.dump();
  EXPECT_EQ(first["step"], 2) << first.dump();
}

// AddressSanitizer catches the segfault itself and aborts (ci/sanitize sets abort_on_error=1).
#if defined(__SANITIZE_ADDRESS__)
const std::string kSegfaultSignal = "SIGABRT";
#else
const std::string kSegfaultSignal = "SIGSEGV";
#endif

TEST(PluginCli, ASegfaultFailsItsFixtureAndTheRunGoesOn) {
  // Two fixtures: the plugin crashes in the second propose of each; both are reported, with the
  // signal, the step and the call.
  const Replay r = replay({kOracleDir + "/tiny-gqa", kOracleDir + "/yarn"},
                          {"--backend", kExample, "--plugin-option", "fault=segfault-at-step-1"}, "segv");
  EXPECT_EQ(r.run.exit_code, 1) << r.run.output;
  ASSERT_EQ(r.report["results"].size(), 2u) << r.run.output;
  for (const json& result : r.report["results"]) {
    EXPECT_EQ(result["verdict"], "fail");
    const json& fault = result["drafter_fault"];
    EXPECT_EQ(fault["event"], "plugin crashed: " + kSegfaultSignal) << fault.dump();
    EXPECT_EQ(fault["step"], 1);
    EXPECT_EQ(fault["during"], "propose of sequences [0]");
  }
  EXPECT_NE(r.run.output.find("plugin crashed: " + kSegfaultSignal + " during step 1, propose of sequences [0]"),
            std::string::npos)
      << r.run.output;
  EXPECT_NE(r.run.output.find("0 pass, 2 fail, 0 could not run"), std::string::npos) << r.run.output;
}

TEST(PluginCli, AHangIsKilledAtTheTimeout) {
  const auto start = std::chrono::steady_clock::now();
  const Replay r = replay({kOracleDir + "/tiny-gqa", kOracleDir + "/yarn"},
                          {"--backend", kExample, "--plugin-option", "fault=hang", "--plugin-timeout", "1"}, "hang");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.run.exit_code, 1) << r.run.output;
  ASSERT_EQ(r.report["results"].size(), 2u) << r.run.output;
  EXPECT_EQ(r.report["results"][1]["drafter_fault"]["event"], "plugin hung: no answer in 1 s (killed)");
  EXPECT_LT(seconds, 30.0) << "two hangs of a 1 s timeout";
}

TEST(PluginCli, ABadPluginOptionIsTheCreatesErrorVerbatim) {
  for (const char* mode : {"--isolate", "--no-isolate"}) {
    const Replay r = replay({kOracleDir + "/tiny-gqa"}, {"--backend", kExample, "--plugin-option", "fault=typo", mode}, "opt");
    EXPECT_EQ(r.run.exit_code, 2) << r.run.output;
    EXPECT_NE(r.run.output.find("plugin option fault=typo: expected rope-sign"), std::string::npos) << r.run.output;
  }
  const RunResult r = run_harness({"replay", kOracleDir + "/tiny-gqa", "--backend", kExample, "--plugin-option", "novalue"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--plugin-option 'novalue': expected KEY=VALUE"), std::string::npos) << r.output;
}

TEST(PluginCli, AbiMismatchesAreRefusedByName) {
  const std::string dir = DFLASH_ABI_VARIANT_DIR;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"1", "implements drafter plugin ABI version 3, the harness reads versions 1 and 2"},
      {"2", "table is 24 bytes, version 2's is"},
      {"3", "dflash_drafter_get_api(2) returned NULL"},
      {"4", "announces a capability whose entry point is NULL"},
      {"5", "exports no dflash_drafter_get_api (the harness speaks drafter plugin ABI version 2"},
      {"7", "announces capability bits ABI version 1 does not define"},
  };
  for (const auto& [variant, words] : cases) {
    for (const char* mode : {"--isolate", "--no-isolate"}) {
      const std::string plugin = "plugin:" + dir + "/libdflash_abi_variant_" + variant + ".so";
      const RunResult r = run_harness({"replay", kOracleDir + "/tiny-gqa", "--backend", plugin, mode});
      EXPECT_EQ(r.exit_code, 2) << variant << " " << mode << "\n" << r.output;
      EXPECT_NE(r.err.find("error: plugin " + dir), std::string::npos) << r.err;
      EXPECT_NE(r.err.find(words), std::string::npos) << variant << ": " << r.err;
    }
  }
  const RunResult missing = run_harness({"replay", kOracleDir + "/tiny-gqa", "--backend", "plugin:/no/such/plugin.so"});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.err.find("cannot be loaded"), std::string::npos) << missing.err;
}

// A plugin that announces bf16 attention partials has that rounding counted on its side of every
// bound (docs/tolerances.md §4); the minimal plugin, which does not, has not.
TEST(PluginCli, AnnouncedBf16AttentionPartialsReachTheToleranceModel) {
  const std::string announcing = "plugin:" + std::string(DFLASH_ABI_VARIANT_DIR) + "/libdflash_abi_variant_8.so";
  for (const char* mode : {"--isolate", "--no-isolate"}) {
    for (const auto& [plugin, announced] : {std::pair{announcing, true}, std::pair{kMinimal, false}}) {
      const Replay r = replay({kOracleDir + "/tiny-gqa"}, {"--backend", plugin, mode}, announced ? "partials" : "no-partials");
      EXPECT_EQ(r.run.exit_code, 1) << "the minimal plugin's constant logits fail\n" << r.run.output;
      ASSERT_FALSE(r.report.is_null()) << r.run.output;
      const json& pair = r.report["results"][0]["pairs"][0];
      EXPECT_EQ(pair["actual_model"]["bf16_attention_partials"], announced) << mode << " " << pair.dump();
      EXPECT_EQ(pair["expected_model"]["bf16_attention_partials"], false) << pair.dump();
    }
  }
}

TEST(PluginCli, APluginWithoutCapabilitiesHasItsMissingChecksListedAsNotRun) {
  // The minimal plugin's constant logits are wrong, so the fixture fails on the logits; no stage is
  // compared and the checks it cannot serve are listed.
  const Replay r = replay({kOracleDir + "/tiny-gqa"}, {"--backend", kMinimal}, "minimal");
  EXPECT_EQ(r.run.exit_code, 1) << r.run.output;
  const json& result = r.report["results"][0];
  EXPECT_EQ(result["first_divergence"]["stage"], "logits") << result["first_divergence"].dump();
  for (const json& seq : result["sequences"]) EXPECT_EQ(seq["stages"].size(), 1u) << "only the logits";
  const json& not_run = result["proposers"][0]["checks_not_run"];
  EXPECT_TRUE(has_line_containing(not_run, "stage taps: none given")) << not_run.dump();
  EXPECT_TRUE(has_line_containing(not_run, "kv-stored: no K/V read-back")) << not_run.dump();
  EXPECT_TRUE(has_line_containing(not_run, "forward path")) << not_run.dump();
  EXPECT_TRUE(has_line_containing(not_run, "capabilities none")) << not_run.dump();
}

}  // namespace
}  // namespace dflash::cli_test
