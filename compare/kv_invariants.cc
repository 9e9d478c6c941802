#include "compare/kv_invariants.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <string>

#include "compare/rounding_bias.h"
#include "compare/stage_check.h"
#include "compare/tp_attribution.h"
#include "core/error.h"

namespace dflash {
namespace {

std::string seq_name(int seq) { return "sequence " + std::to_string(seq); }

bool same_bits(const float* a, const float* b, int64_t n) { return std::memcmp(a, b, static_cast<size_t>(n) * sizeof(float)) == 0; }

// The first column whose bits differ; n when none does.
int64_t first_changed_column(const float* a, const float* b, int64_t n) {
  for (int64_t c = 0; c < n; ++c) {
    if (std::memcmp(a + c, b + c, sizeof(float)) != 0) return c;
  }
  return n;
}

// "L{l}.k" or "L{l}.v": the tap a pool row's columns follow (docs/spec/tensor-parallel.md §7).
std::string stage_of(int layer, bool key) { return "L" + std::to_string(layer) + (key ? ".k" : ".v"); }

bool all_nan(const float* row, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isnan(row[i])) return false;
  }
  return true;
}

}  // namespace

std::optional<PoolSnapshot> snapshot_pools(const DraftProposer& proposer) {
  const PoolView pool = proposer.pool_view();
  std::vector<int64_t> slots(static_cast<size_t>(pool.num_pages) * static_cast<size_t>(pool.page_size));
  for (size_t i = 0; i < slots.size(); ++i) slots[i] = static_cast<int64_t>(i);
  PoolSnapshot snapshot;
  for (int l = 0; l < proposer.config().num_layers; ++l) {
    std::optional<KvRows> rows = proposer.read_kv(l, slots);
    if (!rows) return std::nullopt;
    snapshot.layers.push_back(std::move(*rows));
  }
  return snapshot;
}

namespace {

// One sequence's window as the check reads it: from the drafter's page table when it shows one,
// else the spec's window of the rows fed (the most recent retained_context positions).
struct CheckedWindow {
  int seq = -1;
  int64_t begin = 0, end = 0;  // positions begin .. end-1
  std::vector<int64_t> slots;  // with a page table: the slot of each position
};

std::vector<CheckedWindow> windows_to_check(const DraftProposer& proposer, const ContextRows& rows,
                                            const std::map<int, int64_t>& next_position) {
  std::vector<CheckedWindow> out;
  if (proposer.introspection().cache_view) {
    for (int seq : proposer.sequences()) {
      const SequenceView view = proposer.sequence_view(seq);
      CheckedWindow w{seq, view.window_begin, view.next_position, proposer.window_slots(seq)};
      if (!w.slots.empty()) out.push_back(std::move(w));
    }
    return out;
  }
  const int64_t retained = retained_context(proposer.config(), proposer.settings());
  for (const auto& [seq, next] : next_position) {
    auto fed = rows.find(seq);
    if (fed == rows.end() || fed->second.empty()) continue;
    int64_t begin = fed->second.begin()->first;
    if (retained > 0) begin = std::max(begin, next - retained);
    if (begin < next) out.push_back({seq, begin, next, {}});
  }
  return out;
}

}  // namespace

