// The invariant checker (compare/invariants.h) on hand-made violations: a working proposer (the
// toy double, real paged bookkeeping) whose outputs or introspection are edited to break exactly
// one invariant. Each check must fire, name the invariant and the sequence/page/slot involved,
// and stay silent on the unedited proposer.
#include "compare/invariants.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "tests/properties/random_model.h"
#include "tests/properties/tampering_proposer.h"
#include "tests/properties/toy_proposer.h"

namespace dflash::prop {
namespace {

// Two sequences on a 6-page pool of 4-token pages, cap 6, gamma 4: sequence 0 slides past its
// first page, sequence 1 is released at the end.
class CheckerTest : public ::testing::Test {
 protected:
  CheckerTest() {
    config_ = make_config(tiny_geometry());
    weights_ = make_weights(config_, 11);
    settings_.gamma = 4;
    settings_.ctx_cap = 6;
    settings_.kv_page_size = 4;
    settings_.max_batch = 2;
    proposer_ = std::make_unique<TamperingProposer>(make_toy_proposer(config_, weights_, settings_));
    proposer_->add_sequence(0);
    proposer_->add_sequence(1);
  }

  Tensor rows(int64_t count, uint64_t stream, int64_t first) const {
    Tensor t = Tensor::zeros({count, config_.ctx_feature_dim()});
    for (int64_t r = 0; r < count; ++r) context_row(stream, first + r, config_.ctx_feature_dim(), t.row(r));
    return t;
  }

  // Steps 1 and 2; returns the outputs of step 2 (sequence 0 at width request 10).
  std::vector<ProposeOutput> play() {
    const Tensor a = rows(7, 1, 0), b = rows(5, 2, 0), c = rows(3, 1, 7);
    proposer_->set_block_g(3);
    proposer_->propose({{0, &a, 7, 3}, {1, &b, 5, 4}}, false);
    proposer_->set_block_g(10);
    return proposer_->propose({{0, &c, 10, 5}}, false);
  }

  std::map<int, int64_t> expected_next() const { return {{0, 10}, {1, 5}}; }

  static bool fired(const std::vector<InvariantViolation>& violations, const std::string& invariant,
                    const std::string& mention) {
    for (const InvariantViolation& v : violations) {
      if (v.invariant == invariant && v.detail.find(mention) != std::string::npos) return true;
    }
    return false;
  }
  static std::string listing(const std::vector<InvariantViolation>& violations) {
    std::string text;
    for (const InvariantViolation& v : violations) text += "[" + v.invariant + "] " + v.detail + "\n";
    return text.empty() ? "(none)" : text;
  }

