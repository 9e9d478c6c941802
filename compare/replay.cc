#include "compare/replay.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "compare/invariants.h"
#include "compare/kv_invariants.h"
#include "compare/selector_alignment.h"
#include "compare/tp_attribution.h"
#include "compare/wire_rounding.h"
#include "core/stages.h"
#include "core/error.h"
#include "core/kv_pages.h"

namespace dflash {
namespace {

// A stage the expected side has and the actual side lacks fails at its place in forward order.
StageCheck missing_stage(const std::string& stage, int order, const std::string& who) {
  StageCheck check;
  check.stage = stage;
  check.order = order;
  check.shape_ok = false;
  check.shape_detail = who + " gave no '" + stage + "'";
  check.passed = false;
  check.ratio = std::numeric_limits<double>::infinity();
  check.fail_criterion = "missing";
  return check;
}

// What the replay cannot check on a drafter whose introspection lacks something (a plugin).
std::vector<std::string> checks_not_run(const Introspection& in, bool recomputes_kv) {
  std::vector<std::string> out;
  const std::string why = in.why.empty() ? "" : " (" + in.why + ")";
  if (!in.taps) {
    out.push_back("stage taps: none given" + why + "; logits and draft tokens are compared, no stage is named");
  } else if (!in.stages_not_given.empty()) {
    std::string list;
    for (const std::string& stage : in.stages_not_given) list += (list.empty() ? "" : ", ") + stage;
    out.push_back("stage taps not given: " + list);
  }
  if (!in.cache_view) {
    out.push_back("window, cache-slot invariants 1-4, kv-outside-window and kv-poison: no page tables" + why);
  } else if (!in.slot_read) {
    out.push_back("kv-outside-window and kv-poison: no K/V read-back by slot" + why);
  }
  if (recomputes_kv && !in.position_read && !(in.cache_view && in.slot_read)) {
    out.push_back("kv-stored: no K/V read-back" + why);
  }
  if (!in.attention_spans) out.push_back("attention-window: no attention spans" + why);
  if (!in.path) out.push_back("forward path (eager, graph capture, graph replay): not reported" + why);
  return out;
}

const Tap* find_tap(const ProposeOutput& output, const std::string& name) {
  for (const Tap& tap : output.taps) {
    if (tap.name == name) return &tap;
  }
  return nullptr;
}

// The roundings a drafter takes past its precision's bf16 boundaries, counted on its side of a
// bound: a bf16 wire, the row-parallel partials and their sum rounded to bf16
// (docs/spec/tensor-parallel.md §4, §9.2), and bf16 attention partials (docs/tolerances.md §4).
void add_own_roundings(ErrorModel& side, const DraftProposer& proposer) {
  const HeadSettings& settings = proposer.settings();
  side.bf16_wire = settings.tp_size > 1 && settings.tp_reduce_dtype == TpReduceDtype::kBf16;
  side.bf16_attention_partials = proposer.bf16_attention_partials();
}

bool is_partial_tap(const std::string& name) { return !partial_family_of(name).empty(); }

bool has_partial_taps(const std::vector<const Tap*>& taps) {
  return std::any_of(taps.begin(), taps.end(), [](const Tap* tap) { return is_partial_tap(tap->name); });
}

const ProposeOutput* find_output(const std::vector<ProposeOutput>& outputs, int seq) {
  for (const ProposeOutput& output : outputs) {
    if (output.seq == seq) return &output;
  }
  return nullptr;
}

// What the expected side of a pair holds for one sequence: the fixture's expectations or the
// reference drafter's output, in one shape.
struct ExpectedSide {
  std::vector<const Tap*> taps;
  const Tensor* logits = nullptr;
  const std::vector<int32_t>* draft_tokens = nullptr;
  const std::vector<int32_t>* argmax_tokens = nullptr;  // DFlash2 fixtures: the per-row argmax (diagnosis only)
};

class Replayer {
 public:
  Replayer(const Fixture& fixture, const std::vector<ReplayLane>& lanes, const std::vector<CrossCheck>& cross,
           const ReplayOptions& options)
      : fixture_(fixture), lanes_(lanes), options_(options) {
    if (lanes_.empty()) throw internal_error("replay: no drafter to replay on");
    for (const ReplayLane& lane : lanes_) {
      if (lane.proposer == nullptr) throw internal_error("replay: a lane has no drafter");
    }
    result_.fixture_name = fixture.name;
    result_.fixture_dir = fixture.dir;
    result_.expect_precision = fixture.expect_precision;
    if (fixture.manifest.is_object() && fixture.manifest.contains("provenance")) {
      result_.provenance = fixture.manifest["provenance"];
    }
    result_.num_layers = fixture.config.num_layers;
    result_.temperatures = distance_temperatures(options.temperatures, "temperature");
    result_.total_steps = static_cast<int>(fixture.steps.size());
    bool fp8 = fixture.expect_precision == "fp8";
    for (const ReplayLane& lane : lanes_) {
      result_.proposers.push_back({lane.proposer->name(), precision_name(lane.precision), lane.proposer->describe()});
      fp8 = fp8 || error_model(lane.precision).quantized_weights;  // fp8 or w8a8
    }
    // The fp8 and w8a8 envelopes are derived from the quantization error of these weights
    // (docs/tolerances.md).
    if (fp8 && fixture.weights) quantization_ = measure_weight_quantization(*fixture.weights);
    for (size_t i = 0; i < lanes_.size(); ++i) {
      if (!lanes_[i].compare_with_fixture) continue;
      PairSummary pair;
      pair.tolerance = fixture_pair(fixture.expect_precision, lanes_[i].precision, lanes_[i].proposer->name());
      add_own_roundings(pair.tolerance.actual, *lanes_[i].proposer);
      pair.label = pair.tolerance.label;
      pair.expected_lane = -1;
      pair.actual_lane = static_cast<int>(i);
      result_.pairs.push_back(pair);
    }
    for (const ReplayLane& lane : lanes_) {
      kv_pairs_.push_back(cross_pair(lane.precision, std::string("recomputed K/V (reference-") +
                                                         precision_name(lane.precision) + ")",
                                     lane.precision, lane.proposer->name()));
    }
    for (const CrossCheck& check : cross) {
      const int n = static_cast<int>(lanes_.size());
      if (check.reference < 0 || check.reference >= n || check.candidate < 0 || check.candidate >= n ||
          check.reference == check.candidate) {
        throw internal_error("replay: a cross check names lanes " + std::to_string(check.reference) + " and " +
                             std::to_string(check.candidate) + " of " + std::to_string(n));
      }
      PairSummary pair;
      const ReplayLane& ref = lanes_[check.reference];
      const ReplayLane& cand = lanes_[check.candidate];
      pair.tolerance = cross_pair(ref.precision, ref.proposer->name(), cand.precision, cand.proposer->name());
      add_own_roundings(pair.tolerance.expected, *ref.proposer);
      add_own_roundings(pair.tolerance.actual, *cand.proposer);
      pair.label = pair.tolerance.label;
      pair.expected_lane = check.reference;
      pair.actual_lane = check.candidate;
      result_.pairs.push_back(pair);
    }
  }