std::vector<InvariantViolation> check_stored_kv(const DraftProposer& proposer, const ContextKvFunction& recompute,
                                                const TolerancePair& pair, const ContextRows& rows,
                                                const std::map<int, int64_t>& next_position) {
  std::vector<InvariantViolation> out;
  const DrafterConfig& config = proposer.config();
  const int64_t features = config.ctx_feature_dim();
  const TpPartition tp = tp_partition(config, proposer.settings().tp_size);
  for (const CheckedWindow& window : windows_to_check(proposer, rows, next_position)) {
    const int seq = window.seq;
    const int64_t n = window.end - window.begin;
    std::vector<int64_t> positions;
    for (int64_t p = window.begin; p < window.end; ++p) positions.push_back(p);
    Tensor ctx = Tensor::zeros({n, features});
    auto fed = rows.find(seq);
    bool complete = fed != rows.end();
    for (int64_t i = 0; complete && i < n; ++i) {
      auto row = fed->second.find(window.begin + i);
      if (row == fed->second.end()) {
        complete = false;
        break;
      }
      std::copy_n(row->second, features, ctx.row(i));
    }
    if (!complete) {
      out.push_back({"kv-stored", seq_name(seq) + ": its window " + std::to_string(window.begin) + ".." +
                                      std::to_string(window.end - 1) +
                                      " holds positions whose context rows were never fed"});
      continue;
    }
    const std::vector<KvRows> want = recompute(ctx, window.begin);
    for (int l = 0; l < config.num_layers; ++l) {
      const std::optional<KvRows> got =
          window.slots.empty() ? proposer.read_kv_at(l, seq, positions) : proposer.read_kv(l, window.slots);
      if (!got) return out;  // no read-back: nothing stored to check
      for (bool key : {true, false}) {
        const std::string what = "L" + std::to_string(l) + (key ? ".K" : ".V");
        const Tensor& w = key ? want[static_cast<size_t>(l)].k : want[static_cast<size_t>(l)].v;
        const Tensor& a = key ? got->k : got->v;
        const StageBound bound = stage_bound(pair, context_kv_path(config, key), config.kv_dim());
        const StageCheck check = check_stage(what, -1, w, a, bound);
        const std::string positions_text =
            " of positions " + std::to_string(window.begin) + ".." + std::to_string(window.end - 1);
        if (!check.passed) {
          std::string detail = seq_name(seq) + ", " + what;
          if (!check.shape_ok) {
            detail += ": " + check.shape_detail;
          } else if (check.fail_criterion == "rounding-bias") {
            detail += positions_text + ": rounding bias: stored vs recomputed " + describe_rounding_bias(*check.bias);
          } else {
            const int64_t position = window.begin + check.fail_row;
            detail += " of position " + std::to_string(position) +
                      (window.slots.empty()
                           ? std::string()
                           : " (slot " + std::to_string(window.slots[static_cast<size_t>(check.fail_row)]) + ")") +
                      ", column " + std::to_string(check.fail_col) + ": recomputed " +
                      std::to_string(check.fail_expected) + ", stored " + std::to_string(check.fail_actual) + " (" +
                      check.fail_criterion + " " + std::to_string(check.fail_value) + " > " +
                      std::to_string(check.fail_bound) + ")";
          }
          // At TP = N each rank's pool holds its KV heads' columns (docs/spec/tensor-parallel.md §6):
          // every rank whose columns break the bound on their own is named.
          if (check.shape_ok && tp.ranks > 1) {
            const std::string ranks = attribute_stage(stage_of(l, key), w, a, bound, tp);
            if (!ranks.empty()) detail += "; pool of " + ranks;
          }
          out.push_back({"kv-stored", detail});
        } else if (tp.ranks > 1 && check.bias) {
          // The rounding bias of each rank's pool on its own: a bias confined to one rank's columns is
          // diluted in the whole row's mean. (The per-element criteria saw every element already.)
          for (const TpColumnSlice& slice : tp_column_slices(stage_of(l, key), w.cols(), tp)) {
            const RoundingBias bias = measure_rounding_bias(tp_columns(w, slice), tp_columns(a, slice));
            if (bias.passed()) continue;
            out.push_back({"kv-stored", seq_name(seq) + ", " + what + " in the pool of " + describe_slice(slice) +
                                            positions_text + ": rounding bias: stored vs recomputed " +
                                            describe_rounding_bias(bias)});
          }
        }
      }
    }
  }
  return out;
}

