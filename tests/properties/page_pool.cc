#include "tests/properties/page_pool.h"

#include "core/error.h"

namespace dflash::prop {

void DoubleAssigningPool::release(int seq) {
  TablePool::release(seq);
  for (auto it = substituted_.begin(); it != substituted_.end();) {
    it = it->first.first == seq ? substituted_.erase(it) : std::next(it);
  }
}

std::vector<ContextAdmission> DoubleAssigningPool::admit(const std::vector<ContextRequest>& requests) {
  std::map<int, size_t> pages_before;
  for (const ContextRequest& r : requests) pages_before[r.seq] = table_.view(r.seq).block_table.size();
  std::vector<ContextAdmission> admissions = table_.admit(requests);
  const int last = requests.back().seq;
  const SequenceView last_view = table_.view(last);
  const bool took_last_free_page = table_.pool().free_pages.empty() &&
                                   last_view.first_logical_page + static_cast<int64_t>(last_view.block_table.size()) >
                                       static_cast<int64_t>(pages_before[last]);
  if (took_last_free_page && !last_view.block_table.empty()) {
    for (int other : table_.sequences()) {
      const SequenceView v = table_.view(other);
      if (other != last && !v.block_table.empty()) {
        const int64_t logical = last_view.first_logical_page + static_cast<int64_t>(last_view.block_table.size()) - 1;
        substituted_[{last, logical}] = v.block_table.front();
        break;
      }
    }
  }
  // Report the slots as the broken allocator assigned them.
  for (ContextAdmission& a : admissions) {
    const std::vector<int64_t> slots = window_slots(a.seq);
    a.slots.assign(slots.end() - static_cast<std::ptrdiff_t>(a.slots.size()), slots.end());
  }
  return admissions;
}

SequenceView DoubleAssigningPool::view(int seq) const {
  SequenceView v = TablePool::view(seq);
  for (size_t i = 0; i < v.block_table.size(); ++i) {
    auto it = substituted_.find({seq, v.first_logical_page + static_cast<int64_t>(i)});
    if (it != substituted_.end()) v.block_table[i] = it->second;
  }
  return v;
}

std::vector<int64_t> DoubleAssigningPool::window_slots(int seq) const {
  const SequenceView v = view(seq);
  const int page_size = table_.page_size();
  std::vector<int64_t> slots;
  for (int64_t pos = v.window_begin; pos < v.next_position; ++pos) {
    slots.push_back(static_cast<int64_t>(v.block_table[pos / page_size - v.first_logical_page]) * page_size +
                    pos % page_size);
  }
  return slots;
}

PoolIntrospection::PoolIntrospection(const PagePool& pool, int page_size, int64_t ctx_cap) : pool_(pool) {
  config_.vocab_size = 1;
  settings_.kv_page_size = page_size;
  settings_.ctx_cap = ctx_cap;
  settings_.uncapped = ctx_cap == 0;
  settings_.gamma = 2;
}

void PoolIntrospection::add_sequence(int) { throw internal_error("PoolIntrospection is read-only"); }
void PoolIntrospection::release_sequence(int) { throw internal_error("PoolIntrospection is read-only"); }
void PoolIntrospection::set_block_g(int) { throw internal_error("PoolIntrospection is read-only"); }
std::vector<ProposeOutput> PoolIntrospection::propose(const std::vector<ProposeInput>&, bool) {
  throw internal_error("PoolIntrospection is read-only");
}

}  // namespace dflash::prop