  DrafterConfig config_;
  std::shared_ptr<DrafterWeights> weights_;
  HeadSettings settings_;
  std::unique_ptr<TamperingProposer> proposer_;
};

TEST_F(CheckerTest, UneditedProposerHasNoViolations) {
  const auto outputs = play();
  ASSERT_EQ(outputs.size(), 1u);
  EXPECT_EQ(outputs[0].block_width, 4);  // clamp(10, 2, 4)
  const auto violations = check_propose_output(*proposer_, 10, outputs[0]);
  EXPECT_TRUE(violations.empty()) << listing(violations);
  const auto state = check_all_invariants(*proposer_, expected_next());
  EXPECT_TRUE(state.empty()) << listing(state);
  proposer_->release_sequence(1);
  const auto after_release = check_all_invariants(*proposer_, {{0, 10}});
  EXPECT_TRUE(after_release.empty()) << listing(after_release);
}

TEST_F(CheckerTest, ClampFiresOnAWidthOffByOne) {
  const auto outputs = play();
  ProposeOutput out = outputs[0];
  out.block_width = 5;  // clamp(10, 2, 4) + 1
  EXPECT_TRUE(fired(check_propose_output(*proposer_, 10, out), "clamp", "sequence 0"));
  proposer_->edit_block_g = [](int& g) { g += 1; };
  const auto violations = check_propose_output(*proposer_, 10, outputs[0]);
  EXPECT_TRUE(fired(violations, "clamp", "block_g() is 5")) << listing(violations);
}

TEST_F(CheckerTest, LogitsShapeFiresOnARowPastTheBlockAndOnExtraValues) {
  const auto outputs = play();
  ProposeOutput extra_row = outputs[0];
  extra_row.logits.shape[0] += 1;
  extra_row.logits.values.resize(extra_row.logits.values.size() + config_.vocab_size, 0.0f);
  auto violations = check_propose_output(*proposer_, 10, extra_row);
  EXPECT_TRUE(fired(violations, "logits-shape", "[4, 16]")) << listing(violations);

  ProposeOutput guard_band = outputs[0];
  guard_band.logits.values.push_back(0.0f);  // right shape, one value written past it
  violations = check_propose_output(*proposer_, 10, guard_band);
  EXPECT_TRUE(fired(violations, "logits-shape", "49 values")) << listing(violations);
}

TEST_F(CheckerTest, DraftTokensFireOnCountAndRange) {
  const auto outputs = play();
  ProposeOutput short_list = outputs[0];
  short_list.draft_tokens.pop_back();
  EXPECT_TRUE(fired(check_propose_output(*proposer_, 10, short_list), "draft-tokens", "expected B-1 = 3"));
  ProposeOutput out_of_range = outputs[0];
  out_of_range.draft_tokens[1] = config_.vocab_size;
  EXPECT_TRUE(fired(check_propose_output(*proposer_, 10, out_of_range), "draft-tokens", "outside [0, 16)"));
}

TEST_F(CheckerTest, DraftArgmaxFiresOnATieBrokenByTheHighestIndex) {
  const auto outputs = play();
  ProposeOutput tie = outputs[0];
  float* row = tie.logits.row(1);
  for (int v = 0; v < config_.vocab_size; ++v) row[v] = 0.0f;
  row[2] = row[13] = 1.5f;   // duplicate maxima far apart
  tie.draft_tokens[1] = 13;  // the highest index wins: wrong
  auto violations = check_propose_output(*proposer_, 10, tie);
  EXPECT_TRUE(fired(violations, "draft-argmax", "lowest index with the same maximum logit is 2")) << listing(violations);
  tie.draft_tokens[1] = 2;
  violations = check_propose_output(*proposer_, 10, tie);
  EXPECT_TRUE(violations.empty()) << listing(violations);
}

TEST_F(CheckerTest, LogitsFiniteFiresOnNaN) {
  const auto outputs = play();
  ProposeOutput nan = outputs[0];
  nan.logits.row(2)[5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(fired(check_propose_output(*proposer_, 10, nan), "logits-finite", "logits[2, 5]"));
}

TEST_F(CheckerTest, WindowFiresOnAWindowOffByOne) {
  play();
  proposer_->edit_view = [](SequenceView& v) {
    if (v.seq == 0) v.window_begin -= 1;  // cap + 1 positions
  };
  const auto violations = check_windows(*proposer_, expected_next());
  EXPECT_TRUE(fired(violations, "window", "sequence 0: window starts at position 3")) << listing(violations);
}

TEST_F(CheckerTest, WindowFiresOnWrongPositionsAndSequenceSets) {
  play();
  auto violations = check_windows(*proposer_, {{0, 11}, {1, 5}});
  EXPECT_TRUE(fired(violations, "window", "sequence 0: next context position is 10")) << listing(violations);
  violations = check_windows(*proposer_, {{0, 10}});
  EXPECT_TRUE(fired(violations, "window", "sequence 1 is active")) << listing(violations);
  violations = check_windows(*proposer_, {{0, 10}, {1, 5}, {2, 0}});
  EXPECT_TRUE(fired(violations, "window", "sequence 2 should be active")) << listing(violations);
}

TEST_F(CheckerTest, SlotUniqueFiresOnADoubleAssignedPage) {
  play();
  const int shared_page = proposer_->sequence_view(0).block_table.back();
  const int64_t page_size = settings_.kv_page_size;
  proposer_->edit_view = [shared_page](SequenceView& v) {
    if (v.seq == 1) v.block_table[0] = shared_page;
  };
  proposer_->edit_slots = [shared_page, page_size](int seq, std::vector<int64_t>& slots) {
    if (seq == 1) {
      for (size_t i = 0; i < slots.size() && i < static_cast<size_t>(page_size); ++i) slots[i] = shared_page * page_size + static_cast<int64_t>(i);
    }
  };
  const auto violations = check_cache_slots(*proposer_);
  EXPECT_TRUE(fired(violations, "slot-unique", "page " + std::to_string(shared_page))) << listing(violations);
  EXPECT_TRUE(fired(violations, "slot-unique", "sequence 0 position 8 and sequence 1 position 0")) << listing(violations);
}

TEST_F(CheckerTest, SlotLayersFiresWhenStorageDisagreesWithTheBlockTable) {
  play();
  proposer_->edit_slots = [](int seq, std::vector<int64_t>& slots) {
    if (seq == 1) std::swap(slots[0], slots[1]);
  };
  const auto violations = check_cache_slots(*proposer_);
  EXPECT_TRUE(fired(violations, "slot-layers", "sequence 1: position 0")) << listing(violations);
}

TEST_F(CheckerTest, WindowSlotsFiresOnABlockRowLeftInTheCacheAndAPageNotFreed) {
  play();
  proposer_->edit_slots = [](int seq, std::vector<int64_t>& slots) {
    if (seq == 0) slots.push_back(slots.back() + 1);  // the anchor row kept a slot
  };
  auto violations = check_cache_slots(*proposer_);
  EXPECT_TRUE(fired(violations, "window-slots", "sequence 0: 7 slots for a window of 6")) << listing(violations);

  proposer_->edit_slots = nullptr;
  proposer_->edit_view = [](SequenceView& v) {
    if (v.seq == 0) {  // logical page 0 (positions 0..3) kept although the window starts at 4
      v.block_table.insert(v.block_table.begin(), v.block_table.front());
      v.first_logical_page -= 1;
    }
  };
  violations = check_cache_slots(*proposer_);
  EXPECT_TRUE(fired(violations, "window-slots", "sequence 0: block table holds logical pages 0..2")) << listing(violations);
}

TEST_F(CheckerTest, PoolAccountingFiresOnLeakedAndDuplicatedPages) {
  play();
  proposer_->edit_pool = [](PoolView& pool) { pool.free_pages.pop_back(); };  // a free page lost
  auto violations = check_cache_slots(*proposer_);
  EXPECT_TRUE(fired(violations, "pool-accounting", "neither owned nor on the free list")) << listing(violations);
  EXPECT_TRUE(fired(violations, "pool-accounting", "!= pool size 6")) << listing(violations);

  proposer_->edit_pool = [](PoolView& pool) { pool.free_pages.push_back(pool.free_pages.front()); };
  violations = check_cache_slots(*proposer_);
  EXPECT_TRUE(fired(violations, "pool-accounting", "on the free list twice")) << listing(violations);

  const int owned_page = proposer_->sequence_view(1).block_table[0];
  proposer_->edit_pool = [owned_page](PoolView& pool) { pool.free_pages.push_back(owned_page); };
  violations = check_cache_slots(*proposer_);
  EXPECT_TRUE(fired(violations, "pool-accounting", "owned by sequence 1")) << listing(violations);
}

TEST_F(CheckerTest, ReleasedPagesFiresWhenAReleasedSequenceKeepsAPage) {
  play();
  const std::vector<int> pages_of_1 = proposer_->sequence_view(1).block_table;
  proposer_->release_sequence(1);
  // Release "forgot" the first page: still owned by 1, not on the free list.
  proposer_->edit_pool = [pages_of_1](PoolView& pool) {
    pool.page_owner[pages_of_1[0]] = 1;
    pool.free_pages.erase(std::find(pool.free_pages.begin(), pool.free_pages.end(), pages_of_1[0]));
  };
  const auto violations = check_all_invariants(*proposer_, {{0, 10}});
  EXPECT_TRUE(fired(violations, "released-pages", "still owned by sequence 1, which is not active")) << listing(violations);
}

TEST_F(CheckerTest, IntrospectionThatThrowsIsAViolationNotACrash) {
  play();
  proposer_->edit_sequences = [](std::vector<int>& ids) { ids.push_back(7); };  // listed, unknown to the table
  const auto violations = check_all_invariants(*proposer_, expected_next());
  EXPECT_TRUE(fired(violations, "introspection", "sequence 7")) << listing(violations);
  EXPECT_TRUE(fired(violations, "window", "sequence 7 is active")) << listing(violations);
}

}  // namespace
}  // namespace dflash::prop
