// A DFlash2 candidate set that differs at TP = N names the vocabulary shards of the ids
// (docs/spec/tensor-parallel.md §7): the reference with its top-K unmerged (rank 0's candidates
// alone) against the clean reference, both at TP 2 on oracle/d2-tiny.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "compare/replay.h"
#include "fixtures/fixture.h"
#include "reference/reference_drafter.h"
#include "reference/reference_options.h"

namespace dflash {
namespace {

TEST(TpCandidates, AnUnmergedTopKNamesTheRankWhoseCandidateIsMissing) {
  Fixture fixture = read_fixture(std::string(DFLASH_SOURCE_DIR) + "/fixtures/oracle/d2-tiny");
  fixture.load_weights();
  HeadSettings head = fixture.head;
  head.precision = Precision::kBf16;
  head.tp_size = 2;
  ReferenceOptions planted;
  planted.tp_fault = TpFault::kShardTopKUnmerged;
  const auto clean = make_reference_drafter(fixture.config, fixture.weights, head);
  const auto unmerged = make_reference_drafter(fixture.config, fixture.weights, head, planted);
  const std::vector<ReplayLane> lanes = {{clean.get(), Precision::kBf16, false, {}},
                                         {unmerged.get(), Precision::kBf16, false, {}}};
  ReplayOptions options;
  options.tp_size = 2;
  const ReplayResult result = replay_fixture(fixture, lanes, {{0, 1}}, options);
  ASSERT_TRUE(result.first_divergence.has_value());
  const Divergence& d = *result.first_divergence;
  EXPECT_EQ(d.stage, "selector.topk_ids");
  // Rank 0 kept its own K best: the expected candidate the planted side lacks is rank 1's.
  const int64_t shard = fixture.config.vocab_size / 2;
  EXPECT_GE(static_cast<int64_t>(d.expected), shard) << d.ranks;
  EXPECT_EQ(d.ranks.find("expected candidate " + std::to_string(static_cast<int64_t>(d.expected)) + " from rank 1, "),
            0u)
      << d.ranks;
  EXPECT_NE(d.ranks.find(" from rank 0"), std::string::npos) << d.ranks;
}

}  // namespace
}  // namespace dflash
