// Hints: the nearest name by edit distance, and the reason a path is no fixture.
#include "tools/hints.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/support/harness_error.h"

namespace dflash {
namespace {

namespace fs = std::filesystem;
using testing::expect_mentions;
using testing::harness_error_message;

const std::vector<std::string> kCommands = {"replay", "bisect", "make-fixture", "inspect", "report"};

TEST(EditDistance, CountsInsertionsDeletionsSubstitutionsAndTranspositions) {
  EXPECT_EQ(edit_distance("replay", "replay"), 0);
  EXPECT_EQ(edit_distance("replya", "replay"), 1);  // one transposition
  EXPECT_EQ(edit_distance("repaly", "replay"), 1);
  EXPECT_EQ(edit_distance("rplay", "replay"), 1);
  EXPECT_EQ(edit_distance("replays", "replay"), 1);
  EXPECT_EQ(edit_distance("reploy", "replay"), 1);
  EXPECT_EQ(edit_distance("", "abc"), 3);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3);
}

TEST(NearestName, SuggestsATypoAndNothingFarAway) {
  EXPECT_EQ(nearest_name("replya", kCommands), "replay");
  EXPECT_EQ(nearest_name("reprot", kCommands), "report");
  EXPECT_EQ(nearest_name("inspcet", kCommands), "inspect");
  EXPECT_EQ(nearest_name("make-fixtures", kCommands), "make-fixture");
  EXPECT_EQ(nearest_name("frobnicate", kCommands), std::nullopt);
  EXPECT_EQ(nearest_name("replay", kCommands), std::nullopt);  // not a typo
}

class FixturePathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root = fs::path(::testing::TempDir()) / "hints" / ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(root);
    fs::create_directories(root / "set" / "tiny-gqa");
    fs::create_directories(root / "set" / "tiny-mha");
    std::ofstream(root / "set" / "tiny-gqa" / "fixture.json") << "{}";
    std::ofstream(root / "set" / "tiny-gqa" / "trace.safetensors") << "x";
    std::ofstream(root / "set" / "tiny-mha" / "fixture.json") << "{}";
    fs::create_directories(root / "empty");
  }
  fs::path root;
};

TEST_F(FixturePathTest, FixtureDirectoriesAndTheirManifestPass) {
  EXPECT_NO_THROW(check_fixture_path((root / "set" / "tiny-gqa").string()));
  EXPECT_NO_THROW(check_fixture_path((root / "set" / "tiny-gqa").string() + "/"));
  EXPECT_NO_THROW(check_fixture_path((root / "set" / "tiny-gqa" / "fixture.json").string()));
}

TEST_F(FixturePathTest, AMissingPathSaysSoAndSuggestsTheNearestSibling) {
  const std::string typo = (root / "set" / "tiny-gq").string();
  const std::string message = harness_error_message([&] { check_fixture_path(typo); });
  expect_mentions(message, "no such file or directory: " + typo + "; did you mean " +
                               (root / "set" / "tiny-gqa").string() + "?");
  const std::string far = (root / "set" / "qwen3-8b").string();
  const std::string plain = harness_error_message([&] { check_fixture_path(far); });
  EXPECT_EQ(plain, "no such file or directory: " + far);
  const std::string nowhere = (root / "nowhere" / "x").string();
  expect_mentions(harness_error_message([&] { check_fixture_path(nowhere); }),
                  "does not exist either");
}

TEST_F(FixturePathTest, ADirectoryWithoutManifestSaysSoAndNamesTheFixturesItHolds) {
  const std::string set = (root / "set").string();
  const std::string message = harness_error_message([&] { check_fixture_path(set); });
  expect_mentions(message, "not a fixture directory (no fixture.json): " + set);
  expect_mentions(message, "it holds 2 fixture directories (tiny-gqa, ...)");
  const std::string empty = (root / "empty").string();
  EXPECT_EQ(harness_error_message([&] { check_fixture_path(empty); }),
            "not a fixture directory (no fixture.json): " + empty);
}

TEST_F(FixturePathTest, AFileInsideAFixturePointsAtTheFixture) {
  const std::string trace = (root / "set" / "tiny-gqa" / "trace.safetensors").string();
  const std::string message = harness_error_message([&] { check_fixture_path(trace); });
  expect_mentions(message, "not a fixture directory");
  expect_mentions(message, "did you mean " + (root / "set" / "tiny-gqa").string() + "?");
}

}  // namespace
}  // namespace dflash
