// The CUDA drafter against the CPU reference, through the replay engine and compare/'s tolerance
// model (docs/tolerances.md), on every oracle fixture of fixtures/oracle (all steps, every tap) and
// on the real geometries of docs/spec/drafter.md §8 and Qwen3.8-27B-DFlash2 (docs/spec/dflash2.md §1)
// with random weights:
//   - same precision (bf16 vs the bf16-emulating reference, fp8 vs the fp8-emulating reference,
//     which holds the same E4M3 codes): the tight bf16-boundary model;
//   - the fp8 envelope: CUDA fp8 against the bf16 reference, derived from the quantization error
//     measured on the weights at hand;
//   - on the oracle fixtures, the CUDA drafter against the float64 expectations (the envelope for
//     fp8, the bf16 boundaries for bf16).
// Draft tokens must agree on every row whose top-2 margin exceeds the logits' noise (compare/tokens.h).
// The first stage out of bounds is named; each pair prints its observed/bound ratio per stage
// ([ratios] lines) and one summary line ([oracle] / [geometry]) that the GPU gate collects.
// The real-geometry test also runs the envelope's negative controls on the CPU: the fp8-emulating
// reference with a planted fp8 bug (the neighbouring row's scale; the last K tile skipped) must
// leave the envelope.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "compare/replay.h"
#include "compare/stage_ratios.h"
#include "core/error.h"
#include "cuda/drafter/cuda_drafter.h"
#include "fixtures/fixture.h"
#include "fixtures/synthetic.h"
#include "reference/reference_drafter.h"
#include "reference/reference_options.h"
#include "testing/gpu_test_util.h"
#include "fixtures/geometries.h"
#include "fixtures/random_drafter.h"

