// The paged pool reduced to counts (docs/spec/drafter.md §5): which positions each sequence holds and how
// many pages that takes, never which pages. Small enough to be obviously right; the model-based
// test drives KvPageTable against it and the proposer properties use it to predict exhaustion.
#pragma once
#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include "core/kv_pages.h"

namespace dflash::prop {

struct PoolModel {
  int num_pages = 0;
  int page_size = 1;
  int64_t ctx_cap = 0;           // 0 = uncapped
  std::map<int, int64_t> next;   // active sequences -> next context position
  std::set<int> released;

  int64_t window_begin(int64_t next_position) const;
  // Pages spanning the window of a sequence whose next position is `next_position`.
  int64_t pages_for(int64_t next_position) const;
  int64_t pages_owned() const;
  int64_t free_pages() const { return num_pages - pages_owned(); }

  // True when every request finds its pages processing them in order, each first returning the
  // pages that slid out of its own window (KvPageTable's order).
  bool fits_in_order(const std::vector<ContextRequest>& requests) const;
  // True when the pool could hold every window after the batch in some order.
  bool fits_in_total(const std::vector<ContextRequest>& requests) const;
  void apply(const std::vector<ContextRequest>& requests);
};

}  // namespace dflash::prop
