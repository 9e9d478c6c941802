// `dflash-harness replay` end to end: the bundled oracle fixtures, the engine-style captures (clean
// pass, planted fail naming their stage), single corrupted expectations, the malformed-input table,
// the CUDA backend in a CPU build, and usage errors.
#include <algorithm>
#include <filesystem>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/cli/fixture_surgery.h"
#include "tests/cli/harness_runner.h"
#include "tests/io/malformed_cases.h"

namespace dflash::cli_test {
namespace {

namespace fs = std::filesystem;

const std::string kOracleDir = std::string(DFLASH_SOURCE_DIR) + "/fixtures/oracle";
const std::string kCapturesDir = std::string(DFLASH_SOURCE_DIR) + "/fixtures/captures";

std::vector<std::string> fixture_dirs(const std::string& parent) {
  std::vector<std::string> dirs;
  for (const auto& entry : fs::directory_iterator(parent)) {
    if (entry.is_directory() && fs::exists(entry.path() / "fixture.json")) dirs.push_back(entry.path().string());
  }
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

TEST(ReplayCli, EveryBundledOracleFixturePassesOnTheReference) {
  const std::vector<std::string> dirs = fixture_dirs(kOracleDir);
  ASSERT_GE(dirs.size(), 8u) << "the bundled oracle fixtures are missing from " << kOracleDir;
  for (const std::string& dir : dirs) {
    const RunResult r = run_harness({"replay", dir});
    EXPECT_EQ(r.exit_code, 0) << dir << "\n" << r.output;
    EXPECT_NE(r.output.find("PASS"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("fixture(fp64) vs reference-fp64"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("drafter reference-fp64"), std::string::npos) << "levers missing:\n" << r.output;
  }
  // All at once, too: one table, one exit code.
  std::vector<std::string> args = {"replay"};
  args.insert(args.end(), dirs.begin(), dirs.end());
  EXPECT_EQ(run_harness(args).exit_code, 0);
}

bool ends_with(const std::string& text, const std::string& end) {
  return text.size() >= end.size() && text.compare(text.size() - end.size(), end.size(), end) == 0;
}

// The number of lines of `text` that contain `needle`.
int lines_with(const std::string& text, const std::string& needle) {
  int count = 0;
  size_t begin = 0;
  while (begin < text.size()) {
    const size_t end = std::min(text.find('\n', begin), text.size());
    if (text.substr(begin, end - begin).find(needle) != std::string::npos) ++count;
    begin = end + 1;
  }
  return count;
}

TEST(ReplayCli, APassIsOneLineAndTheSettingsPrintOncePerRun) {
  const std::vector<std::string> dirs = fixture_dirs(kOracleDir);
  std::vector<std::string> args = {"replay"};
  args.insert(args.end(), dirs.begin(), dirs.end());
  const RunResult plain = run_harness(args);
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  // Settings once, each fixture one line, nothing else: header, rule, the drafter's line, the count.
  EXPECT_EQ(lines_with(plain.output, "drafter reference-fp64 (fp64)"), 1) << plain.output;
  EXPECT_EQ(lines_with(plain.output, "PASS"), static_cast<int>(dirs.size())) << plain.output;
  size_t newlines = 0;
  for (char c : plain.output) newlines += c == '\n';
  EXPECT_EQ(newlines, dirs.size() + 4) << plain.output;
  EXPECT_TRUE(ends_with(plain.out, "\n" + std::to_string(dirs.size()) + " pass, 0 fail, 0 could not run\n"))
      << plain.out;
  EXPECT_EQ(plain.output.find("compute_type"), std::string::npos) << plain.output;

  args.insert(args.begin() + 1, "-v");
  const RunResult verbose = run_harness(args);
  ASSERT_EQ(verbose.exit_code, 0) << verbose.output;
  EXPECT_EQ(lines_with(verbose.output, "drafter reference-fp64 (fp64):"), 1) << verbose.output;
  EXPECT_EQ(lines_with(verbose.output, "  compute_type: "), 1) << verbose.output;
  EXPECT_EQ(lines_with(verbose.output, "  simd_target: "), 1) << verbose.output;
  // One line per setting, also where the fixtures differ (gamma, ctx_cap: each fixture's value).
  EXPECT_EQ(lines_with(verbose.output, "  gamma: "), 1) << verbose.output;
  EXPECT_EQ(lines_with(verbose.output, "  ctx_cap: "), 1) << verbose.output;
  EXPECT_EQ(lines_with(verbose.output, "PASS"), static_cast<int>(dirs.size())) << verbose.output;
}

TEST(ReplayCli, CleanBf16CapturesPass) {
  const std::vector<std::string> dirs = fixture_dirs(kCapturesDir + "/bf16");
  ASSERT_EQ(dirs.size(), 3u) << "the bundled bf16 captures are missing from " << kCapturesDir;
  for (const std::string& dir : dirs) {
    const RunResult r = run_harness({"replay", dir});
    EXPECT_EQ(r.exit_code, 0) << dir << "\n" << r.output;
    EXPECT_NE(r.output.find("fixture(bf16) vs reference-fp64"), std::string::npos) << r.output;
  }
}

TEST(ReplayCli, PlantedCapturesFailNamingTheirFirstStage) {
  const std::vector<std::string> dirs = fixture_dirs(kCapturesDir + "/planted");
  ASSERT_EQ(dirs.size(), 2u) << "the bundled planted captures are missing from " << kCapturesDir;
  for (const std::string& dir : dirs) {
    const nlohmann::json expect = nlohmann::json::parse(read_file(dir + ".expect.json"));
    const std::string stage = expect.at("first_stage").get<std::string>();
    const int step = expect.at("first_step").is_null() ? 0 : expect.at("first_step").get<int>();
    const RunResult r = run_harness({"replay", dir});
    EXPECT_EQ(r.exit_code, 1) << dir << "\n" << r.output;
    const std::string named = "step " + std::to_string(step) + ", sequence 0: first divergence at " + stage + " ";
    EXPECT_NE(r.output.find(named), std::string::npos) << "expected '" << named << "' in:\n" << r.output;
  }
}

// A copy of the bundled tiny-gqa fixture with one tensor of its trace rewritten.
std::string corrupted(const std::string& name, const std::string& tensor,
                      const std::function<void(std::vector<float>&)>& edit_f32,
                      const std::function<void(std::vector<int32_t>&)>& edit_i32 = {}) {
  const std::string dir = scratch_dir(name) + "/tiny-gqa";
  copy_fixture(kOracleDir + "/tiny-gqa", dir);
  edit_trace_tensor(dir, tensor, edit_f32, edit_i32);
  return dir;
}

TEST(ReplayCli, OneCorruptedLogitFailsNamingStepSequenceAndStage) {
  // Logits of step 2 are [7, 500]; element (1, 5) moves by 0.5, far past 1e-6 of the row's max.
  const std::string dir = corrupted("logit", "s2.q0.logits", [](std::vector<float>& v) { v[1 * 500 + 5] += 0.5f; });
  const RunResult r = run_harness({"replay", dir});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("step 2, sequence 0: first divergence at logits, row 1, column 5"), std::string::npos)
      << r.output;
}

TEST(ReplayCli, OneCorruptedDraftTokenFailsNamingStepSequenceAndStage) {
  const std::string dir = corrupted("draft", "s3.q0.drafts", {}, [](std::vector<int32_t>& v) { v[2] = (v[2] + 17) % 500; });
  const RunResult r = run_harness({"replay", dir});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("step 3, sequence 0: first divergence at draft_tokens"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("row 2"), std::string::npos) << r.output;
}

TEST(ReplayCli, OneCorruptedTapFailsNamingStepSequenceAndStage) {
  // L1.attn of step 4 is [8, 96]; element (0, 3) moves by 0.25.
  const std::string dir = corrupted("tap", "s4.q0.tap.L1.attn", [](std::vector<float>& v) { v[3] += 0.25f; });
  const RunResult r = run_harness({"replay", dir});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("step 4, sequence 0: first divergence at L1.attn (layer 1), row 0, column 3"),
            std::string::npos)
      << r.output;
  // A FAIL keeps its detail: the drafter's settings beside it and the stage walk up to the failure.
  EXPECT_NE(r.output.find("  drafter reference-fp64 (fp64): drafter=CPU reference"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("    L1.attn         FAIL "), std::string::npos) << r.output;
}

TEST(ReplayCli, EveryMalformedFixtureExitsTwoWithItsMessage) {
  const auto& cases = dflash::testing::malformed_cases();
  ASSERT_GE(cases.size(), 24u);
  const std::string work = scratch_dir("malformed");
  for (const auto& c : cases) {
    const std::string dir = c.build(work);
    const RunResult r = run_harness({"replay", dir});
    EXPECT_EQ(r.exit_code, 2) << c.name << "\n" << r.output;
    EXPECT_NE(r.output.find("error: "), std::string::npos) << c.name << "\n" << r.output;
    EXPECT_NE(r.output.find(c.expected), std::string::npos)
        << c.name << ": expected '" << c.expected << "' in:\n" << r.output;
  }
}

TEST(ReplayCli, BadFixturesNeverStopARun) {
  // Every malformed case, then a good fixture, in one run: each bad one is its own error in the
  // JSON report naming its directory and its own row of the table, and the good one still runs
  // and passes.
  const auto& cases = dflash::testing::malformed_cases();
  const std::string work = scratch_dir("malformed-run");
  const std::string json_path = scratch_dir("malformed-run-out") + "/report.json";
  std::vector<std::string> args = {"replay", "--json", json_path};
  for (const auto& c : cases) args.push_back(c.build(work));
  args.push_back(kOracleDir + "/tiny-mha");
  const RunResult r = run_harness(args);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  const nlohmann::json doc = nlohmann::json::parse(read_file(json_path));
  ASSERT_EQ(doc["results"].size(), 1u) << r.output;
  EXPECT_EQ(doc["results"][0]["verdict"], "pass");
  ASSERT_EQ(doc["errors"].size(), cases.size()) << r.output;
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(doc["errors"][i]["fixture"], args[3 + i]);
    EXPECT_EQ(doc["errors"][i]["exit_code"], 2);
    EXPECT_NE(doc["errors"][i]["error"].get<std::string>().find(cases[i].expected), std::string::npos)
        << cases[i].name << ": " << doc["errors"][i]["error"];
  }
  EXPECT_EQ(lines_with(r.out, "  could not run: "), static_cast<int>(cases.size())) << r.out;
  EXPECT_TRUE(ends_with(r.out, "\n1 pass, 0 fail, " + std::to_string(cases.size()) + " could not run\n")) << r.out;
}

TEST(ReplayCli, AnUnreadableFixtureGetsItsRowTheCountLineAndTheHtml) {
  // The bundled oracle fixtures and one path that is no fixture: every fixture has its row, the
  // run ends with the count, exits 2 (bad input), and the JSON and HTML reports are written.
  const std::vector<std::string> dirs = fixture_dirs(kOracleDir);
  const std::string out = scratch_dir("out");
  const std::string missing = kOracleDir + "/tiny-gq";
  std::vector<std::string> args = {"replay", "--json", out + "/r.json", "--html", out + "/r.html", dirs[0], missing};
  args.insert(args.end(), dirs.begin() + 1, dirs.end());
  const RunResult r = run_harness(args);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(ends_with(r.out, "\n" + std::to_string(dirs.size()) + " pass, 0 fail, 1 could not run\n")) << r.out;
  EXPECT_EQ(lines_with(r.out, "PASS"), static_cast<int>(dirs.size())) << r.out;
  EXPECT_EQ(lines_with(r.out, missing + "  "), 1) << r.out;
  EXPECT_NE(r.out.find("could not run: no such file or directory: " + missing + "; did you mean " + kOracleDir +
                       "/tiny-gqa?\n"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.err, "error: no such file or directory: " + missing + "; did you mean " + kOracleDir + "/tiny-gqa?\n");
  const std::string html = read_file(out + "/r.html");
  EXPECT_NE(html.find("<tr class=\"could-not-run\"><td>" + missing + "</td>"), std::string::npos) << html;
  EXPECT_NE(html.find(std::to_string(dirs.size()) + " pass, 0 fail, 1 could not run"), std::string::npos);
  const nlohmann::json doc = nlohmann::json::parse(read_file(out + "/r.json"));
  EXPECT_EQ(doc["errors"].size(), 1u);
  EXPECT_EQ(doc["results"].size(), dirs.size());
}

TEST(ReplayCli, TheTableNamesTheFirstDivergingStageNotTheWorst) {
  // Step 2 of tiny-gqa: L0.q a little off, L1.mlp (later in forward order) far off.
  const std::string dir = scratch_dir("two-faults") + "/tiny-gqa";
  copy_fixture(kOracleDir + "/tiny-gqa", dir);
  edit_trace_tensor(dir, "s2.q0.tap.L0.q", [](std::vector<float>& v) { v[5] += 0.01f; });
  edit_trace_tensor(dir, "s2.q0.tap.L1.mlp", [](std::vector<float>& v) { v[9] += 1000.0f; });
  const RunResult r = run_harness({"replay", dir});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const size_t row = r.out.find("tiny-gqa  ");
  ASSERT_NE(row, std::string::npos) << r.out;
  const std::string line = r.out.substr(row, r.out.find('\n', row) - row);
  EXPECT_NE(line.find("first: L0.q "), std::string::npos) << line;
  EXPECT_NE(line.find("(step 2)"), std::string::npos) << line;
  EXPECT_EQ(line.find("L1.mlp"), std::string::npos) << line;
}

TEST(ReplayCli, CudaBackendInACpuBuildCannotRunHere) {
#if DFLASH_HAVE_CUDA
  GTEST_SKIP() << "this build has the CUDA drafter; exit 125 is for builds without it";
#else
  for (const char* backend : {"cuda", "both"}) {
    const RunResult r = run_harness({"replay", "--backend", backend, kOracleDir + "/tiny-mha"});
    EXPECT_EQ(r.exit_code, 125) << r.output;
    EXPECT_NE(r.output.find("built without the CUDA drafter"), std::string::npos) << r.output;
  }
#endif
}

// w8a8 runs on the reference and on the CUDA drafter: where the CUDA one cannot run, the refusal
// names the build or the missing device, never the precision.
TEST(ReplayCli, W8a8RunsOnTheReferenceAndOnCuda) {
  const RunResult ok = run_harness({"replay", "--precision", "w8a8", kOracleDir + "/tiny-mha"});
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_NE(ok.out.find("fp64/w8a8"), std::string::npos) << ok.out;
  for (const char* backend : {"cuda", "both"}) {
    const RunResult r = run_harness({"replay", "--backend", backend, "--precision", "w8a8", kOracleDir + "/tiny-mha"});
    if (r.exit_code == 0) {  // a GPU ran it
      EXPECT_NE(r.out.find("cuda-w8a8"), std::string::npos) << r.out;
      continue;
    }
    EXPECT_EQ(r.exit_code, 125) << r.output;
    EXPECT_TRUE(r.output.find("built without the CUDA drafter") != std::string::npos ||
                r.output.find("no CUDA device") != std::string::npos)
        << r.output;
  }
}

TEST(ReplayCli, UsageErrorsExitTwoAndHelpExitsZero) {
  EXPECT_EQ(run_harness({}).exit_code, 2);
  EXPECT_EQ(run_harness({"frobnicate"}).exit_code, 2);
  EXPECT_EQ(run_harness({"replay"}).exit_code, 2);  // no fixture
  EXPECT_EQ(run_harness({"replay", "--backend", "tpu", kOracleDir + "/tiny-mha"}).exit_code, 2);
  EXPECT_EQ(run_harness({"replay", "--precision", "fp16", kOracleDir + "/tiny-mha"}).exit_code, 2);
  EXPECT_EQ(run_harness({"replay", "--no-such-flag", kOracleDir + "/tiny-mha"}).exit_code, 2);
  const RunResult missing = run_harness({"replay", scratch_dir("empty") + "/nothing-here"});
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_NE(missing.output.find("nothing-here"), std::string::npos) << missing.output;
  const RunResult help = run_harness({"--help"});
  EXPECT_EQ(help.exit_code, 0);
  for (const char* command : {"replay", "bisect", "make-fixture", "inspect", "report"}) {
    EXPECT_NE(help.output.find(command), std::string::npos) << help.output;
    const RunResult sub = run_harness({command, "--help"});
    EXPECT_EQ(sub.exit_code, 0) << command << "\n" << sub.output;
    EXPECT_NE(sub.output.find("Usage"), std::string::npos) << sub.output;
  }
}

TEST(ReplayCli, JsonReportIsWrittenAndFailingFixturesAreNamedInIt) {
  const std::string dir = corrupted("json", "s1.q0.tap.L0.q", [](std::vector<float>& v) { v[10] = -v[10] - 1.0f; });
  const std::string json_path = scratch_dir("out") + "/report.json";
  const RunResult r = run_harness({"replay", "--json", json_path, dir, kOracleDir + "/tiny-mha"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const nlohmann::json doc = nlohmann::json::parse(read_file(json_path));
  ASSERT_EQ(doc["results"].size(), 2u);
  EXPECT_EQ(doc["results"][0]["verdict"], "fail");
  EXPECT_EQ(doc["results"][0]["first_divergence"]["stage"], "L0.q");
  EXPECT_EQ(doc["results"][0]["first_divergence"]["step"], 1);
  EXPECT_EQ(doc["results"][1]["verdict"], "pass");
}

// The NVFP4 fixture on the reference (fp64 and bf16, the w4a16 emulation): its provenance reaches
// the JSON report as the fixture wrote it, and each proposer names the head's format.
TEST(ReplayCli, Nvfp4FixturePassesWithItsProvenanceAndHeadFormatInTheReport) {
  const std::string fixture = kOracleDir + "/nvfp4-tiny-gqa";
  const nlohmann::json manifest = nlohmann::json::parse(read_file(fixture + "/fixture.json"));
  for (const char* precision : {"fp64", "bf16"}) {
    SCOPED_TRACE(precision);
    const std::string json_path = scratch_dir(std::string("nvfp4-") + precision) + "/report.json";
    const RunResult r = run_harness({"replay", "--precision", precision, "--json", json_path, fixture});
    EXPECT_EQ(r.exit_code, 0) << r.output;
    const nlohmann::json doc = nlohmann::json::parse(read_file(json_path));
    ASSERT_EQ(doc["results"].size(), 1u);
    const nlohmann::json& result = doc["results"][0];
    EXPECT_EQ(result["verdict"], "pass");
    EXPECT_EQ(result["provenance"], manifest["provenance"]);
    EXPECT_EQ(result["provenance"]["lm_head_format"], "nvfp4");
    EXPECT_EQ(result["provenance"]["source_fixture"], "tiny-gqa");
    bool named = false;
    for (const auto& lever : result["proposers"][0]["levers"]) named = named || (lever[0] == "lm_head_format" && lever[1] == "nvfp4");
    EXPECT_TRUE(named) << result["proposers"][0]["levers"].dump();
  }
}

}  // namespace
}  // namespace dflash::cli_test
