#include "tests/properties/pool_model.h"

#include <algorithm>

namespace dflash::prop {

int64_t PoolModel::window_begin(int64_t next_position) const {
  return ctx_cap > 0 ? std::max<int64_t>(0, next_position - ctx_cap) : 0;
}

int64_t PoolModel::pages_for(int64_t next_position) const {
  if (next_position == 0) return 0;
  return (next_position - 1) / page_size - window_begin(next_position) / page_size + 1;
}

int64_t PoolModel::pages_owned() const {
  int64_t owned = 0;
  for (const auto& entry : next) owned += pages_for(entry.second);
  return owned;
}

bool PoolModel::fits_in_order(const std::vector<ContextRequest>& requests) const {
  int64_t available = free_pages();
  for (const ContextRequest& r : requests) {
    const int64_t old_next = next.at(r.seq);
    const int64_t old_pages = pages_for(old_next);
    // Logical pages kept: the overlap of the old span with the new one (windows only move forward).
    int64_t kept = 0;
    if (old_pages > 0) {
      const int64_t old_last = (old_next - 1) / page_size;
      const int64_t new_first = window_begin(r.start) / page_size;
      kept = std::max<int64_t>(0, old_last - new_first + 1);
    }
    available += old_pages - kept;
    const int64_t needed = pages_for(r.start) - kept;
    if (needed > available) return false;
    available -= needed;
  }
  return true;
}

bool PoolModel::fits_in_total(const std::vector<ContextRequest>& requests) const {
  std::map<int, int64_t> after = next;
  for (const ContextRequest& r : requests) after[r.seq] = r.start;
  int64_t owned = 0;
  for (const auto& entry : after) owned += pages_for(entry.second);
  return owned <= num_pages;
}

void PoolModel::apply(const std::vector<ContextRequest>& requests) {
  for (const ContextRequest& r : requests) next[r.seq] = r.start;
}

}  // namespace dflash::prop
