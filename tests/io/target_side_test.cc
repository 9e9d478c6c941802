// The target's side (fixture format v2) through the public API: written and read back with every
// tensor and the pinned acceptance, the version written only when it is used (a v1 fixture stays
// v1, byte for byte in its manifest), and the checks of fixtures/target_side.h on in-memory data.
#include "fixtures/target_side.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "fixtures/fixture.h"
#include "tests/io/io_test_util.h"

namespace dflash {
namespace {

using testing::oracle_dir;
using testing::TempDir;

nlohmann::json manifest_of(const std::string& dir) {
  return nlohmann::json::parse(std::ifstream(dir + "/fixture.json"));
}

TEST(TargetSide, WrittenAsVersion2AndReadBack) {
  TempDir tmp;
  Fixture f = read_fixture(oracle_dir("batch-widths-release"));
  ProposeEntry& first = f.steps[0].propose[0];
  TargetSide full;
  full.tokens = *first.expect->draft_tokens;
  full.logits = *first.expect->logits;
  first.target = full;
  ProposeEntry& second = f.steps[2].propose[1];
  TargetSide topk;
  topk.tokens = *second.expect->draft_tokens;
  topk.k = 2;
  topk.topk_values = Tensor::zeros({static_cast<int64_t>(topk.tokens.size()), 2});
  for (size_t i = 0; i < topk.tokens.size(); ++i) {
    topk.topk_values->row(static_cast<int64_t>(i))[0] = 3.0f;
    topk.topk_values->row(static_cast<int64_t>(i))[1] = 1.0f;
    topk.topk_ids.insert(topk.topk_ids.end(), {topk.tokens[i], (topk.tokens[i] + 7) % 400});
  }
  second.target = topk;
  f.acceptance = AcceptancePin{{0.9, 0.8, 0.5}, "a test pin"};

  write_fixture(f, tmp / "v2");
  EXPECT_EQ(manifest_of(tmp / "v2")["version"], 2);
  const Fixture g = read_fixture(tmp / "v2");
  ASSERT_TRUE(g.steps[0].propose[0].target.has_value());
  const TargetSide& a = *g.steps[0].propose[0].target;
  EXPECT_EQ(a.tokens, full.tokens);
  ASSERT_TRUE(a.logits.has_value());
  EXPECT_EQ(a.logits->values, full.logits->values);
  EXPECT_FALSE(a.topk_values.has_value());
  const TargetSide& b = *g.steps[2].propose[1].target;
  EXPECT_EQ(b.k, 2);
  EXPECT_EQ(b.topk_ids, topk.topk_ids);
  EXPECT_EQ(b.topk_values->values, topk.topk_values->values);
  EXPECT_FALSE(g.steps[1].propose[0].target.has_value());
  ASSERT_TRUE(g.acceptance.has_value());
  EXPECT_EQ(g.acceptance->per_position, std::vector<double>({0.9, 0.8, 0.5}));
  EXPECT_EQ(g.acceptance->basis, "a test pin");
}

TEST(TargetSide, AFixtureWithoutItStaysVersion1) {
  TempDir tmp;
  const Fixture f = read_fixture(oracle_dir("tiny-mha"));
  write_fixture(f, tmp / "v1");
  EXPECT_EQ(manifest_of(tmp / "v1")["version"], 1);
  EXPECT_FALSE(read_fixture(tmp / "v1").acceptance.has_value());
}

TEST(TargetSide, InMemoryChecksNameWhatIsWrong) {
  TargetSide t;
  t.tokens_name = "toks";
  t.tokens = {1, 9};
  testing::expect_mentions(testing::harness_error_message([&] { check_target_side(t, 8, "here"); }),
                           "here: tensor 'toks' holds token 9 at index 1, outside [0, vocab_size 8)");
  t.tokens = {1, 2};
  t.logits = Tensor({2, 3}, {0.0f, 5.0f, 1.0f, 0.0f, 0.0f, 2.0f});
  t.logits_name = "lg";
  EXPECT_NO_THROW(check_target_side(t, 3, "here"));
  t.tokens = {1, 0};
  testing::expect_mentions(testing::harness_error_message([&] { check_target_side(t, 3, "here"); }),
                           "row 1 of the target's tokens ('toks') is 0, which is not a maximum of its logits ('lg'");
  AcceptancePin pin{{1.0, 1.0, 0.9}, ""};
  EXPECT_NO_THROW(check_acceptance_pin(pin, 3, "pin"));
  testing::expect_mentions(testing::harness_error_message([&] { check_acceptance_pin(pin, 2, "pin"); }),
                           "pin has 3 entries, more than the 2 drafted positions");
  testing::expect_mentions(testing::harness_error_message([&] { check_acceptance_pin(AcceptancePin{}, 2, "pin"); }),
                           "pin is empty");
}

}  // namespace
}  // namespace dflash
