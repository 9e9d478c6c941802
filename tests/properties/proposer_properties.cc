#include "tests/properties/proposer_properties.h"

#include <algorithm>
#include <map>
#include <string>

#include <rapidcheck.h>

#include "compare/stage_check.h"
#include "core/stages.h"
#include "compare/tokens.h"
#include "compare/tolerance.h"
#include "core/kv_pages.h"
#include "tests/properties/property_check.h"
#include "tests/properties/scenario.h"
#include "tests/properties/trace_runner.h"

namespace dflash::prop {
namespace {

const TraceStep& find_step(const Trace& trace, int id) {
  for (const TraceStep& step : trace.steps) {
    if (step.id == id) return step;
  }
  fail_case("trace has no step #" + std::to_string(id));
}

void expect_same(const TraceRun& full, const TraceRun& part, bool both_ways, const std::string& what) {
  const std::string diff = first_difference(full, part, both_ways);
  if (!diff.empty()) fail_case(what + ": not bit-identical: " + diff);
}

bool exact_precision(Precision p) { return p == Precision::kFp32 || p == Precision::kFp64; }

// `run` with the stored-state check of the backend's K/V recomputation, when it has one.
RunOptions checking_stored_kv(const Backend& backend, const Scenario& s, RunOptions run = {}) {
  if (!backend.kv_oracle) return run;
  run.recompute_kv =
      backend.kv_oracle(s.config, s.weights, s.settings.precision, s.settings.resolved(s.config).max_window(s.config));
  return run;
}

}  // namespace

void clamp_property(const Backend& backend) {
  ScenarioOptions options;
  options.max_sequences = 2;
  options.max_steps = 6;
  const Scenario s = *gen_scenario(backend, options);
  auto proposer = s.build(backend);
  const int gamma = s.gamma();
  // set_block_g alone stores the clamped width.
  for (int requested : {0, 1, 2, gamma, gamma + 1, 3 * gamma + 20, 1000}) {
    proposer->set_block_g(requested);
    if (proposer->block_g() != clamp_block_width(requested, gamma)) {
      fail_case("set_block_g(" + std::to_string(requested) + ") stored " + std::to_string(proposer->block_g()) +
                "; clamp(" + std::to_string(requested) + ", 2, max(" + std::to_string(gamma) + ", 2)) = " +
                std::to_string(clamp_block_width(requested, gamma)));
    }
  }
  // Every propose runs at the clamped width with outputs (and taps) of exactly that size: the
  // runner checks them after each step.
  RunOptions run;
  run.want_taps = backend.taps && *rc::gen::arbitrary<bool>();
  run_trace(*proposer, s.trace, run);
  bool above = false, below = false;
  for (const TraceStep& step : s.trace.steps) {
    above = above || (!step.release && step.width > std::max(gamma, 2));
    below = below || (!step.release && step.width < 2);
  }
  RC_CLASSIFY(above, "a width above max(gamma, 2)");
  RC_CLASSIFY(below, "a width below 2");
  RC_CLASSIFY(run.want_taps, "taps");
}

void context_window_property(const Backend& backend) {
  ScenarioOptions options;
  options.max_sequences = 1;
  options.max_steps = 5;
  options.releases = false;
  const Scenario s = *gen_scenario(backend, options);
  auto incremental = s.build(backend);
  const TraceRun run = run_trace(*incremental, s.trace, checking_stored_kv(backend, s));
  const bool capped = !s.settings.uncapped;
  bool slid = false;
  for (const StepResult& step : run.steps) {
    for (const auto& entry : step.starts) slid = slid || (capped && entry.second > s.settings.ctx_cap);
  }
  RC_CLASSIFY(slid, "context longer than the cap");

  for (const StepResult& step : run.steps) {
    for (const auto& [seq, output] : step.outputs) {
      const int64_t start = step.starts.at(seq);
      const int64_t window_begin = capped ? std::max<int64_t>(0, start - s.settings.ctx_cap) : 0;
      const TraceStep& original = find_step(s.trace, step.step_id);
      // A fresh sequence fed every position at once; rows before the window from another stream.
      Trace prompt;
      TraceStep one;
      one.id = step.step_id;
      one.width = original.width;
      for (const TraceEntry& e : original.entries) {
        if (e.seq == seq) one.entries.push_back({seq, start, e.anchor});
      }
      prompt.steps.push_back(one);
      RunOptions garbage_before;
      garbage_before.stream = [window_begin](int sq, int64_t pos) {
        return pos < window_begin ? 1000 + static_cast<uint64_t>(sq) : default_stream(sq, pos);
      };
      auto fresh = s.build(backend);
      const TraceRun fresh_run = run_trace(*fresh, prompt, garbage_before);
      const std::string diff = first_difference(run, fresh_run, false);
      if (!diff.empty()) {
        fail_case("context window at step #" + std::to_string(step.step_id) + ": positions " +
                  std::to_string(window_begin) + ".." + std::to_string(start - 1) +
                  " fed incrementally vs in one prompt with different rows before " + std::to_string(window_begin) +
                  " are not bit-identical: " + diff);
      }
      if (!exact_precision(s.settings.precision)) continue;
      // The oldest position of the window is seen: changing it changes the outputs.
      RunOptions garbage_through;
      garbage_through.stream = [window_begin](int sq, int64_t pos) {
        return pos <= window_begin ? 1000 + static_cast<uint64_t>(sq) : default_stream(sq, pos);
      };
      auto changed = s.build(backend);
      const TraceRun changed_run = run_trace(*changed, prompt, garbage_through);
      if (first_difference(run, changed_run, false).empty()) {
        fail_case("context window at step #" + std::to_string(step.step_id) + ": changing the row of position " +
                  std::to_string(window_begin) + ", the oldest of the window, changed no output bit");
      }
    }
  }
}

void cache_slots_property(const Backend& backend) {
  ScenarioOptions options;
  options.max_sequences = 4;
  options.max_steps = 8;
  options.small_pools = true;
  const Scenario s = *gen_scenario(backend, options);
  RunOptions run = checking_stored_kv(backend, s);
  run.tolerate_exhaustion = true;  // the runner checks each refusal against the pool model
  auto proposer = s.build(backend);
  const TraceRun with_refusals = run_trace(*proposer, s.trace, run);
  const std::vector<int> refused = with_refusals.exhausted_steps();
  RC_CLASSIFY(!refused.empty(), "a propose refused for a full pool");
  if (refused.empty()) return;
  // The refused proposes left no trace: a run that never saw them gives the same bits.
  auto twin = s.build(backend);
  const TraceRun without = run_trace(*twin, without_steps(s.trace, refused), run);
  if (!without.exhausted_steps().empty()) {
    fail_case("a run without the refused steps was refused at step #" + std::to_string(without.exhausted_steps()[0]));
  }
  expect_same(with_refusals, without, true, "outputs of a run with refused proposes vs one that never made them");
}

void batch_invariance_property(const Backend& backend) {
  ScenarioOptions options;
  options.max_sequences = 4;
  options.min_max_batch = 2;
  options.max_steps = 6;
  const Scenario s = *gen_scenario(backend, options);
  RunOptions taps;  // a difference then names the first stage where it starts
  taps.want_taps = backend.taps;
  auto batched = s.build(backend);
  const TraceRun run = run_trace(*batched, s.trace, taps);
  bool shared = false;
  for (const TraceStep& step : s.trace.steps) shared = shared || step.entries.size() >= 2;
  RC_CLASSIFY(shared, "a batch of two or more");

  RunOptions shuffled = taps;
  shuffled.shuffle_seed = *rc::gen::inRange<uint64_t>(1, uint64_t{1} << 40);
  auto reordered = s.build(backend);
  expect_same(run, run_trace(*reordered, s.trace, shuffled), true, "batched vs the same batches reordered");

  for (int seq : s.trace.sequence_ids()) {
    auto alone = s.build(backend);
    expect_same(run, run_trace(*alone, only_sequence(s.trace, seq), taps), false,
                "batched vs sequence " + std::to_string(seq) + " alone");
  }
}

void page_permutation_property(const Backend& backend) {
  ScenarioOptions options;
  options.max_sequences = 3;
  options.max_steps = 6;
  const Scenario s = *gen_scenario(backend, options);
  HeadSettings ascending = s.settings;
  ascending.page_order_seed = 0;
  RunOptions taps;
  taps.want_taps = backend.taps;
  auto base = s.build(backend, ascending);
  const TraceRun run = run_trace(*base, s.trace, taps);

  HeadSettings shuffled = ascending;
  shuffled.page_order_seed = *rc::gen::inRange<uint64_t>(1, uint64_t{1} << 40);
  auto permuted = s.build(backend, shuffled);
  expect_same(run, run_trace(*permuted, s.trace, taps), true, "page_order_seed 0 vs " + std::to_string(shuffled.page_order_seed));

  HeadSettings larger = shuffled;
  larger.pool_pages = ascending.resolved(s.config).pool_pages + *rc::gen::inRange(1, 9);
  larger.page_order_seed = *rc::gen::inRange<uint64_t>(1, uint64_t{1} << 40);
  auto spread = s.build(backend, larger);
  expect_same(run, run_trace(*spread, s.trace, taps), true,
              "a pool of " + std::to_string(larger.pool_pages) + " pages in order " + std::to_string(larger.page_order_seed));
}

void determinism_property(const Backend& backend) {
  ScenarioOptions options;
  options.max_sequences = 3;
  options.max_steps = 6;
  const Scenario s = *gen_scenario(backend, options);
  RunOptions taps;
  taps.want_taps = backend.taps;
  auto first = s.build(backend);
  const TraceRun run = run_trace(*first, s.trace, taps);
  auto second = s.build(backend);
  expect_same(run, run_trace(*second, s.trace, taps), true, "two fresh proposers replaying one trace");
  // The same instance again, its cache pages reused by new sequence ids.
  for (int seq : first->sequences()) first->release_sequence(seq);
  RunOptions fresh_ids = taps;
  fresh_ids.seq_offset = 1000;
  expect_same(run, run_trace(*first, s.trace, fresh_ids), true, "one proposer replaying a trace on reused pages");
}

void argmax_ties_property(const Backend& backend) {
  ScenarioOptions options;
  options.max_sequences = 2;
  options.max_steps = 4;
  options.lm_heads = {LmHead::kAllEqual, LmHead::kSignedCopies, LmHead::kDuplicateRows};
  options.min_vocab = 64;
  const Scenario s = *gen_scenario(backend, options);
  auto proposer = s.build(backend);
  // The runner's output check already demands the lowest-index argmax of every row; here the
  // ties are known to exist, so the winners are known too.
  const TraceRun run = run_trace(*proposer, s.trace);
  const LmHeadPlan& plan = s.lm_head;
  for (const StepResult& step : run.steps) {
    for (const auto& [seq, out] : step.outputs) {
      for (int64_t r = 0; r < out.logits.rows(); ++r) {
        const float* row = out.logits.row(r);
        const int32_t token = out.draft_tokens[static_cast<size_t>(r)];
        const std::string where = "step #" + std::to_string(step.step_id) + " sequence " + std::to_string(seq) +
                                  " row " + std::to_string(r) + ": ";
        auto tie = [&](int i, int j) {
          if (!(row[i] == row[j])) {
            fail_case(where + "identical lm_head rows " + std::to_string(i) + " and " + std::to_string(j) +
                      " gave different logits " + std::to_string(row[i]) + " and " + std::to_string(row[j]));
          }
        };
        switch (plan.kind) {
          case LmHead::kAllEqual:
            for (int64_t v = 1; v < out.logits.cols(); ++v) tie(0, static_cast<int>(v));
            if (token != 0) {
              fail_case(where + "every logit ties but draft token is " + std::to_string(token) + ", not the lowest index 0");
            }
            break;
          case LmHead::kSignedCopies: {
            const float x = row[plan.a];
            const int winner = x > 0 ? plan.a : x < 0 ? plan.c : 0;
            if (x > 0) tie(plan.a, plan.b);
            if (x < 0) tie(plan.c, plan.d);
            if (token != winner) {
              fail_case(where + "maximum tied between rows " + std::to_string(x > 0 ? plan.a : plan.c) + " and " +
                        std::to_string(x > 0 ? plan.b : plan.d) + " but draft token is " + std::to_string(token) +
                        ", not the lowest index " + std::to_string(winner));
            }
            break;
          }
          case LmHead::kDuplicateRows:
            tie(plan.a, plan.b);
            tie(plan.c, plan.d);
            break;
          case LmHead::kRandom:
            break;
        }
      }
    }
  }
}

void matches_reference_property(const Backend& reference, const Backend& candidate) {
  ScenarioOptions options;
  options.max_sequences = 3;
  options.max_steps = 5;
  const Scenario s = *gen_scenario(candidate, options);  // the candidate's geometries and precisions
  auto expected = s.build(reference);
  auto actual = s.build(candidate);
  RunOptions run;
  run.want_taps = reference.taps && candidate.taps;
  const TraceRun e = run_trace(*expected, s.trace, run);
  const TraceRun a = run_trace(*actual, s.trace, run);
  const Precision precision = s.settings.precision;
  const TolerancePair pair = cross_pair(precision, expected->name(), precision, actual->name());
  const std::vector<std::string> stages = forward_stage_order(s.config.num_layers);

  for (const StepResult& es : e.steps) {
    const StepResult* as = a.step(es.step_id);
    for (const auto& [seq, eo] : es.outputs) {
      const ProposeOutput& ao = as->outputs.at(seq);
      const std::string where = "step #" + std::to_string(es.step_id) + " sequence " + std::to_string(seq) + ": ";
      const int64_t start = es.starts.at(seq);
      const int64_t window = s.settings.uncapped ? start : std::min<int64_t>(start, s.settings.ctx_cap);
      const std::map<std::string, StagePath> paths = stage_paths(s.config, window, eo.block_width);
      auto tensor_of = [](const ProposeOutput& out, const std::string& stage) -> const Tensor* {
        if (stage == "logits") return &out.logits;
        for (const Tap& tap : out.taps) {
          if (tap.name == stage) return &tap.value;
        }
        return nullptr;
      };
      StageBound logits_bound;
      for (size_t order = 0; order < stages.size(); ++order) {
        const std::string& stage = stages[order];
        const Tensor* et = tensor_of(eo, stage);
        const Tensor* at = tensor_of(ao, stage);
        if (et == nullptr || at == nullptr) continue;  // taps not requested: logits only
        const StageBound bound = stage_bound(pair, paths.at(stage), et->cols());
        if (stage == "logits") logits_bound = bound;
        if (et->numel() == 0 && at->numel() == 0) continue;
        const StageCheck check = check_stage(stage, static_cast<int>(order), *et, *at, bound);
        if (!check.passed) {
          fail_case(where + pair.label + ": first stage over its bound is " + stage + " (" + check.fail_criterion +
                    " at row " + std::to_string(check.fail_row) + ", column " + std::to_string(check.fail_col) + ": " +
                    std::to_string(check.fail_value) + " > bound " + std::to_string(check.fail_bound) + "; expected " +
                    std::to_string(check.fail_expected) + ", actual " + std::to_string(check.fail_actual) + ")" +
                    (check.shape_ok ? "" : " " + check.shape_detail));
        }
      }
      const TokenCheck tokens = compare_draft_tokens(eo.draft_tokens, ao.draft_tokens, eo.logits, logits_bound.rel_rms);
      for (const TokenRow& row : tokens.rows) {
        if (row.verdict == TokenVerdict::kMismatch) {
          fail_case(where + "draft token of logits row " + std::to_string(row.row) + ": " + std::to_string(row.expected) +
                    " vs " + std::to_string(row.actual) + ", " + std::to_string(row.gap) +
                    " below the top logit, more than the tie threshold " + std::to_string(row.threshold));
        }
      }
    }
  }
}

void same_bits_property(const Backend& eager, const Backend& graphs, int* cases_with_changed_replays) {
  ScenarioOptions options;
  options.max_sequences = 3;
  options.max_steps = 10;
  options.distinct_widths = 2;  // shapes repeat, so captured graphs are replayed
  const Scenario s = *gen_scenario(graphs, options);
  auto a = s.build(eager);
  auto b = s.build(graphs);
  // No taps: the graph path is judged as it ships.
  const TraceRun with_graphs = run_trace(*b, s.trace);
  expect_same(run_trace(*a, s.trace), with_graphs, true, eager.name + " vs " + graphs.name);
  if (graphs.graph_warmup < 0) return;  // a stand-in without graphs (the broken variant on the CPU)

  // Every propose of a (width, batch) seen more than graph_warmup times before is a graph replay;
  // count those whose anchor positions differ from the capture's.
  std::map<std::pair<int, size_t>, int> seen;
  std::map<std::pair<int, size_t>, std::map<int, int64_t>> captured_starts;
  int changed = 0;
  for (const StepResult& step : with_graphs.steps) {
    if (step.outputs.empty()) continue;
    const auto shape = std::make_pair(step.outputs.begin()->second.block_width, step.outputs.size());
    const int count = ++seen[shape];
    const std::string expected = count <= graphs.graph_warmup       ? "eager"
                                 : count == graphs.graph_warmup + 1 ? "graph-capture"
                                                                    : "graph-replay";
    for (const auto& [seq, out] : step.outputs) {
      if (out.path.mode != expected) {
        fail_case(graphs.name + " step #" + std::to_string(step.step_id) + ", sequence " + std::to_string(seq) +
                  ": ran " + out.path.mode + ", expected " + expected + " (propose " + std::to_string(count) +
                  " of width " + std::to_string(shape.first) + ", batch " + std::to_string(shape.second) +
                  ", warmup " + std::to_string(graphs.graph_warmup) + ")");
      }
    }
    if (expected == "graph-capture") captured_starts[shape] = step.starts;
    if (expected == "graph-replay" && step.starts != captured_starts[shape]) ++changed;
  }
  RC_CLASSIFY(changed > 0, "graph replays with new positions");
  if (changed > 0 && cases_with_changed_replays != nullptr) ++*cases_with_changed_replays;
}

}  // namespace dflash::prop
