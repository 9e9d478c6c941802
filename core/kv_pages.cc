#include "core/kv_pages.h"

#include <algorithm>
#include <random>
#include <string>

#include "core/error.h"

namespace dflash {

int clamp_block_width(int requested, int gamma) { return std::clamp(requested, 2, std::max(gamma, 2)); }

KvPageTable::KvPageTable(int num_pages, int page_size, int64_t retained, uint64_t page_order_seed)
    : num_pages_(num_pages), page_size_(page_size), retained_(retained), owner_(num_pages, -1) {
  if (num_pages < 1) throw bad_input("kv pool: num_pages must be >= 1, got " + std::to_string(num_pages));
  if (page_size < 1) throw bad_input("kv pool: kv_page_size must be >= 1, got " + std::to_string(page_size));
  if (retained < 0) throw bad_input("kv pool: retained positions must be >= 0, got " + std::to_string(retained));
  free_pages_.resize(num_pages);
  for (int i = 0; i < num_pages; ++i) free_pages_[i] = i;
  if (page_order_seed != 0) {
    std::mt19937_64 rng(page_order_seed);
    for (int i = num_pages - 1; i > 0; --i) {  // Fisher-Yates with a fixed generator: same seed, same order
      std::swap(free_pages_[i], free_pages_[static_cast<int>(rng() % static_cast<uint64_t>(i + 1))]);
    }
  }
}

void KvPageTable::add(int seq) {
  if (sequences_.count(seq)) throw bad_input("sequence " + std::to_string(seq) + " is already active");
  if (released_.count(seq)) throw bad_input("sequence " + std::to_string(seq) + " was released and may not be used again");
  sequences_[seq] = Sequence{};
}

void KvPageTable::release(int seq) {
  auto it = sequences_.find(seq);
  if (it == sequences_.end()) {
    throw bad_input("release of sequence " + std::to_string(seq) +
                    (released_.count(seq) ? ", which was already released" : ", which is not active"));
  }
  for (int page : it->second.pages) {
    owner_[page] = -1;
    free_pages_.push_back(page);
  }
  sequences_.erase(it);
  released_.insert(seq);
}

std::vector<int> KvPageTable::sequences() const {
  std::vector<int> ids;
  for (const auto& entry : sequences_) ids.push_back(entry.first);
  return ids;
}

const KvPageTable::Sequence& KvPageTable::get(int seq) const {
  auto it = sequences_.find(seq);
  if (it == sequences_.end()) throw bad_input("sequence " + std::to_string(seq) + " is not active");
  return it->second;
}

std::vector<ContextAdmission> KvPageTable::admit(const std::vector<ContextRequest>& requests) {
  // Work on copies so that an error leaves every sequence and the pool as they were.
  std::vector<int> free_pages = free_pages_;
  std::vector<int> owner = owner_;
  std::map<int, Sequence> updated;
  std::vector<ContextAdmission> admissions;
  size_t next_free = 0;  // pages are taken from the front of `free_pages`

  for (const ContextRequest& request : requests) {
    const std::string who = "sequence " + std::to_string(request.seq);
    if (updated.count(request.seq)) throw bad_input(who + " appears twice in one propose");
    Sequence seq = get(request.seq);
    if (request.count < 0) throw bad_input(who + ": negative context row count");
    if (request.count == 0 && seq.next_position == 0) {
      throw bad_input(who + ": a new sequence needs at least one context row (C = 0 at start " +
                      std::to_string(request.start) + ")");
    }
    const int64_t first = request.start - request.count;
    if (first != seq.next_position) {
      throw bad_input(who + ": context rows cover positions " + std::to_string(first) + ".." +
                      std::to_string(request.start - 1) + " but the next context position is " +
                      std::to_string(seq.next_position) +
                      (first > seq.next_position ? " (a gap)" : " (an overlap)"));
    }
    const int64_t end = request.start;
    const int64_t window_begin = retained_ > 0 ? std::max<int64_t>(0, end - retained_) : 0;

    // Pages wholly before the window leave first, so a sliding sequence can reuse them.
    const int64_t first_needed_page = window_begin / page_size_;
    while (!seq.pages.empty() && seq.first_logical_page < first_needed_page) {
      const int page = seq.pages.front();
      seq.pages.erase(seq.pages.begin());
      owner[page] = -1;
      free_pages.push_back(page);
      ++seq.first_logical_page;
    }
    if (seq.pages.empty()) seq.first_logical_page = first_needed_page;

    ContextAdmission admission;
    admission.seq = request.seq;
    admission.first_position = std::max(first, window_begin);
    admission.first_row = admission.first_position - first;
    const int64_t last_page = end > 0 ? (end - 1) / page_size_ : -1;
    while (seq.first_logical_page + static_cast<int64_t>(seq.pages.size()) <= last_page) {
      if (next_free >= free_pages.size()) {
        throw HarnessError(ErrorKind::kPoolExhausted,
                           who + ": the KV pool is exhausted (" + std::to_string(num_pages_) +
                               " pages of " + std::to_string(page_size_) + " tokens) while adding positions " +
                               std::to_string(admission.first_position) + ".." + std::to_string(end - 1) +
                               "; no sequence was changed");
      }
      const int page = free_pages[next_free++];
      owner[page] = request.seq;
      seq.pages.push_back(page);
    }
    for (int64_t pos = admission.first_position; pos < end; ++pos) {
      const int64_t logical = pos / page_size_ - seq.first_logical_page;
      admission.slots.push_back(static_cast<int64_t>(seq.pages[logical]) * page_size_ + pos % page_size_);
    }
    seq.next_position = end;
    seq.window_begin = window_begin;
    updated[request.seq] = std::move(seq);
    admissions.push_back(std::move(admission));
  }

  free_pages.erase(free_pages.begin(), free_pages.begin() + static_cast<std::ptrdiff_t>(next_free));
  free_pages_ = std::move(free_pages);
  owner_ = std::move(owner);
  for (auto& entry : updated) sequences_[entry.first] = std::move(entry.second);
  return admissions;
}

int64_t KvPageTable::slot_of(int seq, int64_t position) const {
  const Sequence& s = get(seq);
  if (position < s.window_begin || position >= s.next_position) {
    throw bad_input("sequence " + std::to_string(seq) + ": position " + std::to_string(position) +
                    " is outside its window " + std::to_string(s.window_begin) + ".." +
                    std::to_string(s.next_position - 1));
  }
  const int64_t logical = position / page_size_ - s.first_logical_page;
  return static_cast<int64_t>(s.pages[logical]) * page_size_ + position % page_size_;
}

std::vector<int64_t> KvPageTable::window_slots(int seq) const {
  const Sequence& s = get(seq);
  std::vector<int64_t> slots;
  slots.reserve(static_cast<size_t>(s.next_position - s.window_begin));
  for (int64_t pos = s.window_begin; pos < s.next_position; ++pos) {
    const int64_t logical = pos / page_size_ - s.first_logical_page;
    slots.push_back(static_cast<int64_t>(s.pages[logical]) * page_size_ + pos % page_size_);
  }
  return slots;
}

SequenceView KvPageTable::view(int seq) const {
  const Sequence& s = get(seq);
  SequenceView v;
  v.seq = seq;
  v.next_position = s.next_position;
  v.window_begin = s.window_begin;
  v.first_logical_page = s.first_logical_page;
  v.block_table = s.pages;
  return v;
}

PoolView KvPageTable::pool() const {
  PoolView v;
  v.num_pages = num_pages_;
  v.page_size = page_size_;
  v.free_pages = free_pages_;
  v.page_owner = owner_;
  return v;
}

}  // namespace dflash
