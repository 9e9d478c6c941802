// The CPU catch suite (docs/catch-rate.md): planted bugs in test-only variants of the reference
// (tests/properties/broken_proposers.h), each declaring the check that must catch it and the first
// stage that check must name. Fixture-visible bugs run through the replay engine that
// `dflash-harness replay` uses, on the bundled fixture that shows them; the others through their
// RapidCheck property. Prints the catch table (and writes it to catch-table.md in the working
// directory); a miss, or a catch by another check or at another stage, fails the test.
#include <algorithm>
#include <optional>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "compare/acceptance.h"
#include "compare/catch_table.h"
#include "compare/divergence.h"
#include "compare/replay.h"
#include "core/error.h"
#include "compare/text_format.h"
#include "fixtures/fixture.h"
#include "reference/reference_options.h"
#include "tests/properties/backends.h"
#include "tests/properties/broken_proposers.h"
#include "tests/properties/broken_variants.h"
#include "tests/properties/property_check.h"

namespace dflash {
namespace {

using prop::Backend;

std::string fixture_path(const std::string& relative) { return std::string(DFLASH_SOURCE_DIR) + "/fixtures/" + relative; }

// The candidate precision of every replay row: fp32, the reference's fast mode, so that a bug
// must stand out of a real drafter's tolerance (an fp64 lane's bound would flag far less).
constexpr Precision kLanePrecision = Precision::kFp32;

// How a row's drafter is replayed: at `precision`, alone against the fixture, or (`tight`) as the
// candidate of the working reference at the same precision, the pair of the tight model that
// `dflash-harness replay --backend both` forms with a CUDA drafter (docs/tolerances.md §4).
struct Lanes {
  Precision precision = kLanePrecision;
  bool tight = false;
  int tp_size = 1;  // both lanes emulate TP = N (docs/spec/tensor-parallel.md)
};

// As `dflash-harness replay` runs a drafter: freed pages poisoned, and the stored K/V checked
// against the reference's recomputation (compare/kv_invariants.h) after every step.
ReplayResult replay_on(const Backend& backend, const std::string& fixture_dir, const Lanes& lanes = {}) {
  Fixture fixture = read_fixture(fixture_path(fixture_dir));
  fixture.load_weights();
  HeadSettings head = fixture.head;
  head.poison_freed_pages = true;
  head.tp_size = lanes.tp_size;
  const Precision p = lanes.precision;
  const int64_t window = head.resolved(fixture.config).max_window(fixture.config);
  std::unique_ptr<DraftProposer> proposer = backend.build(fixture.config, fixture.weights, head, p);
  ContextKvFunction recompute = backend.kv_oracle(fixture.config, fixture.weights, p, window);
  ReplayOptions options;
  options.tp_size = lanes.tp_size;  // a divergence names its ranks
  if (!lanes.tight) return replay_fixture(fixture, {{proposer.get(), p, true, recompute}}, {}, options);
  std::unique_ptr<DraftProposer> working = prop::reference_backend().build(fixture.config, fixture.weights, head, p);
  return replay_fixture(fixture, {{working.get(), p, true, recompute}, {proposer.get(), p, false, recompute}},
                        {{0, 1}}, options);
}

// The drafter under test: the only lane, or in a tight replay the candidate beside the working
// reference.
int lane_under_test(const Lanes& lanes) { return lanes.tight ? 1 : 0; }

// The mean greedy acceptance length (compare/acceptance.h) of the drafter under test against the
// fixture's target side, or, for a fixture without one, against a target that drafts as its
// comparison's expected side: the fixture's fp64 expectations (what the working reference drafts,
// up to exact ties), or in a tight replay the working reference at the same precision.
std::optional<double> mean_acceptance_length(const ReplayResult& r, const Lanes& lanes) {
  const int lane = lane_under_test(lanes);
  if (const SideAcceptance* side = r.acceptance.side_of_lane(lane)) return side->mean_length;
  double sum = 0;
  int blocks = 0;
  for (const SequenceResult& s : r.sequences) {
    if (r.pairs[static_cast<size_t>(s.pair)].actual_lane != lane || !s.tokens) continue;
    std::vector<int32_t> expected, actual;
    for (const TokenRow& row : s.tokens->rows) {
      expected.push_back(row.expected);
      actual.push_back(row.actual);
    }
    sum += 1.0 + greedy_accepted(actual, expected);
    ++blocks;
  }
  if (blocks == 0) return std::nullopt;
  return sum / blocks;
}

// "-1.77 (2.77 -> 1.00; canary, pinned)": the bug's change against the working drafter's.
std::string acceptance_change(const std::optional<double>& working, const ReplayResult& broken, const Lanes& lanes) {
  std::vector<std::string> checks;
  for (const AcceptanceFailure& f : broken.acceptance.failures) {
    const std::string name = f.check == "canary" ? "canary" : "pinned";
    if (std::find(checks.begin(), checks.end(), name) == checks.end()) checks.push_back(name);
  }
  return format_acceptance_change(working, mean_acceptance_length(broken, lanes), checks);
}

// What the replay named first (compare/catch_table.h first_failure).
CatchResult judge_replay(const PlantedBug& bug, const ReplayResult& result) {
  CatchResult r;
  r.bug = bug;
  std::optional<ReplayFailure> divergence;
  if (result.first_divergence) {
    divergence = ReplayFailure{result.first_divergence->step, CatchCheck::kReplay, result.first_divergence->stage,
                               describe_divergence(*result.first_divergence)};
  }
  std::vector<ReplayFailure> invariants;
  for (const InvariantFailure& f : result.invariant_failures) {
    invariants.push_back({f.step, CatchCheck::kInvariant, f.invariant, "step " + std::to_string(f.step) + ": " + f.detail});
  }
  if (const std::optional<ReplayFailure> first = first_failure(divergence, invariants)) {
    r.caught = true, r.check = first->check, r.named = first->named, r.detail = first->detail;
  }
  return r;
}

struct ReplayBug {
  PlantedBug bug;
  std::function<Backend(const Backend&)> breaker;
  Lanes lanes = {};
};

// Declared first stages follow from where each fault enters the forward pass (drafter.md §7).
std::vector<ReplayBug> replay_bugs() {
  const CatchCheck replay = CatchCheck::kReplay;
  return {
      // The context keys are rotated and stored before the block's queries: kv-stored comes first.
      {{"default-rope-theta", "RoPE frequencies", CatchCheck::kInvariant, "kv-stored", "oracle/tiny-gqa"},
       prop::default_rope_theta},
      {{"bf16-posing-as-fp32", "precision", replay, "ctx_proj", "oracle/tiny-gqa"}, prop::bf16_posing_as_fp32},
      {{"leaky-batch", "leak between sequences", replay, "ctx_proj", "oracle/batch-widths-release"}, prop::leaky_batch},
      {{"stale-graph-replay", "per-step value baked into a graph", replay, "logits", "oracle/tiny-mha"},
       prop::stale_graph_replay},
      {{"row-past-the-block", "guard-band overrun", replay, "logits", "oracle/tiny-mha"}, prop::row_past_the_block},
      {{"clamp-off-by-one", "block width clamp", replay, "embed", "oracle/batch-widths-release"}, prop::clamp_off_by_one},
      {{"highest-index-ties", "argmax tie order", CatchCheck::kInvariant, "draft-argmax", "blind-spots/logit-ties"},
       prop::highest_index_ties},
      {{"unfloored-clamp-g0", "width floor of 2", replay, "logits", "blind-spots/gamma0-batch3"}, prop::unfloored_clamp},
      {{"unfloored-clamp-g1", "width floor of 2", replay, "logits", "blind-spots/gamma1-batch3"}, prop::unfloored_clamp},
      {{"ignored-norm-eps", "eps ignored", replay, "ctx_proj", "blind-spots/norm-eps"}, prop::ignored_norm_eps},
      {{"window-off-by-one-cap4", "window edge", replay, "ctx_proj", "blind-spots/window-cap4"}, prop::window_off_by_one},
      {{"window-off-by-one-cap8", "window edge", replay, "ctx_proj", "blind-spots/window-cap8"}, prop::window_off_by_one},
      {{"window-off-by-one-cap16", "window edge", replay, "ctx_proj", "blind-spots/window-cap16"}, prop::window_off_by_one},
      {{"stale-context-row", "stale row in the cache", replay, "ctx_proj", "blind-spots/long-window"},
       prop::stale_context_row},
      // One stale key among more than 512: its weight in attention is diluted, the per-key check is not.
      {{"stale-key-long-window", "stale key in a long window", CatchCheck::kInvariant, "kv-stored",
        "blind-spots/long-window"},
       prop::planting(PlantedFault::kStaleKey, "stale-key")},
      // fp8 drafters on the known-acceptance fixtures: the stage verdict and the acceptance they cost.
      // The context keys go through the broken k_proj before any block row: kv-stored comes first.
      {{"skipped-k-tile", "fp8 GEMM K tile (fp8)", CatchCheck::kInvariant, "kv-stored", "acceptance/target-is-reference"},
       prop::planting(Fp8Fault::kSkippedKTile),
       {Precision::kFp8, false}},
      {{"quantized-drafter", "quantized drafter (fp8)", replay, "logits", "acceptance/controlled-distance"},
       prop::planting(Fp8Fault::kQuantizedDrafter),
       {Precision::kFp8, false}},
      // Rounding toward zero: every error under one ulp, so only the rounding-bias check of the
      // pairs that round at the same points sees it (the stored K/V against their recomputation;
      // the working reference against the planted one, both bf16).
      {{"truncated-kv-store", "rounding bias", CatchCheck::kInvariant, "kv-stored", "oracle/tiny-gqa"},
       prop::planting(RoundingFault::kTruncatedKvStore), {Precision::kBf16, false}},
      {{"truncated-swiglu", "rounding bias", replay, "L0.mlp", "oracle/tiny-gqa"},
       prop::planting(RoundingFault::kTruncatedActivation), {Precision::kBf16, true}},
      // Tensor parallelism (docs/spec/tensor-parallel.md), both lanes at TP = 2: layer 0's o_proj keeps
      // rank 0's partial (a missing all-reduce); everything before it is TP = 1's bits.
      {{"missing-all-reduce", "missing all-reduce (tp 2)", replay, "L0.o_proj", "oracle/tiny-mha"},
       prop::planting(TpFault::kMissingAllReduce), {kLanePrecision, true, 2}},
      // The same lanes: the logits are right and a draft token is a shard's best under another
      // shard's offset, far below the row's top (the token comparison names it before the
      // draft-argmax invariant of the same step); at step 1, the first row whose best is past V/2.
      {{"vocab-offset", "vocabulary offset off by one block (tp 2)", replay, "draft_tokens", "oracle/tiny-mha"},
       prop::planting(TpFault::kVocabOffset), {kLanePrecision, true, 2}},
      // The logits are right; the selector's candidates are rank 0's (ids below V/2) where the row's
      // top-K reaches past them: its first tap shows it.
      {{"shard-topk-unmerged", "per-shard top-K never merged (tp 2)", replay, "selector.topk_ids", "oracle/d2-tiny"},
       prop::planting(TpFault::kShardTopKUnmerged), {kLanePrecision, true, 2}},
      // q, k and v are right (column-parallel, TP = 1's bits); attention reads the other shard's heads.
      {{"wrong-shard-kv-heads", "KV heads on the wrong shard (tp 2)", replay, "L0.attn", "oracle/tiny-mha"},
       prop::planting(TpFault::kWrongShardKvHeads), {kLanePrecision, true, 2}},
      // The stale-graph classes on a trace that interleaves widths, batches, releases and window
      // growth (blind-spots/serving-loop), as a CUDA drafter with graphs after one eager pass would
      // compute them: a graph of another batch, or of a wider block, serves a propose; a baked page
      // table, or a plan of a shorter window, feeds attention. The fixture holds logits and draft
      // tokens only, so each is first seen at the logits.
      {{"graph-keyed-by-width", "graph keyed by width alone", replay, "logits", "blind-spots/serving-loop"},
       prop::graph_keyed_by_width},
      {{"baked-page-table", "page table baked at capture", replay, "logits", "blind-spots/serving-loop"},
       prop::planting(PlantedFault::kBakedPageTable, "baked-page-table")},
      {{"padded-width-graph", "scratch shared between two widths", replay, "logits", "blind-spots/serving-loop"},
       prop::padded_width_graph},
      {{"stale-attention-plan", "stale attention plan after a window change", replay, "logits",
        "blind-spots/serving-loop"},
       prop::planting(PlantedFault::kStaleAttentionPlan, "stale-attention-plan")},
  };
}

// Bugs no fixture shows (they differ from the working proposer by an ulp or only in state after a
// refused call): their property is the check. The declared name is the property's message.
std::vector<std::string> property_only_variants() { return {"NonAtomicExhaustion", "PageDependent", "Nondeterministic"}; }

// "oracle/tiny-gqa (bf16, tight)"
std::string replay_name(const std::string& dir, const Lanes& lanes) {
  return dir + " (" + precision_name(lanes.precision) + (lanes.tight ? ", tight" : "") +
         (lanes.tp_size > 1 ? ", tp " + std::to_string(lanes.tp_size) : "") + ")";
}

// Every (fixture, lanes) the rows replay, once each.
std::vector<std::pair<std::string, Lanes>> replays_of(const std::vector<ReplayBug>& bugs) {
  std::vector<std::pair<std::string, Lanes>> replays;
  for (const ReplayBug& b : bugs) {
    const bool seen = std::any_of(replays.begin(), replays.end(), [&](const auto& r) {
      return r.first == b.bug.where && r.second.precision == b.lanes.precision && r.second.tight == b.lanes.tight &&
             r.second.tp_size == b.lanes.tp_size;
    });
    if (!seen) replays.emplace_back(b.bug.where, b.lanes);
  }
  return replays;
}

// The naming rule: the earliest step; within a step ctx_proj, kv-stored, other stages, other invariants.
TEST(CatchSuite, FirstFailureFollowsTheOrderOfAPropose) {
  const CatchCheck replay = CatchCheck::kReplay, invariant = CatchCheck::kInvariant;
  auto named = [](const std::optional<ReplayFailure>& d, const std::vector<ReplayFailure>& inv) {
    const std::optional<ReplayFailure> f = first_failure(d, inv);
    return f ? f->named + "@" + std::to_string(f->step) : std::string("none");
  };
  EXPECT_EQ(named(std::nullopt, {}), "none");
  EXPECT_EQ(named(ReplayFailure{2, replay, "L0.q", ""}, {}), "L0.q@2");
  EXPECT_EQ(named(ReplayFailure{2, replay, "L0.q", ""}, {{1, invariant, "attention-window", ""}}), "attention-window@1");
  EXPECT_EQ(named(ReplayFailure{2, replay, "L0.q", ""}, {{2, invariant, "attention-window", ""}}), "L0.q@2");
  EXPECT_EQ(named(ReplayFailure{2, replay, "L0.q", ""}, {{2, invariant, "attention-window", ""}, {2, invariant, "kv-stored", ""}}),
            "kv-stored@2");
  EXPECT_EQ(named(ReplayFailure{2, replay, "ctx_proj", ""}, {{2, invariant, "kv-stored", ""}}), "ctx_proj@2");
  EXPECT_EQ(named(std::nullopt, {{3, invariant, "kv-outside-window", ""}, {3, invariant, "kv-poison", ""}}),
            "kv-outside-window@3");
}

// The control: the working reference passes every fixture the suite uses (no false alarm).
TEST(CatchSuite, WorkingReferencePassesEveryFixture) {
  const Backend working = prop::reference_backend();
  for (const auto& [dir, lanes] : replays_of(replay_bugs())) {
    SCOPED_TRACE(replay_name(dir, lanes));
    const ReplayResult result = replay_on(working, dir, lanes);
    EXPECT_TRUE(result.passed()) << replay_name(dir, lanes) << ": "
                                 << (result.first_divergence ? describe_divergence(*result.first_divergence)
                                                             : std::string("an invariant failed"));
  }
}

TEST(CatchSuite, EveryPlantedBugCaughtAsDeclared) {
  const Backend working = prop::reference_backend();
  std::map<std::string, std::optional<double>> working_length;  // by replay_name
  for (const auto& [dir, lanes] : replays_of(replay_bugs())) {
    working_length[replay_name(dir, lanes)] = mean_acceptance_length(replay_on(working, dir, lanes), lanes);
  }
  std::vector<CatchResult> results;
  for (const ReplayBug& b : replay_bugs()) {
    try {
      const ReplayResult broken = replay_on(b.breaker(working), b.bug.where, b.lanes);
      results.push_back(judge_replay(b.bug, broken));
      results.back().acceptance =
          acceptance_change(working_length[replay_name(b.bug.where, b.lanes)], broken, b.lanes);
    } catch (const HarnessError& e) {
      CatchResult r;
      r.bug = b.bug;
      r.detail = std::string("replay stopped: ") + e.what();
      results.push_back(r);
    }
  }
  for (const prop::BrokenVariant& v : prop::generic_broken_variants()) {
    const std::vector<std::string> wanted = property_only_variants();
    if (std::find(wanted.begin(), wanted.end(), v.name) == wanted.end()) continue;
    CatchResult r;
    r.bug = {v.name, "property-only", CatchCheck::kProperty, v.expected_message, "property, seed 1"};
    const Backend broken = v.breaker(working);
    std::string failure;
    if (prop::property_fails(v.cases, /*seed=*/1, [&] { v.property(working, broken); }, &failure)) {
      r.caught = true, r.check = CatchCheck::kProperty;
      r.named = failure.find(v.expected_message) != std::string::npos ? v.expected_message : failure.substr(0, 60);
      r.detail = failure;
    }
    results.push_back(r);
  }
  // Property 11 against the stale-graph classes, from seed 1 (the CUDA plants' CPU emulations).
  const std::map<std::string, std::string> classes = {
      {"GraphKeyedByWidth", "graph keyed by width alone"},
      {"PageTableBakedAtCapture", "page table baked at capture"},
      {"PaddedWidthGraph", "scratch shared between two widths"},
      {"StaleAttentionPlan", "stale attention plan after a window change"}};
  for (const prop::BrokenVariant& v : prop::serving_loop_variants()) {
    CatchResult r;
    r.bug = {v.name, classes.at(v.name), CatchCheck::kProperty, v.expected_message, "property 11, seed 1"};
    std::string failure;
    if (prop::property_fails(v.cases, /*seed=*/1, [&] { v.property(working, v.breaker(working)); }, &failure)) {
      r.caught = true, r.check = CatchCheck::kProperty;
      r.named = failure.find(v.expected_message) != std::string::npos ? v.expected_message : failure.substr(0, 60);
      r.detail = failure;
    }
    results.push_back(r);
  }

  const std::string table = format_catch_table(results);
  std::cout << table << catch_summary(results) << "\n";
  for (const CatchResult& r : results) {  // the harness's own words for each catch
    if (r.caught && r.check != CatchCheck::kProperty) std::cout << "  " << r.bug.id << ": " << r.detail << "\n";
  }
  std::ofstream("catch-table.md") << table;
  for (const CatchResult& r : results) {
    EXPECT_TRUE(r.as_declared()) << r.bug.id << " on " << r.bug.where << ": "
                                 << (r.caught ? std::string("caught by ") + catch_check_name(r.check) + " at '" +
                                                    r.named + "', declared " + catch_check_name(r.bug.declared_check) +
                                                    " at '" + r.bug.declared_stage + "'"
                                              : std::string("missed"))
                                 << "\n  " << r.detail;
  }
}

}  // namespace
}  // namespace dflash