std::vector<InvariantViolation> check_kv_outside_windows(const DraftProposer& proposer, const PoolSnapshot& before,
                                                         const PoolSnapshot& after) {
  std::vector<InvariantViolation> out;
  const PoolView pool = proposer.pool_view();
  const bool poison = proposer.settings().poison_freed_pages;
  const TpPartition tp = tp_partition(proposer.config(), proposer.settings().tp_size);
  std::set<int64_t> in_window;
  for (int seq : proposer.sequences()) {
    for (int64_t slot : proposer.window_slots(seq)) in_window.insert(slot);
  }
  const int64_t slots = static_cast<int64_t>(pool.num_pages) * pool.page_size;
  for (size_t l = 0; l < after.layers.size() && l < before.layers.size(); ++l) {
    for (bool key : {true, false}) {
      const Tensor& b = key ? before.layers[l].k : before.layers[l].v;
      const Tensor& a = key ? after.layers[l].k : after.layers[l].v;
      const int64_t cols = a.cols();
      const std::string what = "L" + std::to_string(l) + (key ? ".K" : ".V");
      int changed = 0, unpoisoned = 0;
      std::string first_changed, first_unpoisoned;
      for (int64_t slot = 0; slot < slots && slot < a.rows() && slot < b.rows(); ++slot) {
        if (in_window.count(slot)) continue;
        const int page = static_cast<int>(slot / pool.page_size);
        const bool free = pool.page_owner[static_cast<size_t>(page)] == -1;
        const bool nan = all_nan(a.row(slot), cols);
        if (poison && free && !nan && unpoisoned++ == 0) {
          first_unpoisoned = what + " of slot " + std::to_string(slot) + " (free page " + std::to_string(page) +
                             ") is not NaN";
        }
        if (same_bits(b.row(slot), a.row(slot), cols) || (poison && free && nan)) continue;
        if (changed++ == 0) {
          const int owner = pool.page_owner[static_cast<size_t>(page)];
          const int64_t col = first_changed_column(b.row(slot), a.row(slot), cols);
          const std::string rank = kv_column_owner(col, tp);
          first_changed = what + " of slot " + std::to_string(slot) + " (page " + std::to_string(page) + ", " +
                          (owner == -1 ? std::string("free") : "owned by " + seq_name(owner)) +
                          ", in no window) changed: column " + std::to_string(col) + " " +
                          std::to_string(b.row(slot)[col]) + " -> " + std::to_string(a.row(slot)[col]) +
                          (rank.empty() ? std::string() : ", in the pool of " + rank);
        }
      }
      if (changed > 0) {
        out.push_back({"kv-outside-window", first_changed + (changed > 1 ? " (and " + std::to_string(changed - 1) +
                                                                                 " more slots)"
                                                                           : "")});
      }
      if (unpoisoned > 0) {
        out.push_back({"kv-poison", first_unpoisoned + (unpoisoned > 1 ? " (and " + std::to_string(unpoisoned - 1) +
                                                                             " more slots)"
                                                                       : "")});
      }
    }
  }
  return out;
}

std::vector<InvariantViolation> check_attention_spans(const DraftProposer& proposer,
                                                      const std::map<int, int64_t>& anchor_of) {
  std::vector<InvariantViolation> out;
  const std::vector<AttentionSpan> spans = proposer.attention_spans();
  if (spans.empty()) return out;  // no report: a test double
  const int64_t retained = retained_context(proposer.config(), proposer.settings());
  std::set<int> reported;
  for (const AttentionSpan& span : spans) {
    reported.insert(span.seq);
    auto anchor = anchor_of.find(span.seq);
    if (anchor == anchor_of.end()) {
      out.push_back({"attention-window", seq_name(span.seq) + ": attention read it, but it was not proposed"});
      continue;
    }
    const int64_t first = retained > 0 ? std::max<int64_t>(0, anchor->second - retained) : 0;
    const int64_t last = anchor->second - 1;
    if (span.first != first || span.last != last) {
      out.push_back({"attention-window",
                     seq_name(span.seq) + ": attention read context positions " + std::to_string(span.first) + ".." +
                         std::to_string(span.last) + "; the window before anchor position " +
                         std::to_string(anchor->second) + " (" +
                         retained_context_rule(proposer.config(), proposer.settings()) + ") is " +
                         std::to_string(first) + ".." + std::to_string(last)});
    }
  }
  for (const auto& entry : anchor_of) {
    if (!reported.count(entry.first)) {
      out.push_back({"attention-window", seq_name(entry.first) + " was proposed but no attention span was reported"});
    }
  }
  return out;
}

}  // namespace dflash
