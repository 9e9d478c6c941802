// Negative controls of the DFlash2 oracle replay: test-only variants of the reference that must
// fail the bundled DFlash2 fixtures, each naming the stage it breaks first. The oracle replay
// passing them (oracle_replay_test) is only evidence if these fail.
//  - a window of W instead of W - 1 (the config's sliding_window raised by one): the first sliding
//    attention, L0.attn;
//  - the per-row argmax instead of the selector's walk: draft_tokens, named as "selector not applied".
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "compare/replay.h"
#include "fixtures/fixture.h"
#include "reference/reference_drafter.h"
#include "reference/reference_options.h"
#include "tests/properties/forwarding_proposer.h"

namespace dflash {
namespace {

const char* const kFixtures[] = {"d2-tiny", "d2-sliding-batch"};

std::string fixture_dir(const std::string& name) { return std::string(DFLASH_SOURCE_DIR) + "/fixtures/oracle/" + name; }

// Drafts the per-row argmax of its logits (lowest id on ties), as a drafter that skips the walk.
class ArgmaxProposer final : public prop::ForwardingProposer {
 public:
  using ForwardingProposer::ForwardingProposer;
  std::vector<ProposeOutput> propose(const std::vector<ProposeInput>& batch, bool want_taps) override {
    std::vector<ProposeOutput> outputs = ForwardingProposer::propose(batch, want_taps);
    for (ProposeOutput& out : outputs) {
      for (int64_t r = 0; r < out.logits.rows(); ++r) {
        const float* row = out.logits.row(r);
        int64_t best = 0;
        for (int64_t c = 1; c < out.logits.cols(); ++c) best = row[c] > row[best] ? c : best;
        out.draft_tokens[static_cast<size_t>(r)] = static_cast<int32_t>(best);
      }
    }
    return outputs;
  }
};

ReplayResult replay_on(const Fixture& fixture, const DrafterConfig& config, bool argmax) {
  HeadSettings head = fixture.head;
  head.precision = Precision::kFp64;
  std::unique_ptr<DraftProposer> drafter = make_reference_drafter(config, fixture.weights, head, ReferenceOptions{1});
  if (argmax) drafter = std::make_unique<ArgmaxProposer>(std::move(drafter));
  return replay_fixture(fixture, {{drafter.get(), Precision::kFp64, true}}, {});
}

TEST(Dflash2Controls, TheReferenceItselfPasses) {
  for (const char* name : kFixtures) {
    Fixture fixture = read_fixture(fixture_dir(name));
    fixture.load_weights();
    const ReplayResult r = replay_on(fixture, fixture.config, false);
    EXPECT_TRUE(r.passed()) << name;
  }
}

TEST(Dflash2Controls, WindowOfWInsteadOfWMinusOneFailsAtTheFirstAttention) {
  for (const char* name : kFixtures) {
    Fixture fixture = read_fixture(fixture_dir(name));
    fixture.load_weights();
    DrafterConfig wide = fixture.config;
    wide.dflash2.sliding_window += 1;
    const ReplayResult r = replay_on(fixture, wide, false);
    ASSERT_FALSE(r.passed()) << name;
    ASSERT_TRUE(r.first_divergence.has_value()) << name;
    EXPECT_EQ(r.first_divergence->stage, "L0.attn") << name << ": " << r.first_divergence->detail;
  }
}

TEST(Dflash2Controls, ArgmaxInsteadOfTheWalkIsNamed) {
  for (const char* name : kFixtures) {
    Fixture fixture = read_fixture(fixture_dir(name));
    fixture.load_weights();
    const ReplayResult r = replay_on(fixture, fixture.config, true);
    ASSERT_FALSE(r.passed()) << name;
    ASSERT_TRUE(r.first_divergence.has_value()) << name;
    EXPECT_EQ(r.first_divergence->stage, "draft_tokens") << name;
    EXPECT_EQ(r.first_divergence->criterion, "selector-not-applied") << name << ": " << r.first_divergence->detail;
  }
}

}  // namespace
}  // namespace dflash