  ReplayResult run() {
    const int total = static_cast<int>(fixture_.steps.size());
    const int last = options_.last_step < 0 ? total - 1 : std::min(options_.last_step, total - 1);
    for (int step = 0; step <= last; ++step) {
      try {
        run_step(step, fixture_.steps[step]);
      } catch (const DrafterFault& e) {
        result_.drafter_fault = DrafterFaultRecord{step, e.proposer(), e.event(), e.during()};
        break;
      } catch (const HarnessError& e) {
        throw HarnessError(e.kind(), "fixture '" + fixture_.name + "', step " + std::to_string(step) + ": " + e.what());
      }
      result_.steps_run = step + 1;
      if (options_.on_step) options_.on_step(step + 1, last + 1);
    }
    for (size_t i = 0; i < lanes_.size(); ++i) {
      result_.proposers[i].checks_not_run = checks_not_run(lanes_[i].proposer->introspection(), bool(lanes_[i].recompute_kv));
    }
    result_.first_divergence = earliest_divergence(result_);
    std::vector<std::pair<int, int>> comparisons;
    for (const PairSummary& pair : result_.pairs) comparisons.emplace_back(pair.expected_lane, pair.actual_lane);
    result_.acceptance = acceptance_.finish(fixture_.acceptance, comparisons);
    return std::move(result_);
  }

