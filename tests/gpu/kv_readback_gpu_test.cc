// The CUDA drafter's stored state through its read-back (compare/kv_invariants.h): after every
// propose of a script with slides, releases and page reuse, every window slot holds in every layer
// the K/V the reference recomputes from the context row (within the bf16/fp8 pair's bound), no slot
// outside the windows changes, freed pages hold NaN, and attention's window is the spec's; then
// each check against a fault planted on the device with the page table untouched.
#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "compare/kv_invariants.h"
#include "compare/tolerance.h"
#include "cuda/cuda_drafter_impl.h"
#include "reference/reference_drafter.h"
#include "tests/gpu/gpu_test_util.h"
#include "cuda/cuda_drafter_debug.h"
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
    d_.propose({{seq, &ctx, start, anchor}}, false);
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
    for (const InvariantViolation& v : check_stored_kv(d_, recompute_, pair_, rows_)) found.push_back(v);
    // What attention read is reported per propose (after a release there is none to check).
    if (!anchors.empty()) {
      for (const InvariantViolation& v : check_attention_spans(d_, anchors)) found.push_back(v);
    }
    return found;
  }

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

INSTANTIATE_TEST_SUITE_P(Precisions, KvReadbackGpu, ::testing::Values(Precision::kFp8, Precision::kBf16),
                         [](const auto& info) { return std::string(precision_name(info.param)); });

}  // namespace
}  // namespace dflash
