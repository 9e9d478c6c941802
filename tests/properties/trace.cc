#include "tests/properties/trace.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <set>

namespace dflash::prop {

std::vector<int> Trace::sequence_ids() const {
  std::set<int> ids;
  for (const TraceStep& step : steps) {
    for (const TraceEntry& e : step.entries) ids.insert(e.seq);
    ids.insert(step.released.begin(), step.released.end());
  }
  return {ids.begin(), ids.end()};
}

std::ostream& operator<<(std::ostream& os, const Trace& trace) {
  os << "[";
  for (const TraceStep& step : trace.steps) {
    os << "\n  #" << step.id << " ";
    if (step.release) {
      os << "release";
      for (int seq : step.released) os << " s" << seq;
      continue;
    }
    os << "propose width " << step.width << ":";
    for (const TraceEntry& e : step.entries) os << " {s" << e.seq << " C " << e.count << " anchor " << e.anchor << "}";
  }
  return os << "\n]";
}

rc::Gen<int> any_of(int n) { return rc::gen::resize(100, rc::gen::inRange(0, n)); }

rc::Gen<int64_t> gen_context_count(int64_t next, const TraceShape& shape) {
  return rc::gen::exec([next, shape]() -> int64_t {
    const int64_t ps = shape.page_size;
    const int64_t cap = shape.ctx_cap;
    const bool cap_reachable = cap > 0 && cap + 2 * ps + 2 <= shape.max_positions;
    int64_t count = 0;
    switch (*any_of(cap_reachable ? 5 : 3)) {
      case 0:  // a few rows, including none
        count = *rc::gen::inRange<int64_t>(0, 4);
        break;
      case 1:  // up to a couple of pages
        count = *rc::gen::inRange<int64_t>(0, 2 * ps + 3);
        break;
      case 2: {  // land at, just before or just after the next page boundary
        const int64_t boundary = (next / ps + 1) * ps;
        count = boundary - next + *rc::gen::element<int64_t>(-1, 0, 1);
        break;
      }
      case 3:  // total context at, just under or just over the cap
        count = cap - next + *rc::gen::element<int64_t>(-1, 0, 1);
        break;
      default:  // a prompt longer than the cap
        count = cap + *rc::gen::inRange<int64_t>(1, 2 * ps + 2);
        break;
    }
    return std::clamp<int64_t>(count, 0, std::max<int64_t>(0, shape.max_positions - next));
  });
}

rc::Gen<int> gen_width(int gamma) {
  return rc::gen::exec([gamma]() -> int {
    switch (*any_of(8)) {
      case 0: return 0;
      case 1: return 1;
      case 2: return 2;
      case 3: return gamma;
      case 4: return gamma + 1;
      case 5: return *rc::gen::inRange(0, gamma + 4);
      case 6: return *rc::gen::inRange(0, 3 * gamma + 21);
      default: return 1000;
    }
  });
}

rc::Gen<Trace> gen_trace(const TraceShape& shape) {
  return rc::gen::exec([shape] {
    Trace trace;
    std::map<int, int64_t> active;  // id -> next position, as planned
    int next_id = 0;
    const int steps = *rc::gen::inRange(1, shape.max_steps + 1);
    for (int s = 0; s < steps; ++s) {
      TraceStep step;
      step.id = static_cast<int>(trace.steps.size());
      if (shape.releases && !active.empty() && *any_of(6) == 0) {
        auto it = std::next(active.begin(), *rc::gen::inRange<int>(0, static_cast<int>(active.size())));
        step.release = true;
        step.released.push_back(it->first);
        active.erase(it);
        trace.steps.push_back(step);
        continue;
      }
      std::vector<int> idle;  // active ids not yet in this batch
      for (const auto& entry : active) idle.push_back(entry.first);
      const int batch = *rc::gen::inRange(1, shape.max_batch + 1);
      for (int b = 0; b < batch; ++b) {
        const bool can_add = static_cast<int>(active.size()) < shape.max_active && next_id < shape.max_sequences;
        const bool can_reuse = !idle.empty();
        if (!can_add && !can_reuse) break;
        int seq;
        if (can_add && (!can_reuse || *any_of(2) == 0)) {
          seq = next_id++;
          active[seq] = 0;
        } else {
          const int pick = *rc::gen::inRange<int>(0, static_cast<int>(idle.size()));
          seq = idle[pick];
          idle.erase(idle.begin() + pick);
        }
        TraceEntry entry;
        entry.seq = seq;
        entry.count = *gen_context_count(active[seq], shape);
        if (active[seq] == 0) entry.count = std::max<int64_t>(entry.count, 1);
        entry.anchor = *rc::gen::inRange(0, shape.vocab);
        active[seq] += entry.count;
        step.entries.push_back(entry);
      }
      if (step.entries.empty()) break;  // every id used and released
      step.width = shape.width_choices.empty() ? *gen_width(shape.gamma) : *rc::gen::elementOf(shape.width_choices);
      trace.steps.push_back(step);
    }
    return trace;
  });
}

Trace only_sequence(const Trace& trace, int seq) {
  Trace out;
  for (const TraceStep& step : trace.steps) {
    TraceStep kept = step;
    kept.entries.clear();
    kept.released.clear();
    for (const TraceEntry& e : step.entries) {
      if (e.seq == seq) kept.entries.push_back(e);
    }
    for (int r : step.released) {
      if (r == seq) kept.released.push_back(r);
    }
    if (!kept.entries.empty() || !kept.released.empty()) out.steps.push_back(kept);
  }
  return out;
}

Trace without_steps(const Trace& trace, const std::vector<int>& ids) {
  Trace out;
  for (const TraceStep& step : trace.steps) {
    if (std::find(ids.begin(), ids.end(), step.id) == ids.end()) out.steps.push_back(step);
  }
  return out;
}

}  // namespace dflash::prop
