// Report documents across runs and versions: the tally of a run (count line, exit code), the
// shards of a run merged back into the unsharded document, the refusals of shards that are not
// one run's, and version 1 documents still read.
#include <fstream>
#include <functional>

#include <gtest/gtest.h>

#include "compare/replay.h"
#include "compare/report_html.h"
#include "compare/report_json.h"
#include "compare/report_merge.h"
#include "compare/run_tally.h"
#include "tests/compare/scripted_proposer.h"
#include "tests/support/harness_error.h"

namespace dflash {
namespace {

using namespace testing_support;
using nlohmann::json;

// `steps` proposes of one sequence with the scripted expectations; `broken` corrupts L0.q of the last.
ReplayResult scripted_result(const std::string& name, int steps, bool broken) {
  const Fixture f = scripted_fixture(name, steps, [&](int step, ExpectedOutputs& x) {
    if (broken && step == steps - 1) x.taps[1].value.row(0)[1] += 1.0f;
  });
  ScriptedProposer drafter("reference-fp64", f.head);
  return replay_fixture(f, {{&drafter, Precision::kFp64, true}}, {});
}

FixtureOutcome ran(const std::string& path, const ReplayResult& result) {
  FixtureOutcome o;
  o.path = path;
  o.result = result;
  return o;
}

FixtureOutcome failed_to_run(const std::string& path, int exit_code) {
  FixtureOutcome o;
  o.path = path;
  o.error = "no such file or directory: " + path;
  o.exit_code = exit_code;
  return o;
}

const std::vector<std::string> kFixtures = {"set/clean", "set/broken", "set/missing", "set/clean-2"};

// The four fixtures' outcomes: pass, fail, could not run (bad input), pass.
std::vector<FixtureOutcome> outcomes() {
  return {ran(kFixtures[0], scripted_result("clean", 2, false)), ran(kFixtures[1], scripted_result("broken", 2, true)),
          failed_to_run(kFixtures[2], 2), ran(kFixtures[3], scripted_result("clean-2", 1, false))};
}

ReportRun run_of(int shard, int shards) { return {"reference", "fp64", kFixtures, shard, shards}; }

// The document of `shard` of `shards` holding the fixtures at `indices`.
json shard_document(int shard, int shards, const std::vector<size_t>& indices) {
  const std::vector<FixtureOutcome> all = outcomes();
  std::vector<FixtureOutcome> mine;
  for (size_t i : indices) mine.push_back(all[i]);
  return make_report_document(run_of(shard, shards), mine, indices);
}

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "/" + ::testing::UnitTest::GetInstance()->current_test_info()->name() + "-" + name;
}

// Written and read back, as `report` reads it.
json round_trip(const json& doc, const std::string& name) {
  const std::string path = temp_path(name);
  write_report_document(path, doc);
  return read_report_document(path);
}

std::string merge_refusal(const std::vector<json>& docs, const std::vector<std::string>& names) {
  return testing::harness_error_message([&] { merge_reports(docs, names); });
}

TEST(RunTally, CountsVerdictsAndRanksExitCodes) {
  const auto doc = [](std::vector<std::string> verdicts, std::vector<int> codes) {
    json results = json::array(), errors = json::array();
    for (const std::string& v : verdicts) results.push_back({{"verdict", v}});
    for (int c : codes) errors.push_back({{"exit_code", c}});
    return json{{"results", results}, {"errors", errors}};
  };
  EXPECT_EQ(tally_reports({doc({"pass", "pass"}, {})}).exit_code, 0);
  EXPECT_EQ(tally_reports({doc({"pass", "fail"}, {})}).exit_code, 1);
  EXPECT_EQ(tally_reports({doc({"fail"}, {125})}).exit_code, 125);
  EXPECT_EQ(tally_reports({doc({"fail"}, {125, 2})}).exit_code, 2);
  EXPECT_EQ(tally_reports({doc({}, {2}), doc({"pass"}, {3})}).exit_code, 3);
  const RunTally t = tally_reports({doc({"pass", "fail", "pass"}, {2}), doc({"pass"}, {})});
  EXPECT_EQ(count_line(t), "3 pass, 1 fail, 1 could not run");
}

TEST(ReportDocument, Version2NamesTheRunAndEachFixturesPlaceInIt) {
  const json doc = round_trip(make_report_document(run_of(0, 0), outcomes(), {0, 1, 2, 3}), "full.json");
  EXPECT_EQ(doc["version"], 2);
  EXPECT_EQ(doc["run"]["backend"], "reference");
  EXPECT_EQ(doc["run"]["precision"], "fp64");
  EXPECT_EQ(doc["run"]["fixtures"], json(kFixtures));
  EXPECT_TRUE(doc["run"]["shard"].is_null());
  ASSERT_EQ(doc["results"].size(), 3u);
  EXPECT_EQ(doc["results"][1]["path"], "set/broken");
  EXPECT_EQ(doc["results"][1]["index"], 1);
  EXPECT_EQ(doc["results"][1]["pairs"][0]["first_divergence"]["stage"], "L0.q");
  EXPECT_TRUE(doc["results"][0]["pairs"][0]["first_divergence"].is_null());
  // The distances and acceptance of the same version: no target side, one temperature.
  EXPECT_EQ(doc["results"][0]["temperatures"], json({1.0}));
  EXPECT_TRUE(doc["results"][0]["acceptance"].is_null());
  EXPECT_TRUE(doc["results"][0]["pairs"][0].contains("distribution"));
  ASSERT_EQ(doc["errors"].size(), 1u);
  EXPECT_EQ(doc["errors"][0]["index"], 2);
  EXPECT_EQ(doc["errors"][0]["exit_code"], 2);
  const RunTally t = tally_reports({doc});
  EXPECT_EQ(count_line(t), "2 pass, 1 fail, 1 could not run");
  EXPECT_EQ(t.exit_code, 2);
}

TEST(ReportDocument, Version1IsStillReadRenderedAndTallied) {
  json v1 = make_report_document(run_of(0, 0), outcomes(), {0, 1, 2, 3});
  v1["version"] = 1;
  v1.erase("run");
  for (json& r : v1["results"]) {
    r.erase("index");
    r.erase("path");
    r.erase("temperatures");
    r.erase("acceptance");
    for (json& pair : r["pairs"]) {
      pair.erase("first_divergence");
      pair.erase("distribution");
    }
  }
  for (json& e : v1["errors"]) e.erase("index");
  const json doc = round_trip(v1, "v1.json");
  EXPECT_EQ(count_line(tally_reports({doc})), "2 pass, 1 fail, 1 could not run");
  EXPECT_EQ(merge_reports({doc}, {"v1.json"}).size(), 1u);
  const std::string html = render_html_report({doc});
  EXPECT_NE(html.find("<tr class=\"could-not-run\"><td>set/missing</td>"), std::string::npos) << html;
  EXPECT_NE(html.find("worst: "), std::string::npos) << html;
}

void expect_refused(const json& doc, const std::string& needle) {
  const std::string path = temp_path("refused.json");
  write_report_document(path, doc);
  const std::string message = testing::harness_error_message([&] { read_report_document(path); });
  testing::expect_mentions(message, needle);
  testing::expect_mentions(message, path);
}

TEST(ReportDocument, RefusesWhatItCannotTrust) {
  const json good = make_report_document(run_of(0, 0), outcomes(), {0, 1, 2, 3});
  json v0 = good;
  v0["version"] = 0;
  expect_refused(v0, "report version 0 does not exist");
  json no_run = good;
  no_run.erase("run");
  expect_refused(no_run, "missing field 'run'");
  json lying = good;
  lying["results"][1]["verdict"] = "pass";
  expect_refused(lying, "results[1] (broken): field 'verdict' is 'pass', but its sequences, invariant failures, distances and acceptance say 'fail'");
  json past = good;
  past["results"][0]["index"] = 9;
  expect_refused(past, "results[0]: field 'index' is 9, past the run's 4 fixtures");
  json moved = good;
  moved["results"][0]["path"] = "elsewhere";
  expect_refused(moved, "results[0]: field 'path' is \"elsewhere\", but run.fixtures[0] is \"set/clean\"");
  json code = good;
  code["errors"][0]["exit_code"] = 7;
  expect_refused(code, "errors[0]: field 'exit_code' is 7, not 2, 3 or 125");
  json shard = good;
  shard["run"]["shard"] = {{"index", 4}, {"count", 3}};
  expect_refused(shard, "shard 4/3 is not one of");
}

TEST(MergeReports, ThreeShardsGiveTheUnshardedDocumentTallyAndExitCode) {
  const json full = round_trip(make_report_document(run_of(0, 0), outcomes(), {0, 1, 2, 3}), "full.json");
  // Shard 2 holds the failing fixture and the one that could not run; given out of order.
  const std::vector<json> shards = {round_trip(shard_document(2, 3, {1, 2}), "s2.json"),
                                    round_trip(shard_document(1, 3, {0}), "s1.json"),
                                    round_trip(shard_document(3, 3, {3}), "s3.json")};
  const std::vector<json> merged = merge_reports(shards, {"s2.json", "s1.json", "s3.json"});
  ASSERT_EQ(merged.size(), 1u);
  EXPECT_EQ(merged[0]["results"], full["results"]);
  EXPECT_EQ(merged[0]["errors"], full["errors"]);
  EXPECT_EQ(merged[0]["run"], full["run"]);
  EXPECT_EQ(merged[0], full);
  const RunTally a = tally_reports(merged), b = tally_reports({full});
  EXPECT_EQ(count_line(a), count_line(b));
  EXPECT_EQ(a.exit_code, b.exit_code);
  EXPECT_EQ(a.exit_code, 2);
  // Documents that are not shards are shown side by side, as they are.
  EXPECT_EQ(merge_reports({full, full}, {"a.json", "b.json"}).size(), 2u);
}

TEST(MergeReports, ShardsGivenTheFixturesInAnotherOrderMergeInTheFirstDocumentsOrder) {
  const json full = make_report_document(run_of(0, 0), outcomes(), {0, 1, 2, 3});
  // Shard 2 was given the fixtures in reverse order: its indices point into its own list.
  const std::vector<std::string> reversed(kFixtures.rbegin(), kFixtures.rend());
  const std::vector<FixtureOutcome> all = outcomes();
  const json s2 = make_report_document({"reference", "fp64", reversed, 2, 3}, {all[1], all[2]}, {2, 1});
  const std::vector<json> merged =
      merge_reports({shard_document(1, 3, {0}), s2, shard_document(3, 3, {3})}, {"a.json", "b.json", "c.json"});
  ASSERT_EQ(merged.size(), 1u);
  EXPECT_EQ(merged[0], full);
}

TEST(MergeReports, RefusesShardsThatAreNotOneRunByName) {
  const json s1 = shard_document(1, 3, {0}), s2 = shard_document(2, 3, {1, 2}), s3 = shard_document(3, 3, {3});
  testing::expect_mentions(merge_refusal({s1, s2}, {"a.json", "b.json"}), "shard 3/3 is missing; given: 1 (a.json), 2 (b.json)");
  testing::expect_mentions(merge_refusal({s1, s2, s2, s3}, {"a.json", "b.json", "c.json", "d.json"}),
                           "b.json and c.json are both shard 2/3");
  testing::expect_mentions(merge_refusal({s1, shard_document(2, 2, {1, 2, 3})}, {"a.json", "b.json"}),
                           "b.json is shard 2/2, a.json is shard 1/3: different shard counts");
  json fp32 = s2;
  fp32["run"]["precision"] = "fp32";
  testing::expect_mentions(merge_refusal({s1, fp32, s3}, {"a.json", "b.json", "c.json"}),
                           "b.json ran --backend reference --precision fp32, a.json ran --backend reference --precision fp64");
  json other = s3;
  other["run"]["fixtures"][3] = "set/other";
  testing::expect_mentions(merge_refusal({s1, s2, other}, {"a.json", "b.json", "c.json"}),
                           "c.json was run over other fixtures than a.json (set/other is in c.json only)");
  const json whole = make_report_document(run_of(0, 0), outcomes(), {0, 1, 2, 3});
  testing::expect_mentions(merge_refusal({s1, whole}, {"a.json", "w.json"}),
                           "w.json is not a shard, but a.json is shard 1/3");
  testing::expect_mentions(merge_refusal({s1, shard_document(2, 3, {0, 1, 2}), s3}, {"a.json", "b.json", "c.json"}),
                           "fixture set/clean is in both a.json and b.json");
  testing::expect_mentions(merge_refusal({s1, s2, shard_document(3, 3, {})}, {"a.json", "b.json", "c.json"}),
                           "fixture set/clean-2 of the run is in none of the 3 shards");
}

}  // namespace
}  // namespace dflash
