#include "tests/properties/trace_runner.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <set>
#include <sstream>

#include "compare/invariants.h"
#include "compare/kv_invariants.h"
#include "core/error.h"
#include "core/stages.h"
#include "tests/properties/pool_model.h"
#include "tests/properties/property_check.h"
#include "tests/properties/random_model.h"

namespace dflash::prop {
namespace {

std::string describe_violations(const std::vector<InvariantViolation>& violations) {
  std::string text;
  for (const InvariantViolation& v : violations) text += "\n  [" + v.invariant + "] " + v.detail;
  return text;
}

// Everything a refused propose must leave as it was.
struct Snapshot {
  std::map<int, SequenceView> views;
  std::map<int, std::vector<int64_t>> slots;
  PoolView pool;
};

Snapshot snapshot(const DraftProposer& proposer) {
  Snapshot s;
  for (int seq : proposer.sequences()) {
    s.views[seq] = proposer.sequence_view(seq);
    s.slots[seq] = proposer.window_slots(seq);
  }
  s.pool = proposer.pool_view();
  return s;
}

std::string snapshot_difference(const Snapshot& a, const Snapshot& b) {
  if (a.views.size() != b.views.size()) return "the set of active sequences changed";
  for (const auto& [seq, va] : a.views) {
    auto it = b.views.find(seq);
    if (it == b.views.end()) return "sequence " + std::to_string(seq) + " disappeared";
    const SequenceView& vb = it->second;
    if (va.next_position != vb.next_position || va.window_begin != vb.window_begin ||
        va.first_logical_page != vb.first_logical_page || va.block_table != vb.block_table) {
      return "sequence " + std::to_string(seq) + "'s window or block table changed";
    }
    if (a.slots.at(seq) != b.slots.at(seq)) return "sequence " + std::to_string(seq) + "'s slots changed";
  }
  if (a.pool.free_pages != b.pool.free_pages || a.pool.page_owner != b.pool.page_owner) {
    return "the pool's free list or page owners changed";
  }
  return "";
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

std::string check_taps(const DraftProposer& proposer, const ProposeOutput& out, int64_t new_rows) {
  const auto expected = expected_taps(proposer.config(), out.block_width, new_rows);
  std::map<std::string, const Tensor*> got;
  for (const Tap& tap : out.taps) {
    if (!got.emplace(tap.name, &tap.value).second) return "tap " + tap.name + " appears twice";
  }
  for (const auto& [name, shape] : expected) {
    auto it = got.find(name);
    if (it == got.end()) return "tap " + name + " is missing";
    const Tensor& t = *it->second;
    if (t.shape != shape || static_cast<int64_t>(t.values.size()) != t.numel()) {
      return "tap " + name + " has shape " + shape_string(t.shape) + " (" + std::to_string(t.values.size()) +
             " values); expected " + shape_string(shape);
    }
    const int64_t bad = first_non_finite(t.values.data(), static_cast<int64_t>(t.values.size()));
    if (bad >= 0) return "tap " + name + " value " + std::to_string(bad) + " is not finite";
    got.erase(it);
  }
  if (!got.empty()) return "unexpected tap " + got.begin()->first;
  for (const Tap& tap : out.taps) {
    if (tap.name == "logits" && !same_bits(tap.value.values, out.logits.values)) {
      return "the logits tap differs from the returned logits";
    }
  }
  return "";
}

}  // namespace

uint64_t default_stream(int seq, int64_t /*position*/) { return static_cast<uint64_t>(seq) + 1; }

std::vector<int> TraceRun::exhausted_steps() const {
  std::vector<int> ids;
  for (const StepResult& s : steps) {
    if (s.exhausted) ids.push_back(s.step_id);
  }
  return ids;
}

const StepResult* TraceRun::step(int step_id) const {
  for (const StepResult& s : steps) {
    if (s.step_id == step_id) return &s;
  }
  return nullptr;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> expected_taps(const DrafterConfig& c, int width,
                                                                        int64_t new_rows) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> taps;
  for (const std::string& name : forward_stage_order(c.num_layers)) {
    StageId stage;
    parse_stage_name(name, c.num_layers, &stage);
    taps.push_back({name, stage_shape(stage, c, width, new_rows)});
  }
  return taps;
}

TraceRun run_trace(DraftProposer& proposer, const Trace& trace, const RunOptions& options) {
  const DrafterConfig& config = proposer.config();
  const HeadSettings& settings = proposer.settings();
  const int64_t retained = retained_context(config, settings);
  const int64_t features = config.ctx_feature_dim();

  PoolModel model;
  model.num_pages = proposer.pool_view().num_pages;
  model.page_size = settings.kv_page_size;
  model.ctx_cap = retained;

  std::set<int> added;                 // proposer ids
  std::map<int, int64_t> next;         // proposer id -> next position, for active sequences
  SplitMix64 shuffle(options.shuffle_seed);
  TraceRun run;

  auto ensure_added = [&](int id) {
    if (added.insert(id).second) {
      proposer.add_sequence(id);
      next[id] = 0;
      model.next[id] = 0;
    }
  };
  auto check_state = [&](const std::string& where) {
    const auto violations = check_all_invariants(proposer, next);
    if (!violations.empty()) fail_case(where + ": invariants broken:" + describe_violations(violations));
  };
  // What the proposer stored and read (compare/kv_invariants.h), from its read-back.
  std::map<int, std::map<int64_t, std::vector<float>>> fed;  // proposer id -> position -> context row
  const TolerancePair kv_pair = cross_pair(settings.precision, "recomputed K/V", settings.precision, proposer.name());
  auto check_stored = [&](const std::string& where, const std::optional<PoolSnapshot>& before,
                          const std::map<int, int64_t>& anchors) {
    std::vector<InvariantViolation> violations;
    if (!anchors.empty()) violations = check_attention_spans(proposer, anchors);  // after a propose
    if (before) {
      const std::optional<PoolSnapshot> after = snapshot_pools(proposer);
      if (after) {
        for (InvariantViolation& v : check_kv_outside_windows(proposer, *before, *after)) violations.push_back(v);
      }
      if (options.recompute_kv) {
        ContextRows rows;
        for (const auto& [id, positions] : fed) {
          for (const auto& [position, row] : positions) rows[id][position] = row.data();
        }
        for (InvariantViolation& v : check_stored_kv(proposer, options.recompute_kv, kv_pair, rows, {})) {
          violations.push_back(v);
        }
      }
    }
    if (!violations.empty()) fail_case(where + ": stored state broken:" + describe_violations(violations));
  };

  for (const TraceStep& step : trace.steps) {
    const std::string where = "step #" + std::to_string(step.id) + " (" + proposer.name() + ")";
    if (step.release) {
      const std::optional<PoolSnapshot> before = snapshot_pools(proposer);
      for (int seq : step.released) {
        const int id = seq + options.seq_offset;
        ensure_added(id);
        proposer.release_sequence(id);
        fed.erase(id);
        next.erase(id);
        model.next.erase(id);
        model.released.insert(id);
      }
      check_stored(where + " after release", before, {});
      check_state(where + " after release");
      continue;
    }

    std::vector<TraceEntry> entries = step.entries;
    if (options.shuffle_seed != 0) {
      for (size_t i = entries.size(); i > 1; --i) std::swap(entries[i - 1], entries[shuffle.next() % i]);
    }
    StepResult result;
    result.step_id = step.id;
    std::vector<Tensor> contexts(entries.size());
    std::vector<ProposeInput> batch;
    std::vector<ContextRequest> requests;
    for (size_t b = 0; b < entries.size(); ++b) {
      const TraceEntry& e = entries[b];
      const int id = e.seq + options.seq_offset;
      ensure_added(id);
      const int64_t first = next[id];
      const int64_t count = first == 0 ? std::max<int64_t>(e.count, 1) : e.count;
      contexts[b] = Tensor::zeros({count, features});
      for (int64_t r = 0; r < count; ++r) {
        context_row(options.stream(e.seq, first + r), first + r, features, contexts[b].row(r));
      }
      batch.push_back(ProposeInput{id, &contexts[b], first + count, e.anchor});
      requests.push_back(ContextRequest{id, first + count, count});
      result.starts[e.seq] = first + count;
      result.counts[e.seq] = count;
      result.order.push_back(e.seq);
    }
    const bool must_fit = model.fits_in_order(requests);
    const bool cannot_fit = !model.fits_in_total(requests);

    proposer.set_block_g(step.width);
    const Snapshot before = options.tolerate_exhaustion ? snapshot(proposer) : Snapshot{};
    const std::optional<PoolSnapshot> pools_before = snapshot_pools(proposer);
    std::vector<ProposeOutput> outputs;
    try {
      outputs = proposer.propose(batch, options.want_taps);
    } catch (const HarnessError& e) {
      if (e.kind() != ErrorKind::kPoolExhausted || !options.tolerate_exhaustion) {
        fail_case(where + ": propose threw: " + e.what());
      }
      if (must_fit) fail_case(where + ": refused as pool exhaustion although the pool holds the batch: " + e.what());
      const std::string changed = snapshot_difference(before, snapshot(proposer));
      if (!changed.empty()) fail_case(where + ": a refused propose changed state: " + changed);
      result.exhausted = true;
      check_state(where + " after a refused propose");
      run.steps.push_back(std::move(result));
      continue;
    }
    if (cannot_fit) fail_case(where + ": accepted a batch whose windows need more pages than the pool has");
    std::map<int, int64_t> anchors;
    for (size_t b = 0; b < batch.size(); ++b) {
      anchors[batch[b].seq] = batch[b].start;
      for (int64_t r = 0; r < batch[b].ctx->rows(); ++r) {
        const float* row = batch[b].ctx->row(r);
        fed[batch[b].seq][batch[b].start - batch[b].ctx->rows() + r].assign(row, row + features);
      }
    }
    // The stored state first: a wrong slot or a stale read also spoils the outputs checked below.
    check_stored(where, pools_before, anchors);

    if (outputs.size() != batch.size()) {
      fail_case(where + ": " + std::to_string(outputs.size()) + " outputs for " + std::to_string(batch.size()) +
              " sequences");
    }
    for (size_t b = 0; b < batch.size(); ++b) {
      const ProposeOutput& out = outputs[b];
      if (out.seq != batch[b].seq) {
        fail_case(where + ": output " + std::to_string(b) + " is for sequence " + std::to_string(out.seq) +
                ", input " + std::to_string(b) + " was sequence " + std::to_string(batch[b].seq));
      }
      const auto violations = check_propose_output(proposer, step.width, out);
      if (!violations.empty()) fail_case(where + ": output broken:" + describe_violations(violations));
      if (options.want_taps) {
        const int64_t count = requests[b].count;
        const int64_t new_rows = retained_new_rows(config, settings, count);
        const std::string bad = check_taps(proposer, out, new_rows);
        if (!bad.empty()) fail_case(where + ": sequence " + std::to_string(out.seq) + ": " + bad);
      }
      result.outputs[entries[b].seq] = out;
      next[batch[b].seq] = batch[b].start;
    }
    model.apply(requests);
    check_state(where);
    run.steps.push_back(std::move(result));
  }
  return run;
}

std::string logits_difference(const Tensor& a, const Tensor& b) {
  if (a.shape != b.shape) return "logits shapes " + shape_string(a.shape) + " vs " + shape_string(b.shape);
  for (size_t i = 0; i < a.values.size(); ++i) {
    if (std::memcmp(&a.values[i], &b.values[i], sizeof(float)) != 0) {
      std::ostringstream text;
      text.precision(9);
      text << "logits[" << i / a.cols() << ", " << i % a.cols() << "] " << a.values[i] << " vs " << b.values[i];
      return text.str();
    }
  }
  return "";
}

std::string first_difference(const TraceRun& full, const TraceRun& part, bool both_ways) {
  size_t part_outputs = 0;
  for (const StepResult& p : part.steps) {
    const StepResult* f = full.step(p.step_id);
    for (const auto& [seq, out] : p.outputs) {
      ++part_outputs;
      const std::string where = "step #" + std::to_string(p.step_id) + " sequence " + std::to_string(seq) + ": ";
      if (f == nullptr || !f->outputs.count(seq)) return where + "output missing in the other run";
      const ProposeOutput& other = f->outputs.at(seq);
      if (other.block_width != out.block_width) {
        return where + "block width " + std::to_string(other.block_width) + " vs " + std::to_string(out.block_width);
      }
      // With taps on both sides, the first stage (in forward order) whose bits differ.
      for (const Tap& tap : other.taps) {
        for (const Tap& mine : out.taps) {
          if (mine.name != tap.name) continue;
          const std::string diff = logits_difference(tap.value, mine.value);
          if (!diff.empty()) return where + "first differing stage " + tap.name + ": " + diff.substr(diff.find('['));
        }
      }
      const std::string logits = logits_difference(other.logits, out.logits);
      if (!logits.empty()) return where + logits;
      if (other.draft_tokens != out.draft_tokens) return where + "draft tokens differ";
    }
  }
  if (both_ways) {
    size_t full_outputs = 0;
    for (const StepResult& f : full.steps) full_outputs += f.outputs.size();
    if (full_outputs != part_outputs) {
      return std::to_string(full_outputs) + " outputs vs " + std::to_string(part_outputs) + " in the other run";
    }
  }
  return "";
}

}  // namespace dflash::prop
