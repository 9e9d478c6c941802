// Unit tests of the paged-cache bookkeeping (docs/spec/drafter.md §5). The property tests in
// tests/properties drive it with random traces against a model; these pin the plain cases.
#include "tests/support/harness_error.h"
#include "core/kv_pages.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "core/error.h"
#include "core/proposer.h"

namespace dflash {
namespace {

int owned_pages(const PoolView& pool) {
  int n = 0;
  for (int owner : pool.page_owner) n += owner >= 0;
  return n;
}

TEST(KvPageTable, AppendsThenSlidesAndFreesWholePagesOnly) {
  KvPageTable table(/*num_pages=*/8, /*page_size=*/4, /*ctx_cap=*/6);
  table.add(0);
  auto admitted = table.admit({{0, /*start=*/10, /*count=*/10}});
  ASSERT_EQ(admitted.size(), 1u);
  // Window of a cap-6 sequence at s = 10 is positions 4..9: rows 0..3 never enter.
  EXPECT_EQ(admitted[0].first_row, 4);
  EXPECT_EQ(admitted[0].first_position, 4);
  EXPECT_EQ(admitted[0].slots.size(), 6u);
  SequenceView v = table.view(0);
  EXPECT_EQ(v.window_begin, 4);
  EXPECT_EQ(v.next_position, 10);
  EXPECT_EQ(v.first_logical_page, 1);          // page 0 (positions 0..3) was never needed
  EXPECT_EQ(v.block_table.size(), 2u);         // positions 4..7 and 8..9
  table.admit({{0, 13, 3}});                   // window 7..12: logical page 1 still holds 7
  EXPECT_EQ(table.view(0).first_logical_page, 1);
  table.admit({{0, 14, 1}});                   // window 8..13: logical page 1 leaves
  EXPECT_EQ(table.view(0).first_logical_page, 2);
  const PoolView pool = table.pool();
  EXPECT_EQ(static_cast<int>(pool.free_pages.size()) + owned_pages(pool), pool.num_pages);
}

TEST(KvPageTable, SlotsAreUniqueAcrossSequences) {
  KvPageTable table(16, 4, 100);
  table.add(1);
  table.add(2);
  table.admit({{1, 7, 7}, {2, 9, 9}});
  std::set<int64_t> seen;
  for (int seq : {1, 2}) {
    for (int64_t slot : table.window_slots(seq)) EXPECT_TRUE(seen.insert(slot).second) << "slot " << slot;
  }
  EXPECT_EQ(seen.size(), 16u);
}

TEST(KvPageTable, GapsOverlapsAndEmptyNewSequencesAreRefused) {
  KvPageTable table(8, 4, 100);
  table.add(0);
  EXPECT_THROW(table.admit({{0, 5, 0}}), HarnessError);  // new sequence needs rows
  table.admit({{0, 5, 5}});
  // Rows 6..8 leave position 5 out.
  const std::string gap = testing::harness_error_message([&] { table.admit({{0, 9, 3}}); });
  testing::expect_mentions(gap, "gap");
  testing::expect_mentions(gap, "sequence 0");
  // Rows 4..6 repeat position 4.
  testing::expect_mentions(testing::harness_error_message([&] { table.admit({{0, 7, 3}}); }), "overlap");
  EXPECT_EQ(table.view(0).next_position, 5);  // nothing changed
}

TEST(KvPageTable, ExhaustionIsAtomicAndLeavesOtherSequencesAlone) {
  KvPageTable table(3, 4, 100);
  table.add(0);
  table.add(1);
  table.admit({{0, 8, 8}});  // two pages
  const SequenceView before = table.view(0);
  const PoolView pool_before = table.pool();
  // Sequence 0 needs one more page, sequence 1 two: 3 > 1 free.
  testing::expect_mentions(
      testing::harness_error_message([&] { table.admit({{0, 9, 1}, {1, 8, 8}}); }, ErrorKind::kPoolExhausted),
      "sequence 1");
  EXPECT_EQ(table.view(0).block_table, before.block_table);
  EXPECT_EQ(table.view(0).next_position, before.next_position);
  EXPECT_EQ(table.view(1).next_position, 0);
  EXPECT_EQ(table.pool().free_pages, pool_before.free_pages);
}

TEST(KvPageTable, ReleaseReturnsPagesAndRetiresTheId) {
  KvPageTable table(4, 4, 100);
  table.add(0);
  table.admit({{0, 10, 10}});
  EXPECT_EQ(table.pool().free_pages.size(), 1u);
  table.release(0);
  EXPECT_EQ(table.pool().free_pages.size(), 4u);
  EXPECT_THROW(table.add(0), HarnessError);
  EXPECT_THROW(table.release(0), HarnessError);
}

TEST(KvPageTable, SeededPageOrderIsAPermutationAndReproducible) {
  KvPageTable a(32, 4, 100, 7), b(32, 4, 100, 7), plain(32, 4, 100, 0);
  EXPECT_EQ(a.pool().free_pages, b.pool().free_pages);
  EXPECT_NE(a.pool().free_pages, plain.pool().free_pages);
  const std::vector<int> order = a.pool().free_pages;
  std::set<int> pages(order.begin(), order.end());
  EXPECT_EQ(pages.size(), 32u);
}

// A DFlash2 config as far as the retention rule reads it: which layers slide, and W.
DrafterConfig dflash2_layers(std::vector<bool> sliding, int window) {
  DrafterConfig c;
  c.num_layers = static_cast<int>(sliding.size());
  c.dflash2.enabled = true;
  c.dflash2.sliding = std::move(sliding);
  c.dflash2.sliding_window = window;
  return c;
}

bool has_slot(const KvPageTable& table, int seq, int64_t position) {
  try {
    table.slot_of(seq, position);
    return true;
  } catch (const HarnessError&) {
    return false;
  }
}

TEST(RetainedContext, WMinusOneWhenEveryLayerSlidesElseTheCap) {
  HeadSettings head;
  head.ctx_cap = 4096;
  EXPECT_EQ(retained_context(dflash2_layers({true, true}, 8), head), 7);
  EXPECT_EQ(retained_context(dflash2_layers({true, false}, 8), head), 4096);  // the full layer reads them all
  EXPECT_EQ(retained_context(DrafterConfig{}, head), 4096);                   // plain DFlash
  head.ctx_cap = 5;
  EXPECT_EQ(retained_context(dflash2_layers({true, true}, 8), head), 5);  // the cap still applies on top
  head.ctx_cap = 0;
  head.uncapped = true;
  EXPECT_EQ(retained_context(dflash2_layers({true, true}, 8), head), 7);
  EXPECT_EQ(retained_context(dflash2_layers({false, true}, 8), head), 0);
}

// An all-sliding drafter (W 8, 4-token pages) whose sequence slides far past W - 1: each step keeps
// exactly the 7 newest positions, frees the pages that slid out, and runs in the pool sized for 7
// positions. Negative control: the same steps keeping ctx_cap positions hold the older positions
// and exhaust that pool.
TEST(KvPageTable, AllSlidingDrafterEvictsPositionsOlderThanWMinusOne) {
  const DrafterConfig config = dflash2_layers({true, true}, 8);
  HeadSettings head;
  head.ctx_cap = 4096;
  head.kv_page_size = 4;
  const int64_t retained = retained_context(config, head);
  ASSERT_EQ(retained, 7);
  const int pool_pages = static_cast<int>(head.pages_for(retained));
  ASSERT_EQ(pool_pages, 3);  // ceil(7 / 4) + 1: a window of 7 straddles at most 3 pages

  KvPageTable table(pool_pages, head.kv_page_size, retained);
  KvPageTable keeping(pool_pages, head.kv_page_size, head.ctx_cap);
  table.add(0);
  keeping.add(0);
  int64_t start = 0;
  bool keeping_exhausted = false;
  for (int64_t rows : {6, 5, 9, 3, 4}) {
    start += rows;
    table.admit({{0, start, rows}});
    const SequenceView v = table.view(0);
    const int64_t first_kept = std::max<int64_t>(0, start - 7);
    EXPECT_EQ(v.window_begin, first_kept) << "s = " << start;
    EXPECT_EQ(v.first_logical_page, first_kept / 4) << "s = " << start;
    for (int64_t p = 0; p < start; ++p) EXPECT_EQ(has_slot(table, 0, p), p >= first_kept) << "s = " << start << ", position " << p;
    const PoolView pool = table.pool();
    EXPECT_EQ(static_cast<int>(pool.free_pages.size()) + owned_pages(pool), pool_pages) << "s = " << start;
    EXPECT_EQ(owned_pages(pool), static_cast<int>((start - 1) / 4 - first_kept / 4 + 1)) << "s = " << start;

    if (keeping_exhausted) continue;
    try {
      keeping.admit({{0, start, rows}});
      // Without eviction the positions before s - 7 keep their slots: the check above would fail.
      if (start > 7) EXPECT_TRUE(has_slot(keeping, 0, start - 8)) << "s = " << start;
    } catch (const HarnessError& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kPoolExhausted);
      keeping_exhausted = true;
    }
  }
  EXPECT_EQ(start, 27);
  EXPECT_TRUE(keeping_exhausted) << "keeping ctx_cap positions should not fit the pool sized for W - 1";
}

TEST(ClampBlockWidth, FollowsTheEngineRule) {
  EXPECT_EQ(clamp_block_width(0, 8), 2);
  EXPECT_EQ(clamp_block_width(1, 8), 2);
  EXPECT_EQ(clamp_block_width(5, 8), 5);
  EXPECT_EQ(clamp_block_width(20, 8), 8);
  EXPECT_EQ(clamp_block_width(8, 0), 2);  // gamma 0 and 1 still run width 2
  EXPECT_EQ(clamp_block_width(8, 1), 2);
}

}  // namespace
}  // namespace dflash
