// The table, JSON and HTML writers on a replay with one planted fault, and the report reader's
// refusals.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "tests/support/harness_error.h"
#include "compare/replay.h"
#include "compare/report_html.h"
#include "compare/report_json.h"
#include "compare/report_table.h"
#include "compare/text_format.h"
#include "core/error.h"
#include "tests/compare/scripted_proposer.h"

namespace dflash {
namespace {

using namespace testing_support;


// Two proposes, the second's L0.q corrupted in the fixture.
ReplayResult failing_result() {
  const Fixture f = scripted_fixture("planted", 2, [](int step, ExpectedOutputs& x) {
    if (step == 1) x.taps[1].value.row(0)[2] = -7.0f;
  });
  ScriptedProposer drafter("reference-fp64", f.head);
  return replay_fixture(f, {{&drafter, Precision::kFp64, true}}, {});
}

FixtureOutcome ran(const ReplayResult& result, const std::string& path) {
  FixtureOutcome outcome;
  outcome.path = path;
  outcome.result = result;
  return outcome;
}

FixtureOutcome could_not_run(const std::string& path, const std::string& why, int exit_code) {
  FixtureOutcome outcome;
  outcome.path = path;
  outcome.error = why;
  outcome.exit_code = exit_code;
  return outcome;
}

ReportRun run_of(const std::vector<std::string>& fixtures) { return {"reference", "fp64", fixtures, 0, 0}; }

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "/" + ::testing::UnitTest::GetInstance()->current_test_info()->name() + "-" + name;
}

TEST(Report, APassingFixtureIsOneTableLine) {
  const Fixture f = scripted_fixture("clean", 1);
  ScriptedProposer a("reference-fp64", f.head), b("reference-bf16", f.head);
  const ReplayResult pass = replay_fixture(f, {{&a, Precision::kFp64, true}, {&b, Precision::kBf16, true}}, {{0, 1}});
  ASSERT_TRUE(pass.passed());
  ASSERT_GE(pass.pairs.size(), 2u);
  std::ostringstream out;
  print_replay_table(out, {ran(pass, "clean"), ran(failing_result(), "planted")});
  const std::string text = out.str();
  // Header, rule, the passing fixture's one line (its comparisons joined), the failing one's line.
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 4) << text;
  EXPECT_NE(text.find(pass.pairs[0].label + "; " + pass.pairs[1].label), std::string::npos) << text;
  std::ostringstream settings;
  print_drafter_settings(settings, {ran(pass, "clean"), ran(failing_result(), "planted")}, false);
  EXPECT_EQ(settings.str(), "drafter reference-fp64 (fp64) (-v lists its settings)\n"
                            "drafter reference-bf16 (bf16) (-v lists its settings)\n");
  std::ostringstream full;
  print_drafter_settings(full, {ran(pass, "clean"), ran(failing_result(), "planted")}, true);
  EXPECT_NE(full.str().find("drafter reference-fp64 (fp64):\n  rule: scripted\n"), std::string::npos) << full.str();
}

TEST(Report, TableNamesTheVerdictAndTheFirstDivergence) {
  const ReplayResult r = failing_result();
  std::ostringstream out;
  print_replay_table(out, {ran(r, "planted")});
  print_result_report(out, r);
  const std::string text = out.str();
  EXPECT_NE(text.find("planted"), std::string::npos) << text;
  EXPECT_NE(text.find("FAIL"), std::string::npos) << text;
  EXPECT_NE(text.find("step 1, sequence 0: first divergence at L0.q (layer 0), row 0, column 2"), std::string::npos)
      << text;
  EXPECT_NE(text.find("rule=scripted"), std::string::npos) << text;  // the drafter's levers
  EXPECT_NE(text.find("bf16/fp64"), std::string::npos) << text;
}

