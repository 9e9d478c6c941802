// The w8a8 reference (docs/spec/drafter.md §6: fp8 weights and per-token E4M3 activations) on every
// bundled oracle fixture, and its negative control.
//  - Clean, each fixture passes against its float64 expectations and against the bf16 reference,
//    both held to the w8a8 envelope (docs/tolerances.md, "The activation term"), every stage, draft
//    token and stored-state invariant.
//  - With an activation quantized without its scale (Fp8Fault::kUnscaledActivation: codes of x, not
//    of x / scale, the epilogue still multiplying by the scale), each fixture fails in all three
//    comparisons (the fixture, the bf16 envelope, the clean w8a8 reference), first at the output of
//    the first quantized GEMMs: L0.q, L0.k or L0.v (the first stages fixtures tap after attn_norm).
// Each comparison's worst error/bound is printed ([w8a8] lines; docs/tolerances.md §9 quotes them).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "compare/replay.h"
#include "core/error.h"
#include "fixtures/fixture.h"
#include "reference/reference_drafter.h"
#include "reference/reference_options.h"

namespace dflash {
namespace {

std::vector<std::string> oracle_fixtures() {
  std::vector<std::string> dirs;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(DFLASH_SOURCE_DIR) + "/fixtures/oracle")) {
    if (entry.is_directory() && std::filesystem::exists(entry.path() / "fixture.json")) dirs.push_back(entry.path().string());
  }
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

std::unique_ptr<DraftProposer> reference(const Fixture& fixture, Precision precision, Fp8Fault fault = Fp8Fault::kNone) {
  HeadSettings head = fixture.head;
  head.precision = precision;
  head.poison_freed_pages = true;
  ReferenceOptions options;
  options.fp8_fault = fault;
  return make_reference_drafter(fixture.config, fixture.weights, head, options);
}

// The clean K/V a w8a8 drafter must store (the kv-stored invariant of compare/kv_invariants.h).
ContextKvFunction w8a8_context_kv(const Fixture& fixture) {
  HeadSettings head = fixture.head;
  head.precision = Precision::kW8a8;
  const int64_t window = head.resolved(fixture.config).max_window(fixture.config);
  return make_reference_context_kv(fixture.config, fixture.weights, Precision::kW8a8, window);
}

// Lane 0: the w8a8 reference (with `fault`), compared with the fixture; lane 1: the bf16 reference
// (the envelope); with a fault, lane 2: the clean w8a8 reference (the same-precision pair).
ReplayResult replay_w8a8(const Fixture& fixture, Fp8Fault fault) {
  auto w8a8 = reference(fixture, Precision::kW8a8, fault);
  auto bf16 = reference(fixture, Precision::kBf16);
  auto clean = reference(fixture, Precision::kW8a8);
  std::vector<ReplayLane> lanes = {{w8a8.get(), Precision::kW8a8, true, w8a8_context_kv(fixture)},
                                   {bf16.get(), Precision::kBf16, false}};
  std::vector<CrossCheck> cross = {{1, 0}};
  if (fault != Fp8Fault::kNone) {
    lanes.push_back({clean.get(), Precision::kW8a8, false});
    cross.push_back({2, 0});
  }
  return replay_fixture(fixture, lanes, cross);
}

TEST(W8a8Oracle, TheCleanReferencePassesEveryFixture) {
  const std::vector<std::string> dirs = oracle_fixtures();
  ASSERT_GE(dirs.size(), 10u);
  double worst = 0;
  for (const std::string& dir : dirs) {
    Fixture fixture = read_fixture(dir);
    fixture.load_weights();
    const ReplayResult r = replay_w8a8(fixture, Fp8Fault::kNone);
    EXPECT_TRUE(r.passed()) << fixture.name << ": "
                            << (r.first_divergence ? r.first_divergence->stage + " " + r.first_divergence->detail : "");
    EXPECT_TRUE(r.invariant_failures.empty()) << fixture.name;
    for (size_t p = 0; p < r.pairs.size(); ++p) {
      const PairTotals t = pair_totals(r, static_cast<int>(p));
      std::printf("[w8a8] %-22s %-40s worst %s %.3f; draft tokens %d/%d/%d\n", fixture.name.c_str(),
                  r.pairs[p].label.c_str(), t.worst_stage.c_str(), t.worst_ratio, t.agree, t.excused, t.mismatch);
      EXPECT_EQ(t.mismatch, 0) << fixture.name << " " << r.pairs[p].label;
      worst = std::max(worst, t.worst_ratio);
    }
  }
  std::printf("[w8a8] clean: worst error/bound %.3f over %zu fixtures\n", worst, dirs.size());
  // Derived, not fitted, and still informative: a clean run reaches a fair part of its bounds.
  EXPECT_GT(worst, 0.1);
}

TEST(W8a8Oracle, AnUnscaledActivationFailsAtTheFirstGemmStage) {
  const std::set<std::string> first_gemm_stages = {"L0.q", "L0.k", "L0.v"};
  for (const std::string& dir : oracle_fixtures()) {
    Fixture fixture = read_fixture(dir);
    fixture.load_weights();
    const ReplayResult r = replay_w8a8(fixture, Fp8Fault::kUnscaledActivation);
    ASSERT_EQ(r.pairs.size(), 3u);
    EXPECT_FALSE(r.passed()) << fixture.name;
    for (size_t p = 0; p < r.pairs.size(); ++p) {
      const PairTotals t = pair_totals(r, static_cast<int>(p));
      ASSERT_TRUE(t.first_divergence.has_value()) << fixture.name << " " << r.pairs[p].label << " passed";
      const Divergence& d = *t.first_divergence;
      std::printf("[w8a8] unscaled-activation %-22s %-52s first: step %d %s %s %.3g\n", fixture.name.c_str(),
                  r.pairs[p].label.c_str(), d.step, d.stage.c_str(), d.criterion.c_str(), t.first_divergence_ratio);
      EXPECT_EQ(d.step, 0) << fixture.name << " " << r.pairs[p].label;
      EXPECT_TRUE(first_gemm_stages.count(d.stage)) << fixture.name << " " << r.pairs[p].label << ": " << d.stage;
    }
    EXPECT_FALSE(r.invariant_failures.empty()) << fixture.name << ": the stored K/V went unchecked";
  }
}

TEST(W8a8Oracle, TheUnscaledActivationNeedsW8a8) {
  Fixture fixture = read_fixture(oracle_fixtures().front());
  fixture.load_weights();
  for (Precision precision : {Precision::kFp8, Precision::kBf16}) {
    try {
      reference(fixture, precision, Fp8Fault::kUnscaledActivation);
      ADD_FAILURE() << "the unscaled-activation fault accepted in " << precision_name(precision);
    } catch (const HarnessError& e) {
      EXPECT_NE(std::string(e.what()).find("unscaled-activation"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("w8a8"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace dflash
