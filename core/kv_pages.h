// Bookkeeping of the paged KV cache (docs/spec/drafter.md §5), shared by both drafters so that the slot of a
// (sequence, position) is decided in one place. Each drafter keeps its own K/V storage (one pool
// per layer, all addressed by these slots); block rows never get slots.
#pragma once
#include <cstdint>
#include <map>
#include <set>
#include <vector>

namespace dflash {

// What one sequence holds now; read-only introspection for invariant checks.
struct SequenceView {
  int seq = -1;
  int64_t next_position = 0;   // the next context position expected (= the last propose's start)
  int64_t window_begin = 0;    // first position the drafter attends to
  int64_t first_logical_page = 0;  // logical page (position / page_size) of block_table[0]
  std::vector<int> block_table;    // physical page of each logical page from first_logical_page on
  int64_t window_size() const { return next_position - window_begin; }
};

struct PoolView {
  int num_pages = 0;
  int page_size = 0;
  std::vector<int> free_pages;   // in the order they will be handed out
  std::vector<int> page_owner;   // sequence owning each page, -1 when free
};

// Rows of one propose's context that enter a sequence's window, and where they go.
struct ContextAdmission {
  int seq = -1;
  int64_t first_row = 0;        // index into the propose's ctx rows of the first row kept
  int64_t first_position = 0;   // its absolute position
  std::vector<int64_t> slots;   // one slot per kept row, in position order
};

// A request to add `count` context rows ending just before `start` to sequence `seq`.
struct ContextRequest {
  int seq;
  int64_t start;  // anchor position s; the rows are s-count .. s-1
  int64_t count;  // C
};

class KvPageTable {
 public:
  // `retained`: the newest context positions each sequence keeps (retained_context, core/proposer.h);
  // 0 keeps every position. page_order_seed = 0 hands pages out in ascending order; any other
  // value hands them out in a fixed pseudo-random order (outputs must not change, invariant 6).
  KvPageTable(int num_pages, int page_size, int64_t retained, uint64_t page_order_seed = 0);

  void add(int seq);      // a new, empty sequence; an id in use or released before is an error
  void release(int seq);  // frees its pages; the id may not be used again
  bool has(int seq) const { return sequences_.count(seq) != 0; }
  std::vector<int> sequences() const;

  // Validates and applies the context rows of one batched propose, atomically: on any error
  // (gap, overlap, unknown or duplicate sequence, C = 0 on an empty sequence, pool exhausted)
  // nothing changes and the error names the sequence and positions.
  std::vector<ContextAdmission> admit(const std::vector<ContextRequest>& requests);

  // Slot of every position of the window, in position order.
  std::vector<int64_t> window_slots(int seq) const;
  int64_t slot_of(int seq, int64_t position) const;  // error outside the window

  SequenceView view(int seq) const;
  PoolView pool() const;
  int num_pages() const { return num_pages_; }
  int page_size() const { return page_size_; }
  int64_t retained() const { return retained_; }

 private:
  struct Sequence {
    int64_t next_position = 0;
    int64_t window_begin = 0;
    int64_t first_logical_page = 0;
    std::vector<int> pages;
  };
  const Sequence& get(int seq) const;

  int num_pages_;
  int page_size_;
  int64_t retained_;
  std::vector<int> free_pages_;  // handed out from the front, returned at the back
  std::vector<int> owner_;
  std::map<int, Sequence> sequences_;
  std::set<int> released_;
};

// clamp(requested, 2, max(gamma, 2)) (docs/spec/drafter.md §5).
int clamp_block_width(int requested, int gamma);

}  // namespace dflash