TEST(Report, TableShowsTheFirstDivergenceNotTheWorstStage) {
  // Step 1: L0.q a little over its bound, L0.v (later in forward order) far over it.
  const Fixture f = scripted_fixture("two-faults", 2, [](int step, ExpectedOutputs& x) {
    if (step != 1) return;
    x.taps[1].value.row(0)[2] += 0.5f;
    x.taps[2].value.row(1)[1] += 100.0f;
  });
  ScriptedProposer drafter("reference-fp64", f.head);
  const ReplayResult r = replay_fixture(f, {{&drafter, Precision::kFp64, true}}, {});
  const PairTotals totals = pair_totals(r, 0);
  ASSERT_EQ(totals.worst_stage, "L0.v");  // what the table used to show
  ASSERT_TRUE(totals.first_divergence.has_value());
  EXPECT_EQ(totals.first_divergence->stage, "L0.q");
  std::ostringstream out;
  print_replay_table(out, {ran(r, "two-faults")});
  EXPECT_NE(out.str().find("first: L0.q "), std::string::npos) << out.str();
  EXPECT_NE(out.str().find(" (step 1)"), std::string::npos) << out.str();
  EXPECT_EQ(out.str().find("L0.v"), std::string::npos) << out.str();
}

TEST(Report, TheFirstDivergenceIsTheEarliestStepBeforeForwardOrder) {
  // Step 0 fails at L0.v, step 1 at L0.q (earlier in forward order): step 0 comes first.
  const Fixture f = scripted_fixture("two-steps", 2, [](int step, ExpectedOutputs& x) {
    if (step == 0) x.taps[2].value.row(0)[0] += 1.0f;
    if (step == 1) x.taps[1].value.row(0)[0] += 1.0f;
  });
  ScriptedProposer drafter("reference-fp64", f.head);
  const ReplayResult r = replay_fixture(f, {{&drafter, Precision::kFp64, true}}, {});
  ASSERT_TRUE(r.first_divergence.has_value());
  EXPECT_EQ(r.first_divergence->stage, "L0.v");
  EXPECT_EQ(r.first_divergence->step, 0);
  std::ostringstream out;
  print_replay_table(out, {ran(r, "two-steps")});
  EXPECT_NE(out.str().find("first: L0.v "), std::string::npos) << out.str();
  EXPECT_NE(out.str().find(" (step 0)"), std::string::npos) << out.str();
}

TEST(Report, AFixtureThatCouldNotRunHasItsTableRow) {
  const Fixture f = scripted_fixture("clean", 1);
  ScriptedProposer drafter("reference-fp64", f.head);
  const ReplayResult pass = replay_fixture(f, {{&drafter, Precision::kFp64, true}}, {});
  std::ostringstream out;
  print_replay_table(out, {could_not_run("missing/x", "no such file or directory: missing/x", 2), ran(pass, "clean")});
  const std::string text = out.str();
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 4) << text;  // header, rule, two rows
  const size_t row = text.find("missing/x ");
  ASSERT_NE(row, std::string::npos) << text;
  EXPECT_LT(row, text.find("clean")) << "rows keep the order the fixtures were given:\n" << text;
  EXPECT_NE(text.find("could not run: no such file or directory: missing/x\n"), std::string::npos) << text;
}

TEST(Report, BisectReportWalksEveryStageOfOneSequence) {
  const ReplayResult r = failing_result();
  std::ostringstream out;
  EXPECT_TRUE(print_bisect_report(out, r, 1, 0));
  EXPECT_NE(out.str().find("L0.v"), std::string::npos);  // after the failing stage too
  std::ostringstream none;
  EXPECT_FALSE(print_bisect_report(none, r, 1, 5));
}

