#include "tests/properties/serving_loop.h"

#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include <rapidcheck.h>

#include "tests/properties/property_check.h"
#include "tests/properties/scenario.h"
#include "tests/properties/trace_runner.h"

namespace dflash::prop {
namespace {

int anchor_of(const Trace& trace, int step_id, int seq) {
  for (const TraceStep& step : trace.steps) {
    if (step.id != step_id) continue;
    for (const TraceEntry& e : step.entries) {
      if (e.seq == seq) return e.anchor;
    }
  }
  fail_case("trace step #" + std::to_string(step_id) + " has no sequence " + std::to_string(seq));
}

// A drafter with the case's settings as a serving engine runs it: not in the debug mode that
// poisons freed pages, so that a read of a stale slot shows as wrong numbers to compare.
std::unique_ptr<DraftProposer> serving_drafter(const Backend& backend, const Scenario& s) {
  return backend.make(s.config, s.weights, s.settings);
}

std::string batch_text(const std::vector<int>& order) {
  std::string text = "[";
  for (size_t b = 0; b < order.size(); ++b) text += (b ? ", " : "") + std::to_string(order[b]);
  return text + "]";
}

}  // namespace

void serving_loop_property(const Backend& loop, const Backend& eager, int* cases_with_graph_replays) {
  ScenarioOptions options;
  options.max_sequences = 6;
  options.min_max_batch = 2;
  options.max_steps = 14;
  options.distinct_widths = 3;  // widths repeat (graphs are replayed) and interleave
  const Scenario s = *gen_scenario(loop, options);
  RunOptions run;
  run.shuffle_seed = *rc::gen::inRange<uint64_t>(1, uint64_t{1} << 40);  // sequences change batch slots
  run.tolerate_exhaustion = true;
  auto served = serving_drafter(loop, s);
  const TraceRun loop_run = run_trace(*served, s.trace, run);

  bool replayed = false, moved = false, slid = false, reused = false;
  std::set<int> widths;
  std::map<std::pair<int, size_t>, int> shape_proposes;  // (width, batch): a third one is a graph replay
  std::map<int, size_t> slot_of;
  std::set<int> after_release;  // proposes that may reuse pages a release freed
  bool released = false;
  for (const TraceStep& step : s.trace.steps) {
    released = released || step.release;
    if (released && !step.release) after_release.insert(step.id);
  }
  for (const StepResult& step : loop_run.steps) {
    if (step.exhausted || step.outputs.empty()) continue;
    const int width = step.outputs.begin()->second.block_width;
    widths.insert(width);
    ++shape_proposes[{width, step.order.size()}];
    for (size_t b = 0; b < step.order.size(); ++b) {
      const int seq = step.order[b];
      const ProposeOutput& out = step.outputs.at(seq);
      replayed = replayed || out.path.mode == "graph-replay";
      auto last = slot_of.find(seq);
      moved = moved || (last != slot_of.end() && last->second != b);
      slot_of[seq] = b;
      slid = slid || (!s.settings.uncapped && step.starts.at(seq) > s.settings.ctx_cap);
    }

    // A fresh eager drafter, each sequence alone: its whole history in one prompt, then this propose.
    auto fresh = serving_drafter(eager, s);
    Trace alone;
    const int requested = [&] {
      for (const TraceStep& t : s.trace.steps) {
        if (t.id == step.step_id) return t.width;
      }
      fail_case("trace has no step #" + std::to_string(step.step_id));
    }();
    for (int seq : step.order) {
      TraceStep one;
      one.id = static_cast<int>(alone.steps.size());
      one.width = requested;
      one.entries.push_back({seq, step.starts.at(seq), anchor_of(s.trace, step.step_id, seq)});
      alone.steps.push_back(one);
      TraceStep leave;
      leave.id = static_cast<int>(alone.steps.size());
      leave.release = true;
      leave.released.push_back(seq);
      alone.steps.push_back(leave);
    }
    const TraceRun fresh_run = run_trace(*fresh, alone);
    for (size_t b = 0; b < step.order.size(); ++b) {
      const int seq = step.order[b];
      const ProposeOutput& got = step.outputs.at(seq);
      const StepResult* fresh_step = fresh_run.step(static_cast<int>(2 * b));  // its propose, before its release
      if (fresh_step == nullptr || !fresh_step->outputs.count(seq)) fail_case("the fresh drafter gave no output");
      const ProposeOutput& want = fresh_step->outputs.at(seq);
      std::string diff = want.block_width != got.block_width
                             ? "block width " + std::to_string(want.block_width) + " vs " + std::to_string(got.block_width)
                             : logits_difference(want.logits, got.logits);
      if (diff.empty() && want.draft_tokens != got.draft_tokens) diff = "draft tokens differ";
      if (diff.empty()) continue;
      fail_case("serving loop, step #" + std::to_string(step.step_id) + ", sequence " + std::to_string(seq) +
                " (batch slot " + std::to_string(b) + " of " + batch_text(step.order) + ", width " +
                std::to_string(got.block_width) + ", anchor position " + std::to_string(step.starts.at(seq)) +
                ", path " + got.path.mode + "): not bit-identical to a fresh eager drafter fed the same history " +
                "(fresh, then served): " + diff);
    }
    reused = reused || after_release.count(step.step_id) > 0;
  }
  bool repeated = false;
  for (const auto& entry : shape_proposes) repeated = repeated || entry.second >= 3;
  RC_CLASSIFY(repeated, "a shape proposed three times");
  RC_CLASSIFY(replayed, "a graph replay");
  RC_CLASSIFY(moved, "a sequence in another batch slot");
  RC_CLASSIFY(widths.size() >= 2, "widths interleaved");
  RC_CLASSIFY(slid, "a window past its cap");
  RC_CLASSIFY(reused, "pages freed by a release");
  if (replayed && cases_with_graph_replays != nullptr) ++*cases_with_graph_replays;
}

}  // namespace dflash::prop
