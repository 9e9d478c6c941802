// Negative controls of the DFlash2 oracle replay: test-only variants of the reference that must
// fail the bundled DFlash2 fixtures, each naming the stage it breaks first. The oracle replay
// passing them (oracle_replay_test) is only evidence if these fail.
//  - a window of W instead of W - 1 (the config's sliding_window raised by one): the first sliding
//    attention, L0.attn;
//  - the per-row argmax instead of the selector's walk: draft_tokens, named as "selector not applied";
//  - a causal in-block mask (block row i sees block rows j <= i only): L0.attn;
//  - a convolution that wraps across the block boundary (row t < τ reads flat row t - τ): the
//    first prepare's output, L0.attn_conv_in.
// The fixtures made with the reference (fixtures/dflash2/) fail the controls of what they pin.
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "compare/replay.h"
#include "core/error.h"
#include "fixtures/fixture.h"
#include "reference/reference_drafter.h"
#include "reference/reference_options.h"
#include "core/forwarding_proposer.h"

namespace dflash {
namespace {

const char* const kFixtures[] = {"d2-tiny", "d2-sliding-batch"};
constexpr Precision kAllPrecisions[] = {Precision::kFp64, Precision::kBf16, Precision::kFp8};

std::string fixture_dir(const std::string& name) { return std::string(DFLASH_SOURCE_DIR) + "/fixtures/oracle/" + name; }

// Drafts the per-row argmax of its logits (lowest id on ties), as a drafter that skips the walk.
class ArgmaxProposer final : public ForwardingProposer {
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

ReplayResult replay_on(const Fixture& fixture, const DrafterConfig& config, bool argmax,
                       Dflash2Fault fault = Dflash2Fault::kNone, Precision precision = Precision::kFp64) {
  HeadSettings head = fixture.head;
  head.precision = precision;
  ReferenceOptions options;
  options.dflash2_fault = fault;
  std::unique_ptr<DraftProposer> drafter = make_reference_drafter(config, fixture.weights, head, options);
  if (argmax) drafter = std::make_unique<ArgmaxProposer>(std::move(drafter));
  return replay_fixture(fixture, {{drafter.get(), precision, true}}, {});
}

TEST(Dflash2Controls, TheReferenceItselfPasses) {
  for (const char* name : kFixtures) {
    Fixture fixture = read_fixture(fixture_dir(name));
    fixture.load_weights();
    for (Precision precision : kAllPrecisions) {
      const ReplayResult r = replay_on(fixture, fixture.config, false, Dflash2Fault::kNone, precision);
      EXPECT_TRUE(r.passed()) << name << " " << precision_name(precision);
    }
  }
}

// Every bundled DFlash2 fixture must fail, first at `stage`, on the reference with `fault` (and
// the config as `change` leaves it), in each of `precisions` (bf16 and fp8: against the wider
// bounds of those drafters, docs/tolerances.md).
void expect_first_divergence(const std::string& stage, Dflash2Fault fault,
                             const std::function<void(DrafterConfig*)>& change = nullptr,
                             std::vector<Precision> precisions = {Precision::kFp64}) {
  for (const char* name : kFixtures) {
    Fixture fixture = read_fixture(fixture_dir(name));
    fixture.load_weights();
    DrafterConfig config = fixture.config;
    if (change) change(&config);
    for (Precision precision : precisions) {
      const ReplayResult r = replay_on(fixture, config, false, fault, precision);
      ASSERT_FALSE(r.passed()) << name << " " << precision_name(precision);
      ASSERT_TRUE(r.first_divergence.has_value()) << name;
      EXPECT_EQ(r.first_divergence->stage, stage)
          << name << " " << precision_name(precision) << ": " << r.first_divergence->detail;
    }
  }
}


TEST(Dflash2Controls, WindowOfWInsteadOfWMinusOneFailsAtTheFirstAttention) {
  expect_first_divergence("L0.attn", Dflash2Fault::kNone, [](DrafterConfig* c) { c->dflash2.sliding_window += 1; },
                          {std::begin(kAllPrecisions), std::end(kAllPrecisions)});
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

TEST(Dflash2Controls, CausalBlockMaskFailsAtTheFirstAttention) {
  expect_first_divergence("L0.attn", Dflash2Fault::kCausalBlock, nullptr,
                          {std::begin(kAllPrecisions), std::end(kAllPrecisions)});
}

TEST(Dflash2Controls, ConvWrappingAcrossTheBlockBoundaryFailsAtTheFirstPrepare) {
  expect_first_divergence("L0.attn_conv_in", Dflash2Fault::kConvWraps, nullptr,
                          {std::begin(kAllPrecisions), std::end(kAllPrecisions)});
}

// The fixtures made with the reference (fixtures/dflash2/) against the faults they pin, in fp64:
// each fixture, the change, and the stage it must break first.
struct MadeControl {
  const char* fixture;
  const char* what;
  Dflash2Fault fault;
  std::function<void(DrafterConfig*)> change;
  const char* stage;
};

TEST(Dflash2Controls, TheFixturesMadeWithTheReferenceFailTheirControls) {
  const std::vector<MadeControl> controls = {
      // Made by the evicting reference: its ctx_proj holds the W - 1 rows retained, and a drafter
      // with W retains one more.
      {"d2-block-equals-window", "W instead of W - 1", Dflash2Fault::kNone,
       [](DrafterConfig* c) { c->dflash2.sliding_window += 1; }, "ctx_proj"},
      {"d2-block-equals-window", "causal block", Dflash2Fault::kCausalBlock, nullptr, "L0.attn"},
      {"d2-gamma-wider-than-block", "conv wraps", Dflash2Fault::kConvWraps, nullptr, "L0.attn_conv_in"},
      {"d2-gamma-wider-than-block", "layer 1 sliding", Dflash2Fault::kNone,
       [](DrafterConfig* c) { c->dflash2.sliding[1] = true; }, "L1.attn"},
      {"d2-scalars", "no embedding scale", Dflash2Fault::kNone,
       [](DrafterConfig* c) { c->dflash2.input_embedding_scale = 1.0; }, "embed"},
      {"d2-scalars", "no multiplier", Dflash2Fault::kNone, [](DrafterConfig* c) { c->dflash2.output_multiplier = 1.0; },
       "selector.unary"},
      {"d2-scalars", "no softcap", Dflash2Fault::kNone, [](DrafterConfig* c) { c->dflash2.final_logit_softcapping = 0; },
       "selector.unary"},
      // No taps in this one: a window fault is first seen at the logits.
      {"d2-batch-windows", "W instead of W - 1", Dflash2Fault::kNone,
       [](DrafterConfig* c) { c->dflash2.sliding_window += 1; }, "logits"},
  };
  for (const MadeControl& control : controls) {
    Fixture fixture = read_fixture(std::string(DFLASH_SOURCE_DIR) + "/fixtures/dflash2/" + control.fixture);
    fixture.load_weights();
    EXPECT_TRUE(replay_on(fixture, fixture.config, false).passed()) << control.fixture;
    DrafterConfig config = fixture.config;
    if (control.change) control.change(&config);
    const ReplayResult r = replay_on(fixture, config, false, control.fault);
    ASSERT_TRUE(r.first_divergence.has_value()) << control.fixture << ": " << control.what << " passes";
    EXPECT_EQ(r.first_divergence->stage, control.stage)
        << control.fixture << ": " << control.what << ": " << r.first_divergence->detail;
  }
  // The walk leaves the argmax somewhere in each: a drafter without the selector is named.
  for (const char* name : {"d2-block-equals-window", "d2-gamma-wider-than-block", "d2-scalars", "d2-batch-windows"}) {
    Fixture fixture = read_fixture(std::string(DFLASH_SOURCE_DIR) + "/fixtures/dflash2/" + name);
    fixture.load_weights();
    const ReplayResult r = replay_on(fixture, fixture.config, true);
    ASSERT_TRUE(r.first_divergence.has_value()) << name << ": argmax instead of the walk passes";
    EXPECT_EQ(r.first_divergence->criterion, "selector-not-applied") << name << ": " << r.first_divergence->detail;
  }
}

TEST(Dflash2Controls, PlantedFaultsNeedADflash2Drafter) {
  Fixture fixture = read_fixture(std::string(DFLASH_SOURCE_DIR) + "/fixtures/oracle/tiny-gqa");
  fixture.load_weights();
  ReferenceOptions options;
  options.dflash2_fault = Dflash2Fault::kConvWraps;
  try {
    make_reference_drafter(fixture.config, fixture.weights, fixture.head, options);
    ADD_FAILURE() << "a plain DFlash drafter accepted a planted DFlash2 fault";
  } catch (const HarnessError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_NE(std::string(e.what()).find("conv-wraps"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dflash