TEST(Report, JsonRoundTripAndHtmlHighlightsTheFailingStage) {
  const ReplayResult r = failing_result();
  const nlohmann::json result = replay_result_to_json(r);
  EXPECT_EQ(result["verdict"], "fail");
  EXPECT_EQ(result["first_divergence"]["stage"], "L0.q");
  EXPECT_EQ(result["first_divergence"]["step"], 1);
  EXPECT_EQ(result["pairs"][0]["stages"].size(), 4u);
  const std::string path = temp_path("report.json");
  write_report_document(path, make_report_document(run_of({"planted", "broken"}),
                                                   {ran(r, "planted"), could_not_run("broken", "bad file", 2)}, {0, 1}));
  const nlohmann::json doc = read_report_document(path);
  const std::string html = render_html_report({doc});
  EXPECT_NE(html.find("<svg"), std::string::npos);
  EXPECT_NE(html.find("class=\"bar fail first-divergence\" data-stage=\"L0.q\""), std::string::npos);
  EXPECT_NE(html.find("class=\"bar pass\" data-stage=\"embed\""), std::string::npos);
  EXPECT_NE(html.find("first divergence: L0.q"), std::string::npos);
  // The heat map: one cell per (step, stage); L0.q fails at step 1 only, a stage never compared is grey.
  EXPECT_NE(html.find("<svg class=\"heat-map\""), std::string::npos) << html;
  EXPECT_NE(html.find("class=\"cell fail\" data-step=\"1\" data-stage=\"L0.q\""), std::string::npos) << html;
  EXPECT_NE(html.find("class=\"cell pass\" data-step=\"0\" data-stage=\"L0.q\""), std::string::npos) << html;
  EXPECT_NE(html.find("class=\"cell pass\" data-step=\"1\" data-stage=\"embed\""), std::string::npos) << html;
  EXPECT_NE(html.find("class=\"cell none\" data-step=\"0\" data-stage=\"L0.mlp\""), std::string::npos) << html;
  EXPECT_EQ(html.find("class=\"cell fail\" data-step=\"0\""), std::string::npos) << html;
  // The fixture that could not run is a row of the summary, after the one given before it.
  const size_t error_row = html.find("<tr class=\"could-not-run\"><td>broken</td>");
  ASSERT_NE(error_row, std::string::npos) << html;
  EXPECT_LT(html.find("<tr class=\"fail\"><td><a href=\"#fixture-0\">planted</a>"), error_row) << html;
  EXPECT_NE(html.find("bad file (exit 2)</td><td>could not run</td>"), std::string::npos) << html;
  EXPECT_NE(html.find("<p id=\"totals\">0 pass, 1 fail, 1 could not run</p>"), std::string::npos) << html;
  EXPECT_NE(html.find("first divergence: L0.q (step 1)"), std::string::npos) << html;
  EXPECT_EQ(html.find("http://"), html.find("http://www.w3.org/2000/svg"));  // no external resources
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("src="), std::string::npos);
}

void expect_refused(const std::string& text, const std::string& needle) {
  const std::string path = temp_path("bad.json");
  std::ofstream(path) << text;
  const std::string message = testing::harness_error_message([&] { read_report_document(path); });
  testing::expect_mentions(message, needle);
  testing::expect_mentions(message, path);
}

TEST(Report, ReaderRefusesMalformedDocumentsNamingTheField) {
  expect_refused("not json", "not valid JSON");
  expect_refused(R"({"format": "other", "version": 1, "results": [], "errors": []})", "format");
  expect_refused(R"({"format": "dflash-harness-report", "version": 9, "results": [], "errors": []})", "version 9");
  expect_refused(R"({"format": "dflash-harness-report", "version": 1, "errors": []})", "'results'");
  expect_refused(R"({"format": "dflash-harness-report", "version": 1, "results": [{"fixture": "x"}], "errors": []})",
                 "results[0]: missing field 'verdict'");
}

TEST(Report, NumbersAndFixtureLabels) {
  EXPECT_EQ(format_number(0.000123456), "0.000123");
  EXPECT_EQ(format_number(1.0 / 0.0), "inf");
  EXPECT_EQ(format_number(-1.0 / 0.0), "-inf");
  EXPECT_EQ(format_number(0.0 / 0.0), "nan");
  EXPECT_EQ(fixture_label("tiny-gqa", "/c/planted/tiny-gqa.q-half-ktile"), "tiny-gqa (tiny-gqa.q-half-ktile)");
  EXPECT_EQ(fixture_label("tiny-gqa", "/c/bf16/tiny-gqa/"), "tiny-gqa");
  EXPECT_EQ(fixture_label("scripted", ""), "scripted");
}

TEST(Report, HtmlEscapesText) { EXPECT_EQ(html_escape("<a href=\"x\">&'"), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"); }

}  // namespace
}  // namespace dflash
