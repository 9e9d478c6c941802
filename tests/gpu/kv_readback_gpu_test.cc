// The CUDA drafter's stored state through its read-back (compare/kv_invariants.h): after every
// propose of a script with slides, releases and page reuse, every window slot holds in every layer
// the K/V the reference recomputes from the context row (within the bf16/fp8 pair's bound), no slot
// outside the windows changes, freed pages hold NaN, and attention's window is the spec's; then
// each check against a fault planted on the device with the page table untouched. DFlash2
// (docs/spec/dflash2.md §4): an all-sliding drafter evicts every position older than the W - 1
// newest, and in a mixed drafter a sliding layer never reads the positions only the full layer sees.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "compare/kv_invariants.h"
#include "compare/tolerance.h"
#include "cuda/drafter/cuda_drafter_impl.h"
#include "reference/reference_drafter.h"
#include "testing/gpu_test_util.h"
#include "testing/cuda_drafter_debug.h"
#include "fixtures/geometries.h"
#include "fixtures/random_drafter.h"

namespace dflash {
namespace {

DrafterGeometry geometry() {
  DrafterGeometry g;
  g.name = "kv-readback";
  g.hidden = 128, g.layers = 2, g.heads = 4, g.kv_heads = 2, g.head_dim = 64, g.intermediate = 256, g.vocab = 512;
  g.block = 8, g.target_layer_ids = {1, 3}, g.theta = 1e6, g.eps = 1e-6, g.mask_token_id = 7;
  return g;
}

// The same with DFlash2's convolutions and selector, layers sliding as `sliding` says, W 8.
DrafterGeometry dflash2_geometry(std::vector<bool> sliding) {
  DrafterGeometry g = geometry();
  g.name = "kv-readback-dflash2";
  Dflash2Config& d2 = g.dflash2;
  d2.enabled = true;
  d2.conv_kernel_size = 2, d2.conv_group_size = 16, d2.selector_rank = 16, d2.selector_top_k = 4;
  d2.sliding = std::move(sliding);
  d2.sliding_window = 8;
  return g;
}

HeadSettings settings(Precision precision) {
  HeadSettings s;
  s.gamma = 8;
  s.ctx_cap = 24;
  s.max_batch = 2;
  s.kv_page_size = 4;
  s.precision = precision;
  s.poison_freed_pages = true;
  return s;
}

bool names(const std::vector<InvariantViolation>& found, const std::string& invariant) {
  for (const InvariantViolation& v : found) {
    if (v.invariant == invariant) return true;
  }
  return false;
}

std::string text(const std::vector<InvariantViolation>& found) {
  std::string t;
  for (const InvariantViolation& v : found) t += "\n  [" + v.invariant + "] " + v.detail;
  return t;
}

// Drives one drafter and checks its stored state after every step.
class Checked {
 public:
  Checked(CudaDrafter& d, Precision precision, const std::shared_ptr<const DrafterWeights>& w)
      : d_(d),
        recompute_(make_reference_context_kv(d.config(), w, precision, 24)),
        pair_(cross_pair(precision, "recomputed K/V", precision, d.name())) {}

  // Returns what the stored-state checks found after the step.
  std::vector<InvariantViolation> propose(int seq, int64_t rows, int64_t start, int anchor) {
    if (!added_[seq]) {
      d_.add_sequence(seq);
      added_[seq] = true;
    }
    contexts_.push_back(make_random_context(rows, d_.config().ctx_feature_dim(), 1000 * seq + start));
    const Tensor& ctx = contexts_.back();
    for (int64_t r = 0; r < rows; ++r) rows_[seq][start - rows + r] = ctx.row(r);
    const std::optional<PoolSnapshot> before = snapshot_pools(d_);
    d_.set_block_g(8);
    last_outputs = d_.propose({{seq, &ctx, start, anchor}}, false);
    return after(*before, {{seq, start}});
  }
  std::vector<InvariantViolation> release(int seq) {
    const std::optional<PoolSnapshot> before = snapshot_pools(d_);
    d_.release_sequence(seq);
    rows_.erase(seq);
    return after(*before, {});
  }
  std::vector<InvariantViolation> after(const PoolSnapshot& before, const std::map<int, int64_t>& anchors) {
    std::vector<InvariantViolation> found = check_kv_outside_windows(d_, before, *snapshot_pools(d_));
    for (const InvariantViolation& v : check_stored_kv(d_, recompute_, pair_, rows_, {})) found.push_back(v);
    // What attention read is reported per propose (after a release there is none to check).
    if (!anchors.empty()) {
      for (const InvariantViolation& v : check_attention_spans(d_, anchors)) found.push_back(v);
    }
    return found;
  }

  std::vector<ProposeOutput> last_outputs;

