// Invariant checks of docs/spec/drafter.md §5 read through a proposer's introspection only, so the same code
// judges the CPU reference, the CUDA drafter and any test double. Every message names the
// sequence, position, slot or page involved.
#include "compare/invariants.h"

#include <algorithm>
#include <set>
#include <string>
#include <utility>

#include "core/error.h"
#include "core/kv_pages.h"

namespace dflash {
namespace {

std::string seq_name(int seq) { return "sequence " + std::to_string(seq); }

void add(std::vector<InvariantViolation>* out, const std::string& invariant, const std::string& detail) {
  out->push_back(InvariantViolation{invariant, detail});
}

// The gamma the clamp uses: the settings' value, or the config's block_size when unresolved.
int gamma_in_force(const DraftProposer& proposer) {
  const int gamma = proposer.settings().gamma;
  return gamma >= 0 ? gamma : proposer.config().block_size;
}

// Index of the first maximum of a row (lowest index on ties, docs/spec/drafter.md §3). NaN never wins.
int64_t lowest_argmax(const float* row, int64_t count) {
  int64_t best = 0;
  for (int64_t i = 1; i < count; ++i) {
    if (row[i] > row[best]) best = i;
  }
  return best;
}

}  // namespace

std::vector<InvariantViolation> check_propose_output(const DraftProposer& proposer, int requested_width,
                                                     const ProposeOutput& output) {
  std::vector<InvariantViolation> out;
  const std::string who = seq_name(output.seq);
  const int gamma = gamma_in_force(proposer);
  const int width = clamp_block_width(requested_width, gamma);
  const int64_t vocab = proposer.config().vocab_size;

  if (output.block_width != width) {
    add(&out, "clamp",
        who + ": ran at block width " + std::to_string(output.block_width) + " but clamp(" +
            std::to_string(requested_width) + ", 2, max(" + std::to_string(gamma) + ", 2)) = " +
            std::to_string(width));
  }
  if (proposer.block_g() != width) {
    add(&out, "clamp",
        who + ": block_g() is " + std::to_string(proposer.block_g()) + " after a request of " +
            std::to_string(requested_width) + "; expected " + std::to_string(width));
  }

  // Shape first: a tensor longer than its shape says means something was written past the rows.
  const std::vector<int64_t> expected_shape{width - 1, vocab};
  const bool shape_ok = output.logits.shape == expected_shape &&
                        static_cast<int64_t>(output.logits.values.size()) == (width - 1) * vocab;
  if (!shape_ok) {
    add(&out, "logits-shape",
        who + ": logits have shape " + shape_string(output.logits.shape) + " and " +
            std::to_string(output.logits.values.size()) + " values; expected " +
            shape_string(expected_shape) + " = " + std::to_string((width - 1) * vocab) + " values");
  }
  if (static_cast<int64_t>(output.draft_tokens.size()) != width - 1) {
    add(&out, "draft-tokens",
        who + ": " + std::to_string(output.draft_tokens.size()) + " draft tokens; expected B-1 = " +
            std::to_string(width - 1));
  }
  for (size_t i = 0; i < output.draft_tokens.size(); ++i) {
    const int32_t token = output.draft_tokens[i];
    if (token < 0 || token >= vocab) {
      add(&out, "draft-tokens",
          who + ": draft token " + std::to_string(i) + " is " + std::to_string(token) + ", outside [0, " +
              std::to_string(vocab) + ")");
    }
  }
  if (!shape_ok) return out;  // the checks below index the logits by their expected shape

  const int64_t bad = first_non_finite(output.logits.values.data(), static_cast<int64_t>(output.logits.values.size()));
  if (bad >= 0) {
    add(&out, "logits-finite",
        who + ": logits[" + std::to_string(bad / vocab) + ", " + std::to_string(bad % vocab) + "] is " +
            std::to_string(output.logits.values[static_cast<size_t>(bad)]));
    return out;  // an argmax over NaN is meaningless
  }
  // Draft token i is the argmax of logits row i, lowest index on ties. An fp64 drafter decides on
  // its double values: two logits that differ there may round to one float, so among equal float
  // maxima it may pick any; every other mode computes the float logits it returns.
  const bool decides_below_float = proposer.settings().precision == Precision::kFp64;
  const size_t rows = std::min(output.draft_tokens.size(), static_cast<size_t>(width - 1));
  const Dflash2Config& d2 = proposer.config().dflash2;
  if (d2.enabled) {
    // DFlash2 drafts the selector's walk (docs/spec/dflash2.md §3.4): each token is one of its row's
    // top-K candidates. Fewer than K logits strictly above it; an fp64 drafter may see two logits
    // apart that its float copy rounds together, which this count cannot mistake for a violation.
    for (size_t r = 0; r < rows; ++r) {
      const float* row = output.logits.row(static_cast<int64_t>(r));
      const int32_t token = output.draft_tokens[r];
      if (token < 0 || token >= vocab) continue;
      int64_t above = 0;
      for (int64_t c = 0; c < vocab; ++c) above += row[c] > row[token] ? 1 : 0;
      if (above >= d2.selector_top_k) {
        add(&out, "draft-topk",
            who + ": draft token " + std::to_string(r) + " is " + std::to_string(token) + ", but " +
                std::to_string(above) + " logits of its row are higher (selector_top_k " +
                std::to_string(d2.selector_top_k) + ")");
      }
    }
    return out;
  }
  for (size_t r = 0; r < rows; ++r) {
    const float* row = output.logits.row(static_cast<int64_t>(r));
    const int64_t expected = lowest_argmax(row, vocab);
    const int32_t token = output.draft_tokens[r];
    if (token == expected || token < 0 || token >= vocab) continue;
    const bool tie = row[token] == row[expected];
    if (tie && decides_below_float) continue;
    add(&out, "draft-argmax",
        who + ": draft token " + std::to_string(r) + " is " + std::to_string(token) +
            (tie ? " but the lowest index with the same maximum logit is " : " but the argmax of its logits row is ") +
            std::to_string(expected));
  }
  return out;
}

std::vector<InvariantViolation> check_windows(const DraftProposer& proposer,
                                              const std::map<int, int64_t>& expected_next_position) {
  std::vector<InvariantViolation> out;
  const int64_t retained = retained_context(proposer.config(), proposer.settings());

  std::vector<int> active;
  try {
    active = proposer.sequences();
  } catch (const HarnessError& e) {
    add(&out, "introspection", std::string("sequences() threw: ") + e.what());
    return out;
  }
  const std::set<int> active_set(active.begin(), active.end());
  for (int seq : active_set) {
    if (!expected_next_position.count(seq)) {
      add(&out, "window", seq_name(seq) + " is active in the proposer but was never added or was released");
    }
  }

  for (const auto& [seq, next] : expected_next_position) {
    const std::string who = seq_name(seq);
    if (!active_set.count(seq)) {
      add(&out, "window", who + " should be active (next position " + std::to_string(next) +
                              ") but the proposer does not list it");
      continue;
    }
    SequenceView view;
    try {
      view = proposer.sequence_view(seq);
    } catch (const HarnessError& e) {
      add(&out, "introspection", who + ": sequence_view threw: " + e.what());
      continue;
    }
    const int64_t begin = retained > 0 ? std::max<int64_t>(0, next - retained) : 0;
    if (view.seq != seq) {
      add(&out, "window", who + ": its view is labelled sequence " + std::to_string(view.seq));
    }
    if (view.next_position != next) {
      add(&out, "window",
          who + ": next context position is " + std::to_string(view.next_position) + " but it has received " +
              std::to_string(next) + " positions");
    }
    if (view.window_begin != begin) {
      add(&out, "window",
          who + ": window starts at position " + std::to_string(view.window_begin) + "; the most recent of its " +
              std::to_string(next) + " positions it retains (" +
              retained_context_rule(proposer.config(), proposer.settings()) + ") start at " + std::to_string(begin));
    }
  }
  return out;
}

std::vector<InvariantViolation> check_cache_slots(const DraftProposer& proposer) {
  std::vector<InvariantViolation> out;
  PoolView pool;
  std::vector<int> active;
  try {
    pool = proposer.pool_view();
    active = proposer.sequences();
  } catch (const HarnessError& e) {
    add(&out, "introspection", std::string("pool_view()/sequences() threw: ") + e.what());
    return out;
  }
  const int num_pages = pool.num_pages;
  const int page_size = pool.page_size;
  if (num_pages < 1 || page_size < 1 || static_cast<int>(pool.page_owner.size()) != num_pages) {
    add(&out, "pool-accounting",
        "pool view is inconsistent: " + std::to_string(num_pages) + " pages of " + std::to_string(page_size) +
            " tokens but " + std::to_string(pool.page_owner.size()) + " page owners");
    return out;
  }
  const std::set<int> active_set(active.begin(), active.end());

  // Invariant 4: the free list holds distinct, unowned pages; free + owned = pool size.
  std::vector<int> times_free(num_pages, 0);
  for (int page : pool.free_pages) {
    if (page < 0 || page >= num_pages) {
      add(&out, "pool-accounting", "free list holds page " + std::to_string(page) + ", outside the pool of " +
                                       std::to_string(num_pages));
      continue;
    }
    if (++times_free[page] == 2) {
      add(&out, "pool-accounting", "page " + std::to_string(page) + " is on the free list twice");
    }
    if (pool.page_owner[page] != -1) {
      add(&out, "pool-accounting",
          "page " + std::to_string(page) + " is on the free list but owned by " + seq_name(pool.page_owner[page]));
    }
  }
  int owned = 0;
  for (int page = 0; page < num_pages; ++page) {
    const int owner = pool.page_owner[page];
    if (owner == -1) {
      if (times_free[page] == 0) {
        add(&out, "pool-accounting", "page " + std::to_string(page) + " is neither owned nor on the free list (leaked)");
      }
      continue;
    }
    ++owned;
    if (!active_set.count(owner)) {
      add(&out, "released-pages",
          "page " + std::to_string(page) + " is still owned by " + seq_name(owner) + ", which is not active");
    }
  }
  const int free_count = static_cast<int>(pool.free_pages.size());
  if (free_count + owned != num_pages) {
    add(&out, "pool-accounting",
        std::to_string(free_count) + " free + " + std::to_string(owned) + " owned pages != pool size " +
            std::to_string(num_pages));
  }

  // Invariants 1-3 per sequence, through its one block table and its window slots.
  std::map<int64_t, std::pair<int, int64_t>> slot_holder;  // slot -> (sequence, position)
  std::vector<int> listed_by(num_pages, -1);              // the sequence whose block table lists each page
  for (int seq : active) {
    const std::string who = seq_name(seq);
    SequenceView view;
    std::vector<int64_t> slots;
    try {
      view = proposer.sequence_view(seq);
      slots = proposer.window_slots(seq);
    } catch (const HarnessError& e) {
      add(&out, "introspection", who + ": sequence_view/window_slots threw: " + e.what());
      continue;
    }
    const int64_t window = view.window_size();
    if (window < 0) {
      add(&out, "window-slots", who + ": window begins at " + std::to_string(view.window_begin) +
                                    " after its next position " + std::to_string(view.next_position));
      continue;
    }

    // Exactly the pages spanning the window: none before it (they slid out), none after it (block
    // rows never keep cache space).
    const int64_t first_page = view.window_begin / page_size;
    const int64_t pages_needed = window == 0 ? 0 : (view.next_position - 1) / page_size - first_page + 1;
    if (static_cast<int64_t>(view.block_table.size()) != pages_needed ||
        (pages_needed > 0 && view.first_logical_page != first_page)) {
      add(&out, "window-slots",
          who + ": block table holds logical pages " + std::to_string(view.first_logical_page) + ".." +
              std::to_string(view.first_logical_page + static_cast<int64_t>(view.block_table.size()) - 1) +
              " but its window " + std::to_string(view.window_begin) + ".." + std::to_string(view.next_position - 1) +
              " spans logical pages " + std::to_string(first_page) + ".." +
              std::to_string(first_page + pages_needed - 1));
    }
    if (static_cast<int64_t>(slots.size()) != window) {
      add(&out, "window-slots",
          who + ": " + std::to_string(slots.size()) + " slots for a window of " + std::to_string(window) +
              " positions (" + std::to_string(view.window_begin) + ".." + std::to_string(view.next_position - 1) + ")");
    }

    bool pages_ok = true;
    for (size_t i = 0; i < view.block_table.size(); ++i) {
      const int page = view.block_table[i];
      if (page < 0 || page >= num_pages) {
        add(&out, "pool-accounting", who + ": block table entry " + std::to_string(i) + " is page " +
                                         std::to_string(page) + ", outside the pool");
        pages_ok = false;
        continue;
      }
      if (pool.page_owner[page] != seq) {
        add(&out, "pool-accounting",
            who + ": its block table lists page " + std::to_string(page) + ", owned by " +
                (pool.page_owner[page] == -1 ? std::string("nobody (free)") : seq_name(pool.page_owner[page])));
      }
      if (listed_by[page] != -1) {
        add(&out, "slot-unique",
            "page " + std::to_string(page) + " is in the block tables of " + seq_name(listed_by[page]) +
                (listed_by[page] == seq ? " twice" : " and " + who));
        pages_ok = false;
      }
      listed_by[page] = seq;
    }

    for (size_t i = 0; i < slots.size(); ++i) {
      const int64_t position = view.window_begin + static_cast<int64_t>(i);
      const int64_t slot = slots[i];
      // Invariant 2: the slot every layer uses is the one block table's mapping of the position.
      const int64_t logical = position / page_size - view.first_logical_page;
      if (pages_ok && logical >= 0 && logical < static_cast<int64_t>(view.block_table.size())) {
        const int64_t mapped = static_cast<int64_t>(view.block_table[logical]) * page_size + position % page_size;
        if (slot != mapped) {
          add(&out, "slot-layers",
              who + ": position " + std::to_string(position) + " is stored at slot " + std::to_string(slot) +
                  " but its block table maps it to slot " + std::to_string(mapped));
        }
      }
      if (slot < 0 || slot >= static_cast<int64_t>(num_pages) * page_size) {
        add(&out, "slot-unique", who + ": position " + std::to_string(position) + " has slot " +
                                     std::to_string(slot) + ", outside the pool");
        continue;
      }
      // Invariant 1: one (sequence, position) per slot.
      auto [it, inserted] = slot_holder.emplace(slot, std::make_pair(seq, position));
      if (!inserted) {
        add(&out, "slot-unique",
            "slot " + std::to_string(slot) + " holds " + seq_name(it->second.first) + " position " +
                std::to_string(it->second.second) + " and " + who + " position " + std::to_string(position));
      }
    }
  }

  // Every owned page belongs to the block table of its owner.
  for (int page = 0; page < num_pages; ++page) {
    const int owner = pool.page_owner[page];
    if (owner != -1 && active_set.count(owner) && listed_by[page] != owner) {
      add(&out, "pool-accounting",
          "page " + std::to_string(page) + " is owned by " + seq_name(owner) + " but not in its block table (leaked)");
    }
  }
  return out;
}

std::vector<InvariantViolation> check_all_invariants(const DraftProposer& proposer,
                                                     const std::map<int, int64_t>& expected_next_position) {
  std::vector<InvariantViolation> out = check_windows(proposer, expected_next_position);
  std::vector<InvariantViolation> slots = check_cache_slots(proposer);
  out.insert(out.end(), std::make_move_iterator(slots.begin()), std::make_move_iterator(slots.end()));
  return out;
}

}  // namespace dflash