 private:
  void run_step(int step, const FixtureStep& fixture_step) {
    std::vector<std::optional<PoolSnapshot>> before;
    for (size_t i = 0; i < lanes_.size(); ++i) {
      const Introspection in = lanes_[i].proposer->introspection();
      before.push_back(in.cache_view && in.slot_read ? snapshot_pools(*lanes_[i].proposer) : std::nullopt);
    }
    std::map<int, int64_t> anchor_of;
    if (fixture_step.kind == FixtureStep::Kind::kRelease) {
      for (int seq : fixture_step.release) {
        for (const ReplayLane& lane : lanes_) lane.proposer->release_sequence(seq);
        next_position_.erase(seq);
        ctx_rows_.erase(seq);
      }
    } else {
      run_propose(step, fixture_step.propose);
      for (const ProposeEntry& entry : fixture_step.propose) anchor_of[entry.seq] = entry.start;
    }
    for (size_t i = 0; i < lanes_.size(); ++i) {
      const ReplayLane& lane = lanes_[i];
      const Introspection in = lane.proposer->introspection();
      std::vector<InvariantViolation> found;
      if (in.cache_view) found = check_all_invariants(*lane.proposer, next_position_);
      const auto add = [&](std::vector<InvariantViolation> more) {
        found.insert(found.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
      };
      if (before[i]) {
        const std::optional<PoolSnapshot> after = snapshot_pools(*lane.proposer);
        if (after) add(check_kv_outside_windows(*lane.proposer, *before[i], *after));
      }
      if (lane.recompute_kv && (before[i] || (!in.cache_view && in.position_read))) {
        add(check_stored_kv(*lane.proposer, lane.recompute_kv, kv_pairs_[i], ctx_rows_, next_position_));
      }
      if (!anchor_of.empty() && in.attention_spans) add(check_attention_spans(*lane.proposer, anchor_of));
      for (const InvariantViolation& v : found) {
        result_.invariant_failures.push_back({step, lane.proposer->name(), v.invariant, v.detail});
      }
    }
  }

  void run_propose(int step, const std::vector<ProposeEntry>& entries) {
    if (entries.empty()) return;
    const int gamma = lanes_[0].proposer->settings().gamma;
    const int requested = entries[0].block_width;
    for (const ProposeEntry& entry : entries) {
      if (clamp_block_width(entry.block_width, gamma) != clamp_block_width(requested, gamma)) {
        throw bad_input("sequence " + std::to_string(entry.seq) + ": block_width " +
                        std::to_string(entry.block_width) + " clamps to a different width than block_width " +
                        std::to_string(requested) + " of sequence " + std::to_string(entries[0].seq) +
                        " in the same propose; one propose runs at one width");
      }
    }
    std::vector<ProposeInput> batch;
    for (const ProposeEntry& entry : entries) {
      if (!added_.count(entry.seq)) {
        for (const ReplayLane& lane : lanes_) lane.proposer->add_sequence(entry.seq);
        added_.insert(entry.seq);
      }
      batch.push_back({entry.seq, &entry.ctx, entry.start, entry.anchor});
      for (int64_t r = 0; r < entry.ctx.rows(); ++r) {
        ctx_rows_[entry.seq][entry.start - entry.ctx.rows() + r] = entry.ctx.row(r);
      }
    }

    std::vector<std::vector<ProposeOutput>> outputs(lanes_.size());
    for (size_t i = 0; i < lanes_.size(); ++i) {
      DraftProposer& proposer = *lanes_[i].proposer;
      proposer.set_block_g(requested);
      outputs[i] = proposer.propose(batch, wants_taps(static_cast<int>(i), entries));
    }
    for (const ProposeEntry& entry : entries) next_position_[entry.seq] = entry.start;
    for (size_t i = 0; i < lanes_.size(); ++i) record_path(step, static_cast<int>(i), outputs[i]);

    for (size_t i = 0; i < lanes_.size(); ++i) check_outputs(step, static_cast<int>(i), entries, outputs[i], requested);
    for (size_t p = 0; p < result_.pairs.size(); ++p) {
      for (const ProposeEntry& entry : entries) compare_pair(step, static_cast<int>(p), entry, outputs);
    }
    record_acceptance(step, entries, outputs);
  }

  // Each side's draft tokens against the target's side (compare/acceptance.h): the fixture's own
  // and every drafter's.
  void record_acceptance(int step, const std::vector<ProposeEntry>& entries,
                         const std::vector<std::vector<ProposeOutput>>& outputs) {
    for (const ProposeEntry& entry : entries) {
      if (!entry.target) continue;
      if (entry.expect && entry.expect->draft_tokens) {
        acceptance_.add(-1, "fixture", step, entry.seq, *entry.target, *entry.expect->draft_tokens,
                        entry.expect->logits ? &*entry.expect->logits : nullptr);
      }
      for (size_t i = 0; i < lanes_.size(); ++i) {
        const ProposeOutput* output = find_output(outputs[i], entry.seq);
        if (output == nullptr) continue;
        acceptance_.add(static_cast<int>(i), lanes_[i].proposer->name(), step, entry.seq, *entry.target,
                        output->draft_tokens, &output->logits);
      }
    }
  }

  // Which path the lane's judged outputs took (one pass serves the whole batch), and whether a
  // second, tapped pass computed anything else.
  void record_path(int step, int lane, const std::vector<ProposeOutput>& outputs) {
    if (outputs.empty()) return;
    const ForwardPath& path = outputs.front().path;
    result_.paths.push_back({step, lane, outputs.front().block_width, static_cast<int>(outputs.size()), path.mode,
                             path.pdl, path.taps_from_second_pass, path.plan});
    ++result_.proposers[static_cast<size_t>(lane)].path_counts[path.mode];
    for (const ProposeOutput& output : outputs) {
      if (output.path.mode != path.mode) {
        result_.invariant_failures.push_back({step, lanes_[lane].proposer->name(), "forward-path",
                                              "sequence " + std::to_string(output.seq) + " reports path " +
                                                  output.path.mode + ", sequence " +
                                                  std::to_string(outputs.front().seq) + " of the same propose " +
                                                  path.mode});
      }
      if (!output.path.tap_pass_difference.empty()) {
        result_.invariant_failures.push_back({step, lanes_[lane].proposer->name(), "taps-change-result",
                                              "sequence " + std::to_string(output.seq) +
                                                  ": the tapped pass differs from the judged pass at " +
                                                  output.path.tap_pass_difference});
      }
    }
  }

  // A lane needs taps when a pair it takes part in compares taps in this step.
  bool wants_taps(int lane, const std::vector<ProposeEntry>& entries) const {
    for (const PairSummary& pair : result_.pairs) {
      if (pair.expected_lane == lane || (pair.expected_lane >= 0 && pair.actual_lane == lane)) return true;
      if (pair.expected_lane < 0 && pair.actual_lane == lane) {
        for (const ProposeEntry& entry : entries) {
          if (entry.expect && !entry.expect->taps.empty()) return true;
        }
      }
    }
    return false;
  }

  void check_outputs(int step, int lane, const std::vector<ProposeEntry>& entries,
                     const std::vector<ProposeOutput>& outputs, int requested) {
    const DraftProposer& proposer = *lanes_[lane].proposer;
    for (const ProposeEntry& entry : entries) {
      const ProposeOutput* output = find_output(outputs, entry.seq);
      if (output == nullptr) {
        result_.invariant_failures.push_back(
            {step, proposer.name(), "propose-outputs", "no output for sequence " + std::to_string(entry.seq)});
        continue;
      }
      for (const InvariantViolation& v : check_propose_output(proposer, requested, *output)) {
        result_.invariant_failures.push_back({step, proposer.name(), v.invariant, v.detail});
      }
    }
  }

  void compare_pair(int step, int pair_index, const ProposeEntry& entry,
                    const std::vector<std::vector<ProposeOutput>>& outputs) {
    const PairSummary& pair = result_.pairs[pair_index];
    const ProposeOutput* actual = find_output(outputs[pair.actual_lane], entry.seq);
    if (actual == nullptr) return;  // reported as an invariant failure of that drafter
    const std::string actual_name = lanes_[pair.actual_lane].proposer->name();

    ExpectedSide expected;
    if (pair.expected_lane < 0) {
      if (!entry.expect) return;  // nothing recorded for this sequence
      for (const Tap& tap : entry.expect->taps) expected.taps.push_back(&tap);
      if (entry.expect->logits) expected.logits = &*entry.expect->logits;
      if (entry.expect->draft_tokens) expected.draft_tokens = &*entry.expect->draft_tokens;
      if (entry.expect->selector) expected.argmax_tokens = &entry.expect->selector->argmax_tokens;
    } else {
      const ProposeOutput* reference = find_output(outputs[pair.expected_lane], entry.seq);
      if (reference == nullptr) return;
      for (const Tap& tap : reference->taps) expected.taps.push_back(&tap);
      expected.logits = &reference->logits;
      expected.draft_tokens = &reference->draft_tokens;
    }

    const DraftProposer& proposer = *lanes_[pair.actual_lane].proposer;
    const HeadSettings& settings = proposer.settings();
    SequenceResult seq_result;
    seq_result.step = step;
    seq_result.seq = entry.seq;
    seq_result.pair = pair_index;
    seq_result.requested_width = entry.block_width;
    seq_result.block_width = clamp_block_width(entry.block_width, settings.gamma);
    seq_result.start = entry.start;
    seq_result.window = retained_new_rows(proposer.config(), settings, entry.start);
    // A bf16 wire's ρ from the partials of the side that taps them, the reference first (§9.2).
    std::optional<WireRounding> wire;
    if (pair.tolerance.expected.bf16_wire || pair.tolerance.actual.bf16_wire) {
      std::vector<const Tap*> actual_taps;
      for (const Tap& tap : actual->taps) actual_taps.push_back(&tap);
      wire = measure_wire_rounding(has_partial_taps(expected.taps) ? expected.taps : actual_taps,
                                   fixture_.config.num_layers, options_.tp_size);
    }
    const std::map<std::string, StagePath> paths =
        stage_paths(fixture_.config, seq_result.window, seq_result.block_width,
                    quantization_ ? &*quantization_ : nullptr, wire ? &*wire : nullptr);
    const int num_layers = fixture_.config.num_layers;
    // Each failing stage's two sides and bound: the first divergence's names its ranks at TP = N.
    struct Failed {
      const Tensor* want;
      const Tensor* got;
      StageBound bound;
    };
    std::map<std::string, Failed> failed;

    const auto check = [&](const std::string& stage, const Tensor& want, const Tensor* got) {
      const int order = stage_order_index(stage, num_layers, fixture_.config.dflash2.enabled, options_.tp_size);
      if (order < 0) {
        throw bad_input("sequence " + std::to_string(entry.seq) + ": '" + stage + "' is not a stage of a " +
                        std::to_string(num_layers) + "-layer drafter (docs/spec/drafter.md §7)");
      }
      if (got == nullptr) {
        const Introspection in = proposer.introspection();  // stages_not_given grows as taps are asked for
        const bool not_given = std::find(in.stages_not_given.begin(), in.stages_not_given.end(), stage) !=
                               in.stages_not_given.end();
        // Listed in checks_not_run (a drafter without taps, or a stage it says it does not give).
        if (stage != "logits" && (!in.taps || not_given)) return;
        seq_result.stages.push_back(missing_stage(stage, order, actual_name));
        return;
      }
      const StageBound bound = stage_bound(pair.tolerance, stage_path(paths, stage), want.cols());
      if (stage == "ctx_proj") {
        const Tensor kept = expected_ctx_proj_rows(want, proposer.config(), settings, entry.ctx.rows());
        seq_result.stages.push_back(check_stage(stage, order, kept, *got, bound));
        return;
      }
      seq_result.stages.push_back(check_stage(stage, order, want, *got, bound));
      if (!seq_result.stages.back().passed) failed[stage] = {&want, got, bound};
    };
    // DFlash2: the selector's taps in the expected side's candidate order where they differ by ties.
    std::optional<SelectorAlignment> selector;
    if (fixture_.config.dflash2.enabled && expected.logits != nullptr && expected.draft_tokens != nullptr) {
      const double rms_bound = stage_bound(pair.tolerance, paths.at("logits"), expected.logits->cols()).rel_rms;
      selector = align_selector_taps(expected.taps, actual->taps, *expected.logits, rms_bound, *expected.draft_tokens);
    }
    for (const Tap* tap : expected.taps) {
      // A rank's partial is judged where both sides round at the same points (docs/spec/tensor-parallel.md
      // §7). Across precisions (the fp8 envelope) its reduced stage is: the envelope's weight term is
      // an expectation over a whole row's K terms, and a partial's K/N terms may cancel.
      if (is_partial_tap(tap->name) && !pair.tolerance.same_rounding_points) continue;
      const Tap* got = find_tap(*actual, tap->name);
      if (selector) {
        for (const Tap& aligned : selector->taps) {
          if (aligned.name == tap->name) got = &aligned;
        }
      }
      check(tap->name, tap->value, got ? &got->value : nullptr);
    }
    if (expected.logits != nullptr) check("logits", *expected.logits, &actual->logits);
    if (expected.logits != nullptr && expected.logits->shape == actual->logits.shape) {
      const double max_rel = stage_bound(pair.tolerance, paths.at("logits"), expected.logits->cols()).max_rel;
      seq_result.distances = check_distances(*expected.logits, actual->logits, max_rel, result_.temperatures);
    }
    std::stable_sort(seq_result.stages.begin(), seq_result.stages.end(),
                     [](const StageCheck& a, const StageCheck& b) { return a.order < b.order; });
    seq_result.divergence = first_divergence(seq_result.stages, num_layers);
    if (seq_result.divergence && failed.count(seq_result.divergence->stage)) {
      const Failed& f = failed.at(seq_result.divergence->stage);
      seq_result.divergence->ranks = attribute_stage(seq_result.divergence->stage, *f.want, *f.got, f.bound, partition());
    }

    if (expected.draft_tokens != nullptr) compare_tokens(pair, expected, *actual, paths, &seq_result);
    if (!seq_result.divergence && seq_result.distances) {
      seq_result.divergence = distance_divergence(*seq_result.distances);
    }
    if (seq_result.divergence) {
      seq_result.divergence->pair = pair.label;
      seq_result.divergence->step = step;
      seq_result.divergence->seq = entry.seq;
    }
    result_.sequences.push_back(std::move(seq_result));
  }

  void compare_tokens(const PairSummary& pair, const ExpectedSide& expected, const ProposeOutput& actual,
                      const std::map<std::string, StagePath>& paths, SequenceResult* seq_result) {
    const std::vector<int32_t>& want = *expected.draft_tokens;
    const Tensor& margin_logits = expected.logits != nullptr ? *expected.logits : actual.logits;
    if (want.size() != actual.draft_tokens.size() || margin_logits.rows() != static_cast<int64_t>(want.size())) {
      const std::string problem = "draft tokens: expected " + std::to_string(want.size()) + ", the drafter gave " +
                                  std::to_string(actual.draft_tokens.size()) + " (logits rows " +
                                  std::to_string(margin_logits.rows()) + ")";
      seq_result->problems.push_back(problem);
      if (!seq_result->divergence) {
        Divergence d;
        d.stage = "draft_tokens";
        d.criterion = "shape";
        d.detail = problem;
        seq_result->divergence = d;
      }
      return;
    }
    const double rms_bound = stage_bound(pair.tolerance, paths.at("logits"), margin_logits.cols()).rel_rms;
    seq_result->tokens = compare_draft_tokens(want, actual.draft_tokens, margin_logits, rms_bound);
    if (seq_result->divergence || seq_result->tokens->mismatch == 0) return;
    if (expected.argmax_tokens != nullptr && actual.draft_tokens == *expected.argmax_tokens) {
      // docs/spec/dflash2.md §7: the fixture's argmax_tokens recognise a selector that was not applied.
      Divergence d;
      d.stage = "draft_tokens";
      d.criterion = "selector-not-applied";
      d.detail = "the drafter returned the per-row argmax of the logits (the fixture's argmax_tokens) instead of "
                 "the candidate selector's walk";
      seq_result->divergence = d;
      return;
    }
    if (fixture_.config.dflash2.enabled) {  // the walk's own ties (compare/tokens.h)
      const Tap* ids = nullptr;
      const Tap* walk = nullptr;
      for (const Tap* tap : expected.taps) {
        if (tap->name == stage_name(StageKind::kSelTopkIds)) ids = tap;
        if (tap->name == stage_name(StageKind::kSelWalkScores)) walk = tap;
      }
      if (ids != nullptr && walk != nullptr && ids->value.rows() == static_cast<int64_t>(want.size())) {
        const std::string stage = stage_name(StageKind::kSelWalkScores);
        excuse_walk_ties(&*seq_result->tokens, ids->value, walk->value, margin_logits,
                         stage_bound(pair.tolerance, paths.at(stage), walk->value.cols()).rel_rms);
        if (seq_result->tokens->mismatch == 0) return;
      }
    }
    for (const TokenRow& row : seq_result->tokens->rows) {
      if (row.verdict != TokenVerdict::kMismatch) continue;
      Divergence d;
      d.stage = "draft_tokens";
      d.criterion = "draft-token";
      d.row = row.row;
      d.expected = row.expected;
      d.actual = row.actual;
      d.value = row.gap;
      d.bound = row.threshold;
      d.detail = "row " + std::to_string(row.row) + ": expected token " + std::to_string(row.expected) +
                 ", actual token " + std::to_string(row.actual) + "; their logits sit " + std::to_string(row.gap) +
                 " below the row's top, more than the tie threshold " + std::to_string(row.threshold);
      d.ranks = attribute_tokens(row.expected, row.actual, partition());
      seq_result->divergence = d;
      break;
    }
  }

  TpPartition partition() const { return tp_partition(fixture_.config, options_.tp_size); }

  const Fixture& fixture_;
  const std::vector<ReplayLane>& lanes_;
  const ReplayOptions& options_;
  ReplayResult result_;
  std::optional<WeightQuantization> quantization_;
  std::map<int, int64_t> next_position_;
  std::set<int> added_;
  ContextRows ctx_rows_;                  // every context row fed, by (sequence, position)
  std::vector<TolerancePair> kv_pairs_;  // per lane: its recomputed K/V vs its stored K/V
  AcceptanceTally acceptance_;
};

}  // namespace

bool SequenceResult::passed() const {
  for (const StageCheck& stage : stages) {
    if (!stage.passed) return false;
  }
  return problems.empty() && (!tokens || tokens->mismatch == 0) && (!distances || distances->passed);
}

bool ReplayResult::passed() const {
  if (drafter_fault || !invariant_failures.empty() || !acceptance.failures.empty()) return false;
  for (const SequenceResult& seq : sequences) {
    if (!seq.passed()) return false;
  }
  return true;
}

ReplayResult replay_fixture(const Fixture& fixture, const std::vector<ReplayLane>& lanes,
                            const std::vector<CrossCheck>& cross_checks, const ReplayOptions& options) {
  return Replayer(fixture, lanes, cross_checks, options).run();
}

namespace {

// Where a sequence's divergence sits in forward order: its stage's position, or after every stage
// for the faults that are not a stage check (draft tokens, a missing output).
int divergence_order(const SequenceResult& seq) {
  for (const StageCheck& check : seq.stages) {
    if (check.stage == seq.divergence->stage) return check.order;
  }
  return std::numeric_limits<int>::max();
}

}  // namespace

std::optional<Divergence> earliest_divergence(const ReplayResult& result, int pair) {
  const SequenceResult* best = nullptr;
  int best_order = 0;
  for (const SequenceResult& seq : result.sequences) {  // in step order
    if (!seq.divergence || (pair >= 0 && seq.pair != pair)) continue;
    if (best != nullptr && seq.step > best->step) break;
    const int order = divergence_order(seq);
    if (best == nullptr || order < best_order) {
      best = &seq;
      best_order = order;
    }
  }
  if (best == nullptr) return std::nullopt;
  return best->divergence;
}

PairTotals pair_totals(const ReplayResult& result, int pair) {
  PairTotals totals;
  for (const SequenceResult& seq : result.sequences) {
    if (seq.pair != pair) continue;
    ++totals.sequences;
    if (!seq.passed()) ++totals.failed_sequences;
    if (seq.tokens) {
      totals.agree += seq.tokens->agree;
      totals.excused += seq.tokens->excused;
      totals.mismatch += seq.tokens->mismatch;
    }
    for (const StageCheck& stage : seq.stages) {
      if (totals.worst_stage.empty() || stage.ratio > totals.worst_ratio) {
        totals.worst_ratio = stage.ratio;
        totals.worst_stage = stage.stage;
      }
      if (stage.bias) {
        ++totals.bias_checks;
        const double ratio = std::fabs(stage.bias->mean_ulp) / stage.bias->bound;
        if (totals.worst_bias_stage.empty() || ratio > totals.worst_bias_ratio) {
          totals.worst_bias_ratio = ratio;
          totals.worst_bias_mean_ulp = stage.bias->mean_ulp;
          totals.worst_bias_stage = stage.stage;
        }
      }
    }
  }
  totals.first_divergence = earliest_divergence(result, pair);
  if (totals.first_divergence) {
    const Divergence& d = *totals.first_divergence;
    for (const SequenceResult& seq : result.sequences) {
      if (seq.pair != pair || seq.step != d.step || seq.seq != d.seq) continue;
      for (const StageCheck& stage : seq.stages) {
        if (stage.stage == d.stage) totals.first_divergence_ratio = stage.ratio;
      }
    }
  }
  return totals;
}

}  // namespace dflash