 private:
  CudaDrafter& d_;
  ContextKvFunction recompute_;
  TolerancePair pair_;
  std::map<int, bool> added_;
  std::deque<Tensor> contexts_;  // every context fed (rows_ points into them; a deque never moves them)
  ContextRows rows_;
};

class KvReadbackGpu : public ::testing::TestWithParam<Precision> {
 protected:
  void SetUp() override { DFLASH_REQUIRE_GPU(); }
};

TEST_P(KvReadbackGpu, StoredStateHoldsAfterEveryStepOnTheGraphPath) {
  const DrafterConfig c = make_config(geometry());
  const auto w = make_random_weights(c, 11);
  CudaOptions o;
  o.warmup = 1;
  CudaDrafter d(c, w, settings(GetParam()), o);
  Checked run(d, GetParam(), w);
  // Slides past the cap of 24, a second sequence, a release and page reuse.
  struct S {
    int seq;
    int64_t rows, start;
  };
  const std::vector<S> script = {{0, 10, 10}, {0, 5, 15}, {0, 12, 27}, {1, 30, 30}, {0, 3, 30}, {0, 9, 39}};
  int anchor = 1;
  for (const S& s : script) {
    const auto found = run.propose(s.seq, s.rows, s.start, anchor++);
    EXPECT_TRUE(found.empty()) << "seq " << s.seq << " start " << s.start << text(found);
  }
  const auto released = run.release(1);
  EXPECT_TRUE(released.empty()) << text(released);
  const auto reused = run.propose(2, 20, 20, anchor++);
  EXPECT_TRUE(reused.empty()) << text(reused);
}

TEST_P(KvReadbackGpu, EachCheckNamesAFaultPlantedOnTheDevice) {
  const DrafterConfig c = make_config(geometry());
  const auto w = make_random_weights(c, 12);
  CudaDrafter d(c, w, settings(GetParam()), CudaOptions{});
  Checked run(d, GetParam(), w);
  ASSERT_TRUE(run.propose(0, 10, 10, 3).empty());
  const std::vector<int64_t> slots = d.window_slots(0);

  // A row stored at the wrong slot: position 1's K/V over position 0's.
  std::optional<PoolSnapshot> before = snapshot_pools(d);
  copy_kv_slot(d, 0, slots[1], slots[0]);
  auto found = run.after(*before, {{0, 10}});
  EXPECT_TRUE(names(found, "kv-stored")) << text(found);

  CudaDrafter kept(c, w, settings(GetParam()), CudaOptions{});
  Checked kept_run(kept, GetParam(), w);
  ASSERT_TRUE(kept_run.propose(0, 10, 10, 3).empty());
  before = snapshot_pools(kept);
  store_block_row(kept, kept.window_slots(0).back() + 1);  // position 10: the anchor's row
  found = kept_run.after(*before, {{0, 10}});
  EXPECT_TRUE(names(found, "kv-outside-window")) << text(found);

  CudaDrafter longer(c, w, settings(GetParam()), CudaOptions{});
  Checked longer_run(longer, GetParam(), w);
  ASSERT_TRUE(longer_run.propose(0, 10, 10, 3).empty());
  before = snapshot_pools(longer);
  lengthen_last_windows(longer);
  enqueue_last_block_forward(longer);
  found = longer_run.after(*before, {{0, 10}});
  EXPECT_TRUE(names(found, "attention-window")) << text(found);

  // Freed pages hold NaN (a stale read then shows); a free slot that does not is named.
  CudaDrafter stale(c, w, settings(GetParam()), CudaOptions{});
  Checked stale_run(stale, GetParam(), w);
  ASSERT_TRUE(stale_run.propose(0, 10, 10, 3).empty());
  const int64_t window_slot = stale.window_slots(0)[0];
  ASSERT_TRUE(stale_run.release(0).empty());  // its pages poisoned, as checked here
  ASSERT_TRUE(stale_run.propose(1, 5, 5, 4).empty());
  before = snapshot_pools(stale);
  copy_kv_slot(stale, 0, stale.window_slots(1)[0], window_slot);  // a live row into the freed page
  found = stale_run.after(*before, {});
  EXPECT_TRUE(names(found, "kv-poison")) << text(found);
}

// Every layer sliding: each sequence keeps exactly its W - 1 = 7 newest positions, pages that slid
// out are freed and poisoned (so a read of an evicted row would turn the logits NaN), in a pool
// sized for 7 positions.
TEST_P(KvReadbackGpu, AllSlidingDrafterKeepsOnlyTheNewestWMinusOnePositions) {
  const DrafterConfig c = make_config(dflash2_geometry({true, true}));
  const auto w = make_random_weights(c, 13);
  CudaOptions o;
  o.warmup = 1;
  CudaDrafter d(c, w, settings(GetParam()), o);
  ASSERT_EQ(retained_context(c, d.settings()), 7);
  EXPECT_EQ(d.settings().pool_pages, d.settings().pages_for(7));
  Checked run(d, GetParam(), w);
  struct S {
    int seq;
    int64_t rows, start;
  };
  // Sequence 0 slides to 27 (pages freed at every step); sequence 1 reaches exactly W - 1.
  const std::vector<S> script = {{0, 6, 6}, {1, 3, 3}, {0, 5, 11}, {1, 4, 7}, {0, 9, 20}, {0, 3, 23}, {0, 4, 27}};
  int anchor = 1;
  for (const S& s : script) {
    const auto found = run.propose(s.seq, s.rows, s.start, anchor++);
    EXPECT_TRUE(found.empty()) << "seq " << s.seq << " start " << s.start << text(found);
    const SequenceView view = d.sequence_view(s.seq);
    EXPECT_EQ(view.window_begin, std::max<int64_t>(0, s.start - 7)) << "seq " << s.seq << " start " << s.start;
    ASSERT_EQ(run.last_outputs.size(), 1u);
    for (float x : run.last_outputs[0].logits.values) ASSERT_TRUE(std::isfinite(x)) << "seq " << s.seq << " start " << s.start;
  }
  const auto released = run.release(1);
  EXPECT_TRUE(released.empty()) << text(released);
  const auto reused = run.propose(2, 20, 20, anchor++);
  EXPECT_TRUE(reused.empty()) << text(reused);
}

// One sliding and one full layer: the full layer keeps ctx_cap positions cached, and the sliding
// layer must not read those older than s + i - (W - 1) for any block row i. NaN written over them in
// the sliding layer's pools between proposes changes no bit of the outputs; the negative control
// writes NaN over the oldest position block row 0 sees, and the outputs must change.
TEST_P(KvReadbackGpu, SlidingLayerOfAMixedDrafterNeverReadsOutsideItsWindow) {
  const DrafterConfig c = make_config(dflash2_geometry({true, false}));
  const auto w = make_random_weights(c, 14);
  HeadSettings s = settings(GetParam());
  s.poison_freed_pages = false;
  ASSERT_EQ(retained_context(c, s), 24);
  CudaDrafter clean(c, w, s, CudaOptions{}), hidden(c, w, s, CudaOptions{}), visible(c, w, s, CudaOptions{});
  const int64_t kVisible = 7;  // W - 1
  const std::vector<int64_t> rows = {10, 6, 5, 9};
  std::deque<Tensor> contexts;
  int64_t start = 0;
  int64_t hidden_slots = 0;
  bool visible_changed = false;
  for (size_t k = 0; k < rows.size(); ++k) {
    const int64_t next_start = start + rows[k];
    if (k > 0) {
      // Before the propose at next_start: NaN over the sliding layer's rows no block row sees.
      const SequenceView view = hidden.sequence_view(0);
      const std::vector<int64_t> slots = hidden.window_slots(0);
      std::vector<int64_t> unseen;
      for (int64_t p = view.window_begin; p < next_start - kVisible && p < view.next_position; ++p) {
        unseen.push_back(slots[static_cast<size_t>(p - view.window_begin)]);
      }
      hidden_slots += static_cast<int64_t>(unseen.size());
      fill_kv_slots(hidden, 0, unseen, 0xFFFF);
      // The control: NaN over position next_start - 7, which block row 0 sees (already cached).
      const int64_t seen = next_start - kVisible;
      if (seen >= view.window_begin && seen < view.next_position) {
        const SequenceView vv = visible.sequence_view(0);
        fill_kv_slots(visible, 0, {visible.window_slots(0)[static_cast<size_t>(seen - vv.window_begin)]}, 0xFFFF);
      }
    }
    contexts.push_back(make_random_context(rows[k], c.ctx_feature_dim(), 500 + k));
    std::vector<std::vector<ProposeOutput>> outs;
    for (CudaDrafter* d : {&clean, &hidden, &visible}) {
      if (k == 0) d->add_sequence(0);
      d->set_block_g(8);
      outs.push_back(d->propose({{0, &contexts.back(), next_start, static_cast<int>(k + 3)}}, false));
    }
    const Tensor& want = outs[0][0].logits;
    const Tensor& got = outs[1][0].logits;
    ASSERT_EQ(want.values.size(), got.values.size());
    EXPECT_EQ(std::memcmp(want.values.data(), got.values.data(), want.values.size() * sizeof(float)), 0)
        << "step " << k << ": NaN outside the sliding window changed the logits";
    EXPECT_EQ(outs[0][0].draft_tokens, outs[1][0].draft_tokens) << "step " << k;
    const Tensor& control = outs[2][0].logits;
    visible_changed = visible_changed ||
                      std::memcmp(want.values.data(), control.values.data(), want.values.size() * sizeof(float)) != 0;
    start = next_start;
  }
  EXPECT_GT(hidden_slots, 0) << "the script never cached a position the sliding layer cannot see";
  EXPECT_TRUE(visible_changed) << "NaN inside the sliding window did not change the outputs";
}

INSTANTIATE_TEST_SUITE_P(Precisions, KvReadbackGpu, ::testing::Values(Precision::kFp8, Precision::kBf16),
                         [](const auto& info) { return std::string(precision_name(info.param)); });

}  // namespace
}  // namespace dflash
