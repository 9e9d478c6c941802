// Windowed eviction (docs/spec/dflash2.md §4) on the reference: an all-sliding DFlash2 drafter keeps
// only the W - 1 newest context positions of each sequence. A fixed trace slides one sequence far
// past W while another stays below W - 1 and reaches it; the trace player checks after every step
// the windows, the cache slots, the pool accounting, the stored K/V, the poisoned freed pages and
// the window attention read (compare/invariants.h, compare/kv_invariants.h). The negative controls
// are working drafters that keep one page of evicted positions, or evict one position too many,
// while their config says W: the same checks must flag both.
#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <memory>
#include <set>
#include <string>

#include "compare/invariants.h"
#include "compare/kv_invariants.h"
#include "core/config.h"
#include "fixtures/random_drafter.h"
#include "fixtures/synthetic.h"
#include "tests/properties/backends.h"
#include "tests/properties/broken_proposers.h"
#include "tests/properties/trace.h"
#include "tests/properties/trace_runner.h"

namespace dflash::prop {
namespace {

constexpr uint64_t kWeightSeed = 8;

class WindowedEviction : public ::testing::Test {
 protected:
  WindowedEviction()
      : config_(parse_drafter_config(synthetic_config_json("tiny-dflash2-w8"), "geometry tiny-dflash2-w8")),
        weights_(make_random_weights(config_, kWeightSeed)) {
    settings_.gamma = 6;  // <= W - 1, so the variant running W - 1 is a valid drafter too
    settings_.ctx_cap = 4096;
    settings_.kv_page_size = 4;
    settings_.max_batch = 2;
    settings_.precision = Precision::kFp32;
    settings_.poison_freed_pages = true;  // a read of an evicted row would be NaN in the logits
  }

  // Sequence 0 brings 6, 5, 9, 3, 4 rows (positions slide to 27, freeing pages at every step);
  // sequence 1 brings 3, 1, 1, 1, 1 (3..7: below W - 1, then exactly W - 1).
  static Trace sliding_trace() {
    Trace trace;
    const int rows0[] = {6, 5, 9, 3, 4};
    const int rows1[] = {3, 1, 1, 1, 1};
    for (int s = 0; s < 5; ++s) {
      TraceStep step;
      step.id = s;
      step.width = s % 2 == 0 ? 6 : 4;
      step.entries = {{0, rows0[s], 10 + s}, {1, rows1[s], 20 + s}};
      trace.steps.push_back(step);
    }
    return trace;
  }

  // "" when every check held over the whole trace, else the first failure.
  std::string play(const Backend& backend) const {
    std::unique_ptr<DraftProposer> proposer = backend.make(config_, weights_, settings_);
    RunOptions options;
    options.recompute_kv = backend.kv_oracle(config_, weights_, settings_.precision, 64);
    try {
      run_trace(*proposer, sliding_trace(), options);
    } catch (const rc::detail::CaseResult& failure) {
      return failure.description;
    }
    // Eviction really happened: sequence 0 holds exactly the 7 newest of its 27 positions.
    const SequenceView view = proposer->sequence_view(0);
    if (view.next_position != 27 || view.window_size() != 7) {
      return "sequence 0 holds positions " + std::to_string(view.window_begin) + ".." +
             std::to_string(view.next_position - 1) + ", expected 20..26";
    }
    return "";
  }

  // The invariants each checker names after one propose that brings 11 rows (4 of them evicted).
  std::set<std::string> flagged_after_one_slide(const Backend& backend) const {
    std::unique_ptr<DraftProposer> proposer = backend.make(config_, weights_, settings_);
    const Tensor ctx = make_random_context(11, config_.ctx_feature_dim(), 5);
    proposer->add_sequence(0);
    proposer->propose({{0, &ctx, 11, 3}}, false);
    std::set<std::string> names;
    for (const InvariantViolation& v : check_all_invariants(*proposer, {{0, 11}})) names.insert(v.invariant);
    for (const InvariantViolation& v : check_attention_spans(*proposer, {{0, 11}})) names.insert(v.invariant);
    return names;
  }

  DrafterConfig config_;
  std::shared_ptr<DrafterWeights> weights_;
  HeadSettings settings_;
};

TEST_F(WindowedEviction, ReferenceKeepsExactlyTheNewestWMinusOnePositions) {
  ASSERT_TRUE(config_.dflash2.all_sliding());
  ASSERT_EQ(config_.dflash2.sliding_window, 8);
  EXPECT_EQ(retained_context(config_, settings_), 7);
  EXPECT_EQ(play(reference_backend()), "");
  EXPECT_TRUE(flagged_after_one_slide(reference_backend()).empty());
}

TEST_F(WindowedEviction, PoolIsSizedForTheRetainedWindow) {
  const HeadSettings resolved = settings_.resolved(config_);
  EXPECT_EQ(resolved.pool_pages, resolved.pages_for(7));
  EXPECT_LT(resolved.pool_pages, resolved.pages_for(settings_.ctx_cap));
}

TEST_F(WindowedEviction, DescribeSaysWhatIsRetainedAndWhy) {
  const auto described = reference_backend().make(config_, weights_, settings_)->describe();
  std::string retained;
  for (const auto& [key, value] : described) {
    if (key == "retained_context") retained = value;
  }
  EXPECT_NE(retained.find("W - 1 = 7"), std::string::npos) << retained;
  EXPECT_NE(retained.find("every layer slides"), std::string::npos) << retained;
}

TEST_F(WindowedEviction, KeepingAnEvictedPageOrEvictingOneTooManyIsFlagged) {
  for (const Backend& broken : {keeps_evicted_page(reference_backend()), evicts_one_position_too_many(reference_backend())}) {
    EXPECT_EQ(flagged_after_one_slide(broken), (std::set<std::string>{"window", "attention-window"})) << broken.name;
    const std::string failure = play(broken);
    EXPECT_NE(failure.find("[attention-window] sequence 0"), std::string::npos)
        << broken.name << ": " << (failure.empty() ? "(no failure)" : failure);
  }
}

}  // namespace
}  // namespace dflash::prop
