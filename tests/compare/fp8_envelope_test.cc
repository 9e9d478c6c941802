// The fp8 envelope (docs/tolerances.md §4): the reference emulating the CUDA drafter's E4M3 weights
// against the reference in bf16 and in fp64, every tap, the logits and the draft tokens held to the
// envelope derived from the quantization error measured on the weights at hand; and its negative
// controls: the same comparison with an fp8 GEMM bug of realistic size planted in the emulation
// (the neighbouring row's scale; the last K tile skipped) fails. A geometry with real-sized inner
// dimensions (K 1024-2816) and a small vocabulary keeps it to seconds; the real geometries run in the
// GPU gate (gpu_vs_reference_test, which also plants the bugs at the Qwen3-8B geometry).
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>

#include "compare/replay.h"
#include "compare/stage_ratios.h"
#include "core/error.h"
#include "fixtures/geometries.h"
#include "fixtures/random_drafter.h"
#include "fixtures/synthetic.h"
#include "reference/reference_drafter.h"
#include "reference/reference_options.h"

namespace dflash {
namespace {

DrafterGeometry envelope_geometry() {
  DrafterGeometry g;
  g.name = "envelope-h1024";
  g.hidden = 1024, g.layers = 2, g.heads = 8, g.kv_heads = 2, g.head_dim = 128, g.intermediate = 2816;
  g.vocab = 4096, g.block = 16, g.target_layer_ids = {1, 3}, g.theta = 1e6, g.mask_token_id = 5;
  return g;
}

// Rows of trained weights differ in size; with rows all alike a per-row scale bug has nothing to
// show (docs/tolerances.md, "Negative controls").
constexpr double kRowGainSpread = 1.5;

struct Setup {
  DrafterConfig config = make_config(envelope_geometry());
  std::shared_ptr<const DrafterWeights> weights;
  Fixture fixture;
  Setup() {
    RandomWeightRanges ranges;
    ranges.row_gain_spread = kRowGainSpread;
    weights = make_random_weights(config, 31, ranges);
    HeadSettings head;
    head.gamma = 16;
    head.ctx_cap = 4096;
    head.max_batch = 1;
    fixture = random_sequence_fixture("fp8-envelope", config, weights, head, {48, 5}, 11);
  }
  std::unique_ptr<DraftProposer> drafter(Precision precision, Fp8Fault fault = Fp8Fault::kNone) const {
    HeadSettings head = fixture.head;
    head.precision = precision;
    ReferenceOptions options;
    options.threads = 2;
    options.fp8_fault = fault;
    return make_reference_drafter(config, weights, head, options);
  }
};

const Setup& setup() {
  static const Setup s;
  return s;
}

// bf16 reference (expected) vs fp8 (actual), and fp64 reference vs the same fp8.
ReplayResult envelope_replay(Fp8Fault fault) {
  const Setup& s = setup();
  auto bf16 = s.drafter(Precision::kBf16), fp64 = s.drafter(Precision::kFp64), fp8 = s.drafter(Precision::kFp8, fault);
  const std::vector<ReplayLane> lanes = {{bf16.get(), Precision::kBf16, false},
                                         {fp8.get(), Precision::kFp8, false},
                                         {fp64.get(), Precision::kFp64, false}};
  ReplayResult r = replay_fixture(s.fixture, lanes, {{0, 1}, {2, 1}});
  for (size_t p = 0; p < r.pairs.size(); ++p) {
    std::printf("[envelope] %s\n%s", r.pairs[p].label.c_str(),
                format_stage_ratios(stage_ratios(r, static_cast<int>(p)), "[envelope]   ").c_str());
    const PairTotals t = pair_totals(r, static_cast<int>(p));
    std::printf("[envelope]   draft tokens: agree %d, tie-excused %d, mismatch %d\n", t.agree, t.excused, t.mismatch);
  }
  return r;
}

TEST(Fp8Envelope, CleanFp8IsInsideTheEnvelopeAgainstBf16AndFp64) {
  const ReplayResult r = envelope_replay(Fp8Fault::kNone);
  ASSERT_EQ(r.pairs.size(), 2u);
  EXPECT_TRUE(r.invariant_failures.empty());
  for (const SequenceResult& seq : r.sequences) {
    EXPECT_TRUE(seq.passed()) << r.pairs[seq.pair].label << " step " << seq.step << ": "
                              << (seq.divergence ? seq.divergence->stage + " " + seq.divergence->detail : "");
  }
  // The envelope is derived, not fitted; it must still be informative: on a clean run the logits'
  // norm error reaches a fair part of its bound (docs/tolerances.md states the ratio).
  for (size_t p = 0; p < r.pairs.size(); ++p) {
    for (const StageRatio& s : stage_ratios(r, static_cast<int>(p))) {
      if (s.stage == "logits") {
        EXPECT_GT(s.rel_rms_ratio(), 0.1) << r.pairs[p].label;
      }
    }
  }
}

void expect_caught(Fp8Fault fault) {
  const ReplayResult r = envelope_replay(fault);
  ASSERT_TRUE(r.first_divergence.has_value()) << fp8_fault_name(fault) << " passed the fp8 envelope";
  std::printf("[envelope] %s: first divergence at step %d, %s (%s)\n", fp8_fault_name(fault), r.first_divergence->step,
              r.first_divergence->stage.c_str(), r.first_divergence->criterion.c_str());
  for (size_t p = 0; p < r.pairs.size(); ++p) {
    EXPECT_GT(pair_totals(r, static_cast<int>(p)).failed_sequences, 0) << r.pairs[p].label;
  }
}

TEST(Fp8Envelope, PlantedNeighbourRowScaleFails) { expect_caught(Fp8Fault::kNeighbourRowScale); }
TEST(Fp8Envelope, PlantedSkippedKTileFails) { expect_caught(Fp8Fault::kSkippedKTile); }

TEST(Fp8Envelope, PlantedFaultNeedsFp8) {
  HeadSettings head = setup().fixture.head;
  head.precision = Precision::kBf16;
  ReferenceOptions options;
  options.fp8_fault = Fp8Fault::kSkippedKTile;
  try {
    make_reference_drafter(setup().config, setup().weights, head, options);
    ADD_FAILURE() << "a planted fp8 fault accepted in bf16 mode";
  } catch (const HarnessError& e) {
    EXPECT_NE(std::string(e.what()).find("skipped-k-tile"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dflash
