// The replay engine's distribution distances and acceptance on a scripted drafter, and how the
// table, the JSON (report version 2, version 1 still read) and the HTML show them.
#include <fstream>
#include <functional>
#include <sstream>

#include <gtest/gtest.h>

#include "compare/acceptance_json.h"
#include "compare/replay.h"
#include "compare/report_html.h"
#include "compare/report_json.h"
#include "compare/report_table.h"
#include "tests/compare/scripted_proposer.h"
#include "tests/support/harness_error.h"

namespace dflash {
namespace {

using namespace testing_support;

// `blocks` sequences, one propose each (anchor 1 + b % 5, so no target token is 0), then released.
// The target's tokens are the scripted drafts except where `miss(block, row)` says; the target's
// logits are the scripted logits.
Fixture target_fixture(int blocks, const std::function<bool(int, int)>& miss) {
  Fixture f;
  f.name = "scripted-acceptance";
  f.expect_precision = "fp64";
  f.config = scripted_config();
  f.head = scripted_head();
  for (int b = 0; b < blocks; ++b) {
    ProposeEntry e;
    e.seq = b;
    e.ctx = Tensor::zeros({2, 4});
    e.start = 2;
    e.anchor = 1 + b % 5;
    e.block_width = 4;
    ExpectedOutputs x;
    x.logits = scripted_logits(e.anchor, 4);
    x.draft_tokens = scripted_drafts(e.anchor, 4);
    e.expect = x;
    TargetSide t;
    t.tokens = *x.draft_tokens;
    for (int r = 0; r < 3; ++r) {
      if (miss(b, r)) t.tokens[static_cast<size_t>(r)] = (t.tokens[static_cast<size_t>(r)] + 1) % 6;
    }
    e.target = t;
    FixtureStep propose, release;
    propose.propose = {e};
    release.kind = FixtureStep::Kind::kRelease;
    release.release = {b};
    f.steps.push_back(propose);
    f.steps.push_back(release);
  }
  return f;
}

// Block 0 misses at row 1, block 1 at row 0, the other eight accept the whole block.
bool two_misses(int b, int r) { return (b == 0 && r == 1) || (b == 1 && r == 0); }

ReplayResult replay_on(const Fixture& f, const std::function<void(ProposeOutput*)>& tamper = {},
                       std::vector<double> temperatures = {}) {
  ScriptedProposer drafter("reference-fp64", f.head, tamper);
  ReplayOptions options;
  options.temperatures = std::move(temperatures);
  return replay_fixture(f, {{&drafter, Precision::kFp64, true}}, {}, options);
}

FixtureOutcome outcome_of(const ReplayResult& r) {
  FixtureOutcome outcome;
  outcome.path = "fixtures/" + r.fixture_name;
  outcome.result = r;
  return outcome;
}

// The version 2 document of one unsharded run of `r` alone.
nlohmann::json document_of(const ReplayResult& r) {
  const FixtureOutcome outcome = outcome_of(r);
  return make_report_document({"reference", "fp64", {outcome.path}, 0, 0}, {outcome}, {0});
}

TEST(ReplayDistances, MeasuredPerBlockRowAtEveryTemperature) {
  const ReplayResult r = replay_on(target_fixture(4, two_misses), {}, {0.5});
  EXPECT_EQ(r.temperatures, std::vector<double>({1.0, 0.5}));
  for (const SequenceResult& s : r.sequences) {
    ASSERT_TRUE(s.distances.has_value());
    EXPECT_EQ(s.distances->rows.size(), 6u);  // 3 block rows at 2 temperatures
    EXPECT_TRUE(s.distances->passed);
  }
  const nlohmann::json d = pair_distribution_json(r, 0);
  EXPECT_EQ(d["passed"], true);
  EXPECT_EQ(d["checks"], 4);
  ASSERT_EQ(d["positions"].size(), 6u);
  EXPECT_EQ(d["positions"][0]["block_row"], 1);
  EXPECT_EQ(d["positions"][5]["block_row"], 3);
  EXPECT_EQ(d["positions"][5]["temperature"], 0.5);
  EXPECT_EQ(d["positions"][0]["max"]["tv"], 0.0);  // the scripted drafter reproduces its rule exactly
}

// The planted control: one logit of block row 2 pushed down by 3 fails the distance bounds (and the
// logits stage, whose tail bound they derive from), and the report marks that position.
TEST(ReplayDistances, APlantedLogitFaultBreaksTheBoundsAtItsBlockRow) {
  const auto push = [](ProposeOutput* out) {
    const int32_t top = out->draft_tokens[1];
    out->logits.row(1)[top] -= 3.0f;  // 5 -> 2: still the top, with far less probability
  };
  const ReplayResult r = replay_on(target_fixture(2, two_misses), push);
  EXPECT_FALSE(r.passed());
  ASSERT_TRUE(r.sequences[0].distances.has_value());
  const DistanceCheck& c = *r.sequences[0].distances;
  EXPECT_FALSE(c.passed);
  ASSERT_TRUE(c.first_failure.has_value());
  EXPECT_EQ(c.first_failure->row, 1);
  EXPECT_GT(c.worst_ratio, 100.0);
  const nlohmann::json d = pair_distribution_json(r, 0);
  EXPECT_EQ(d["passed"], false);
  EXPECT_EQ(d["positions"][1]["passed"], false);
  EXPECT_EQ(d["positions"][0]["passed"], true);
  std::ostringstream table;
  print_replay_table(table, {outcome_of(r)});
  EXPECT_NE(table.str().find("max TV"), std::string::npos) << table.str();
  const std::string html = render_html_report({document_of(r)});
  EXPECT_NE(html.find("class=\"bar fail\" data-block-row=\"2\""), std::string::npos) << html;
  EXPECT_NE(html.find("class=\"bar pass\" data-block-row=\"1\""), std::string::npos) << html;
  // Every distance per block row, in a table beside the plot: TV, KL both ways, the top-1 gap.
  EXPECT_NE(html.find("<table class=\"distances\">"), std::string::npos) << html;
  EXPECT_NE(html.find("max KL(actual&#8214;expected)"), std::string::npos) << html;
  EXPECT_NE(html.find("max top-1 gap"), std::string::npos) << html;
}

TEST(ReplayDistances, TemperaturesAreCheckedBeforeAnythingRuns) {
  testing::expect_mentions(
      testing::harness_error_message([] { replay_on(target_fixture(1, two_misses), {}, {0.0}); }),
      "a temperature must be a finite number > 0");
}

TEST(ReplayAcceptance, GreedyRunsPerSideAndPosition) {
  const ReplayResult r = replay_on(target_fixture(10, two_misses));
  EXPECT_TRUE(r.passed());
  ASSERT_EQ(r.acceptance.sides.size(), 2u);
  for (const SideAcceptance& s : r.acceptance.sides) {
    SCOPED_TRACE(s.name);
    EXPECT_EQ(s.blocks, 10);
    EXPECT_DOUBLE_EQ(s.mean_length, (2.0 + 1.0 + 8 * 4.0) / 10);
    ASSERT_EQ(s.positions.size(), 3u);
    EXPECT_EQ(s.positions[0].reached, 9);
    EXPECT_EQ(s.positions[1].reached, 8);
    EXPECT_EQ(s.positions[1].matched, 9);  // block 1 matches at row 1 after its miss at row 0
    EXPECT_EQ(s.positions[2].reached, 8);
  }
  EXPECT_EQ(r.acceptance.sides[0].name, "fixture");
  EXPECT_EQ(r.acceptance.sides[1].name, "reference-fp64");
  // No target logits: no expected acceptance under sampling.
  EXPECT_FALSE(r.acceptance.sides[1].sampling_length.has_value());
  const nlohmann::json a = acceptance_json(r);
  EXPECT_EQ(a["comparisons"][0]["mean_length_change"], 0.0);
  std::ostringstream table;
  print_replay_table(table, {outcome_of(r)});
  EXPECT_NE(table.str().find("acceptance scripted-acceptance: fixture 3.50, per position 0.90 0.80 0.80; "
                             "reference-fp64 3.50 (+0.00), per position 0.90 0.80 0.80"),
            std::string::npos)
      << table.str();
}

TEST(ReplayAcceptance, SamplingAcceptanceFromTheTargetsLogits) {
  Fixture f = target_fixture(3, [](int, int) { return false; });
  for (FixtureStep& s : f.steps) {
    for (ProposeEntry& e : s.propose) e.target->logits = *e.expect->logits;
  }
  const ReplayResult same = replay_on(f);
  ASSERT_TRUE(same.acceptance.sides[1].sampling_length.has_value());
  EXPECT_NEAR(*same.acceptance.sides[1].sampling_length, 4.0, 1e-9);  // identical distributions: alpha = 1
  const ReplayResult moved = replay_on(f, [](ProposeOutput* out) {
    for (float& v : out->logits.values) v *= 0.5f;  // flatter: the same tokens, lower alpha
  });
  EXPECT_LT(*moved.acceptance.sides[1].sampling_length, 3.9);
  EXPECT_DOUBLE_EQ(moved.acceptance.sides[1].mean_length, 4.0);  // greedy acceptance unchanged
}

TEST(ReplayAcceptance, APinnedVectorFailsTheReplayBelowItsThreshold) {
  Fixture f = target_fixture(10, two_misses);
  f.acceptance = AcceptancePin{{1.0, 1.0, 1.0}, "test"};
  const ReplayResult r = replay_on(f);
  EXPECT_FALSE(r.passed());
  ASSERT_FALSE(r.acceptance.failures.empty());
  EXPECT_EQ(r.acceptance.failures[0].check, "pinned-acceptance");
  testing::expect_mentions(r.acceptance.failures[0].detail,
                           "reference-fp64: block position 1 accepted in 9 of 10 blocks (90.0%), below the pinned "
                           "100.0%");
  std::ostringstream report;
  print_result_report(report, r);
  testing::expect_mentions(report.str(), "pinned acceptance: reference-fp64: block position 1");
  EXPECT_EQ(acceptance_json(r)["failures"][0]["check"], "pinned-acceptance");

  f.acceptance = AcceptancePin{{0.95, 0.9, 0.9}, "what 10 blocks cannot tell from 0.9 and 0.8"};
  EXPECT_TRUE(replay_on(f).passed());
}

TEST(ReplayAcceptance, TheCanaryNamesAQuantizedDrafter) {
  const Fixture f = target_fixture(10, [](int, int) { return false; });
  const ReplayResult r = replay_on(f, [](ProposeOutput* out) {
    for (int32_t& t : out->draft_tokens) t = 0;  // decorrelated from the target: token 0 everywhere
  });
  EXPECT_FALSE(r.passed());
  bool named = false;
  for (const AcceptanceFailure& failure : r.acceptance.failures) {
    named = named || (failure.check == "canary" && failure.detail.find("quantized drafter") != std::string::npos);
  }
  EXPECT_TRUE(named);
  const std::string html = render_html_report({document_of(r)});
  EXPECT_NE(html.find("canary: acceptance collapsed (quantized drafter)"), std::string::npos) << html;
}

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "/" + ::testing::UnitTest::GetInstance()->current_test_info()->name() + "-" + name;
}

TEST(ReportVersions, Version1DocumentsAreStillReadAndVersion2FieldsAreChecked) {
  const ReplayResult r = replay_on(target_fixture(2, two_misses));
  const nlohmann::json v2 = document_of(r);
  EXPECT_EQ(v2["version"], 2);
  // A version 1 document: no run, index or path, no temperatures, acceptance or per-pair
  // distribution or first divergence.
  nlohmann::json doc = v2;
  doc["version"] = 1;
  doc.erase("run");
  nlohmann::json& v1 = doc["results"][0];
  for (const char* key : {"index", "path", "temperatures", "acceptance"}) v1.erase(key);
  for (nlohmann::json& pair : v1["pairs"]) {
    pair.erase("distribution");
    pair.erase("first_divergence");
  }
  const std::string path = temp_path("v1.json");
  write_report_document(path, doc);
  const std::string html = render_html_report({read_report_document(path)});
  EXPECT_EQ(html.find("<h3>Acceptance</h3>"), std::string::npos);
  EXPECT_EQ(html.find("class=\"distribution\""), std::string::npos);
  // The same fields missing from a version 2 document are refused by name.
  nlohmann::json no_temperatures = v2;
  no_temperatures["results"][0].erase("temperatures");
  write_report_document(path, no_temperatures);
  testing::expect_mentions(testing::harness_error_message([&] { read_report_document(path); }),
                           "results[0]: field 'temperatures' is missing or not an array");
  nlohmann::json no_distribution = v2;
  no_distribution["results"][0]["pairs"][0].erase("distribution");
  write_report_document(path, no_distribution);
  testing::expect_mentions(testing::harness_error_message([&] { read_report_document(path); }),
                           "results[0].pairs[0]: missing field 'distribution'");
  // A complete version 2 document renders both.
  write_report_document(path, v2);
  const std::string full = render_html_report({read_report_document(path)});
  EXPECT_NE(full.find("<h3>Acceptance</h3>"), std::string::npos);
  EXPECT_NE(full.find("class=\"distribution\""), std::string::npos);
}

// The verdict a reader recomputes counts the distances and the acceptance: a document claiming a
// pass over a failed pinned acceptance or a distance over its bound is refused.
TEST(ReportVersions, TheRecomputedVerdictCountsDistancesAndAcceptance) {
  Fixture f = target_fixture(10, two_misses);
  f.acceptance = AcceptancePin{{1.0, 1.0, 1.0}, "test"};
  nlohmann::json pinned = document_of(replay_on(f));
  ASSERT_EQ(pinned["results"][0]["verdict"], "fail");
  EXPECT_FALSE(recomputed_pass(pinned["results"][0]));
  pinned["results"][0]["verdict"] = "pass";
  const std::string path = temp_path("lying.json");
  write_report_document(path, pinned);
  testing::expect_mentions(testing::harness_error_message([&] { read_report_document(path); }),
                           "field 'verdict' is 'pass', but its sequences, invariant failures, distances and acceptance "
                           "say 'fail'");
  nlohmann::json distant = document_of(replay_on(target_fixture(2, two_misses), [](ProposeOutput* out) {
    out->logits.row(1)[out->draft_tokens[1]] -= 3.0f;
  }));
  ASSERT_EQ(distant["results"][0]["pairs"][0]["distribution"]["passed"], false);
  // Without the logits stage's failure, only the distances say fail.
  for (nlohmann::json& seq : distant["results"][0]["sequences"]) {
    for (nlohmann::json& stage : seq["stages"]) stage["passed"] = true;
  }
  EXPECT_FALSE(recomputed_pass(distant["results"][0]));
  distant["results"][0]["pairs"][0]["distribution"]["passed"] = true;
  EXPECT_TRUE(recomputed_pass(distant["results"][0]));
}

}  // namespace
}  // namespace dflash