namespace dflash {
namespace {

namespace fs = std::filesystem;

std::unique_ptr<DraftProposer> reference(const Fixture& f, Precision precision, Fp8Fault fault = Fp8Fault::kNone) {
  HeadSettings settings = f.head;
  settings.precision = precision;
  ReferenceOptions options;
  options.threads = reference_threads_from_env();
  options.fp8_fault = fault;
  return make_reference_drafter(f.config, f.weights, settings, options);
}

std::unique_ptr<DraftProposer> cuda(const Fixture& f, Precision precision) {
  HeadSettings settings = f.head;
  settings.precision = precision;
  return make_cuda_drafter(f.config, f.weights, settings, CudaOptions{});
}

// Prints every pair's ratios and one summary line per pair; fails naming the first divergence.
void judge(const ReplayResult& r, const std::string& tag, const std::string& what) {
  for (size_t p = 0; p < r.pairs.size(); ++p) {
    const std::vector<StageRatio> ratios = stage_ratios(r, static_cast<int>(p));
    std::printf("[ratios] %s %s\n%s", what.c_str(), r.pairs[p].label.c_str(),
                format_stage_ratios(ratios, "[ratios]   ").c_str());
    double worst_rms = 0, worst_tail = 0, logits_rms = 0, logits_tail = 0;
    std::string worst_rms_stage, worst_tail_stage;
    for (const StageRatio& s : ratios) {
      if (s.rel_rms_ratio() > worst_rms) worst_rms = s.rel_rms_ratio(), worst_rms_stage = s.stage;
      if (s.max_rel_ratio() > worst_tail) worst_tail = s.max_rel_ratio(), worst_tail_stage = s.stage;
      if (s.stage == "logits") logits_rms = s.rel_rms_ratio(), logits_tail = s.max_rel_ratio();
    }
    const PairTotals t = pair_totals(r, static_cast<int>(p));
    std::printf("[%s] %-26s %-34s logits relRMS/bound %.3f maxRel/bound %.3f; worst relRMS %.3f (%s) maxRel %.3f (%s); "
                "tokens agree %d tie-excused %d mismatch %d; failed %d of %d\n",
                tag.c_str(), what.c_str(), r.pairs[p].label.c_str(), logits_rms, logits_tail, worst_rms,
                worst_rms_stage.c_str(), worst_tail, worst_tail_stage.c_str(), t.agree, t.excused, t.mismatch,
                t.failed_sequences, t.sequences);
  }
  EXPECT_TRUE(r.invariant_failures.empty()) << what << ": " << r.invariant_failures.size() << " invariant failures";
  if (r.first_divergence) {
    const Divergence& d = *r.first_divergence;
    ADD_FAILURE() << what << ": " << d.pair << " first diverges at step " << d.step << ", sequence " << d.seq << ", "
                  << d.stage << " (" << d.criterion << "): " << d.detail;
  }
}

// bf16: the reference in bf16 vs CUDA bf16 (tight). fp8: the fp8 reference vs CUDA fp8 (tight) and
// the bf16 reference vs CUDA fp8 (the envelope). `with_fixture`: CUDA also against the fixture.
ReplayResult replay_pairs(const Fixture& f, Precision precision, bool with_fixture) {
  auto same = reference(f, precision);
  auto gpu = cuda(f, precision);
  std::vector<ReplayLane> lanes = {{same.get(), precision, false}, {gpu.get(), precision, with_fixture}};
  std::vector<CrossCheck> checks = {{0, 1}};
  std::unique_ptr<DraftProposer> bf16;
  if (precision == Precision::kFp8) {
    bf16 = reference(f, Precision::kBf16);
    lanes.push_back({bf16.get(), Precision::kBf16, false});
    checks.push_back({2, 1});
  }
  return replay_fixture(f, lanes, checks);
}

std::vector<std::string> oracle_fixtures() {
  std::vector<std::string> dirs;
  const fs::path root = fs::path(DFLASH_SOURCE_DIR) / "fixtures" / "oracle";
  if (!fs::is_directory(root)) return dirs;
  for (const auto& entry : fs::directory_iterator(root)) {
    if (fs::exists(entry.path() / "fixture.json")) dirs.push_back(entry.path().string());
  }
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

TEST(CudaVsReference, EveryOracleFixtureInBothPrecisions) {
  DFLASH_REQUIRE_GPU();
  const std::vector<std::string> dirs = oracle_fixtures();
  ASSERT_GE(dirs.size(), 10u) << "fixtures/oracle is missing fixtures";
  for (const std::string& dir : dirs) {
    Fixture f = read_fixture(dir);
    f.load_weights();
    for (Precision precision : {Precision::kBf16, Precision::kFp8}) {
      judge(replay_pairs(f, precision, true), "oracle", f.name + " " + precision_name(precision));
    }
  }
}

// The NVFP4 head runs on exactly the draft rows of each propose: batch 4 of nvfp4-tiny-gqa
// (gamma 8) at widths 8, 4, 7, 2 (4 x 3 = 12 and 4 x 6 = 24 draft rows: more than gamma, and a
// second 16-row tile). A launch on gamma rows, or on the rows of an earlier, wider propose, leaves
// rows unwritten or stale, which the per-sequence comparison with the reference catches; every
// sequence must get exactly width - 1 logit rows and tokens.
TEST(CudaVsReference, Nvfp4HeadBatchedBelowGamma) {
  DFLASH_REQUIRE_GPU();
  Fixture f = read_fixture(std::string(DFLASH_SOURCE_DIR) + "/fixtures/oracle/nvfp4-tiny-gqa");
  f.load_weights();
  ASSERT_TRUE(f.weights->nvfp4_head());
  ASSERT_EQ(f.head.gamma, 8);
  const int batch = 4;
  f.name += "-batch4";
  f.head.max_batch = batch;
  f.steps.clear();
  int64_t next[batch] = {0, 0, 0, 0};
  for (int width : {8, 4, 7, 2}) {
    FixtureStep step;
    for (int s = 0; s < batch; ++s) {
      ProposeEntry e;
      e.seq = s;
      e.ctx = make_random_context(5 + s, f.config.ctx_feature_dim(), 300 + 10 * s + width);
      next[s] += e.ctx.rows();  // the anchor follows its context
      e.start = next[s];
      e.anchor = 17 * (s + 1) + width;
      e.block_width = width;
      step.propose.push_back(std::move(e));
    }
    f.steps.push_back(std::move(step));
  }
  for (Precision precision : {Precision::kBf16, Precision::kFp8}) {
    const ReplayResult r = replay_pairs(f, precision, false);
    judge(r, "nvfp4", std::string("nvfp4 batch 4 below gamma ") + precision_name(precision));
    // Every comparison saw each sequence at each step: a launch on gamma rows, or rows left from an
    // earlier, wider propose, shows as a failed sequence of the pair.
    for (size_t p = 0; p < r.pairs.size(); ++p) {
      const PairTotals t = pair_totals(r, static_cast<int>(p));
      EXPECT_EQ(t.sequences, batch * 4) << r.pairs[p].label;
    }
  }
}

// `rows`: the new context rows of each propose of sequences 0 .. batch-1; `precisions`: the CUDA
// drafter's modes compared (fp8 against both references).
void real_geometry(const DrafterGeometry& g, const std::vector<int64_t>& rows, int batch = 1,
                   const std::vector<Precision>& precisions = {Precision::kBf16, Precision::kFp8}) {
  const auto t0 = std::chrono::steady_clock::now();
  const DrafterConfig config = make_config(g);
  HeadSettings head;
  head.gamma = g.block;
  head.ctx_cap = 4096;
  head.max_batch = batch;
  const std::string name = g.name + (batch > 1 ? "-batch" + std::to_string(batch) : "");
  const Fixture f = random_sequence_fixture(name, config, make_random_weights(config, 2024), head, rows, 77, batch);
  for (Precision precision : precisions) {
    judge(replay_pairs(f, precision, false), "geometry", name + " " + precision_name(precision));
    std::printf("[geometry] %s %s done [%.0f s so far]\n", name.c_str(), precision_name(precision),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    std::fflush(stdout);  // a call that runs out of time still shows each finished mode's ratios
  }
}

// The envelope's negative controls at a real geometry, on the CPU: weights whose rows differ in
// size (as trained weights' do; with rows all alike a per-row scale bug has nothing to show).
void planted_fp8_faults(const DrafterGeometry& g) {
  const DrafterConfig config = make_config(g);
  HeadSettings head;
  head.gamma = g.block;
  head.ctx_cap = 4096;
  head.max_batch = 1;
  RandomWeightRanges ranges;
  ranges.row_gain_spread = 1.5;
  const Fixture f = random_sequence_fixture(g.name + "-row-gains", config, make_random_weights(config, 2025, ranges),
                                            head, {20}, 78);
  for (Fp8Fault fault : {Fp8Fault::kNone, Fp8Fault::kNeighbourRowScale, Fp8Fault::kSkippedKTile}) {
    auto bf16 = reference(f, Precision::kBf16);  // a fresh drafter per replay: the fixture adds its sequences
    auto fp8 = reference(f, Precision::kFp8, fault);
    const ReplayResult r =
        replay_fixture(f, {{bf16.get(), Precision::kBf16, false}, {fp8.get(), Precision::kFp8, false}}, {{0, 1}});
    const std::string what = g.name + " " + (fault == Fp8Fault::kNone ? "clean" : fp8_fault_name(fault));
    if (fault == Fp8Fault::kNone) {
      judge(r, "planted", what);
      continue;
    }
    const std::vector<StageRatio> ratios = stage_ratios(r, 0);
    double worst = 0;
    for (const StageRatio& s : ratios) worst = std::max({worst, s.rel_rms_ratio(), s.max_rel_ratio()});
    std::printf("[planted] %-26s first divergence %s; worst error/bound %.2f\n", what.c_str(),
                r.first_divergence ? (r.first_divergence->stage + " (" + r.first_divergence->criterion + ")").c_str()
                                   : "none",
                worst);
    EXPECT_TRUE(r.first_divergence.has_value()) << what << ": the planted fp8 bug stays inside the envelope";
  }
}

// Two proposes: 20 new context rows, then 3 more (the first rows are read from the cache).
const std::vector<int64_t> kTwoProposes = {20, 3};

TEST(CudaVsReferenceRealGeometry, Qwen3_8B) {
  DFLASH_REQUIRE_GPU();
  real_geometry(qwen3_8b_geometry(), kTwoProposes);
}
// Batches of 8 and 32 (128 and 512 block rows): the block GEMMs go to the libraries
// (gemm_m64=library, the default) at the real shapes.
TEST(CudaVsReferenceRealGeometry, Qwen3_8B_Batch8) {
  DFLASH_REQUIRE_GPU();
  real_geometry(qwen3_8b_geometry(), {6}, 8);
}
// Batch 32, one test per mode (the CPU reference at 512 block rows is the slow part), so a call
// with little device time left can run one (ci/gpu-gate.sh --batched-geometry=32-bf16 / =32-fp8).
TEST(CudaVsReferenceRealGeometry, Qwen3_8B_Batch32_Bf16) {
  DFLASH_REQUIRE_GPU();
  real_geometry(qwen3_8b_geometry(), {6}, 32, {Precision::kBf16});
}
TEST(CudaVsReferenceRealGeometry, Qwen3_8B_Batch32_Fp8) {
  DFLASH_REQUIRE_GPU();
  real_geometry(qwen3_8b_geometry(), {6}, 32, {Precision::kFp8});
}
TEST(CudaVsReferenceRealGeometry, Qwen3_4B) {
  DFLASH_REQUIRE_GPU();
  real_geometry(qwen3_4b_geometry(), kTwoProposes);
}
TEST(CudaVsReferenceRealGeometry, GptOss20B) {
  DFLASH_REQUIRE_GPU();
  real_geometry(gpt_oss_20b_geometry(), kTwoProposes);
}
// One propose over 20 context rows: convolutions, sliding non-causal layers (the window holds the
// whole context here; the window edge is pinned by the DFlash2 oracle fixtures) and the selector
// over V 248320 with K 16, r 256.
TEST(CudaVsReferenceRealGeometry, Qwen3_8_27B_Dflash2) {
  DFLASH_REQUIRE_GPU();
  real_geometry(qwen3_8_27b_dflash2_geometry(), {20});
}
TEST(CudaVsReferenceRealGeometry, PlantedFp8FaultsLeaveTheEnvelopeQwen3_8B) {
  DFLASH_REQUIRE_GPU();  // CPU only, but at a size that belongs to the gate's machine
  planted_fp8_faults(qwen3_8b_geometry());
}

}  // namespace
}  // namespace dflash
