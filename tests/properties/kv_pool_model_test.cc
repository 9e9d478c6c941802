// Property 3, model-based part: random command sequences (add, append, slide, propose, release,
// exhaust, and every kind of refused request) on KvPageTable against PoolModel, with the six
// cache invariants of docs/spec/drafter.md §5 checked after every command. A deliberately broken allocator
// that double-assigns a page must be caught.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/state.h>

#include <algorithm>
#include <sstream>

#include "compare/invariants.h"
#include "core/error.h"
#include "tests/properties/page_pool.h"
#include "tests/properties/pool_model.h"
#include "tests/properties/property_check.h"
#include "tests/properties/trace.h"

namespace dflash::prop {
namespace {

struct PoolState {
  PoolModel model;
  int next_id = 0;
  int64_t max_positions = 64;
  uint64_t page_order_seed = 0;

  TraceShape shape() const {
    TraceShape s;
    s.ctx_cap = model.ctx_cap;
    s.page_size = model.page_size;
    s.max_positions = max_positions;
    return s;
  }
};

using PoolCommand = rc::state::Command<PoolState, PagePool>;

std::string listing(const std::vector<InvariantViolation>& violations) {
  std::string text;
  for (const InvariantViolation& v : violations) text += "\n  [" + v.invariant + "] " + v.detail;
  return text;
}

// The pool after a command against the model's state after it.
void verify(const PoolState& s, const PagePool& pool) {
  PoolIntrospection view(pool, s.model.page_size, s.model.ctx_cap);
  const auto violations = check_all_invariants(view, s.model.next);
  if (!violations.empty()) fail_case("cache invariants broken:" + listing(violations));
  std::vector<int> expected_ids;
  for (const auto& entry : s.model.next) expected_ids.push_back(entry.first);
  RC_ASSERT(pool.sequences() == expected_ids);
  for (const auto& [seq, next] : s.model.next) {
    const int64_t pages = static_cast<int64_t>(pool.view(seq).block_table.size());
    if (pages != s.model.pages_for(next)) {
      fail_case("sequence " + std::to_string(seq) + " holds " + std::to_string(pages) + " pages; its window needs " +
                std::to_string(s.model.pages_for(next)));
    }
  }
  RC_ASSERT(static_cast<int64_t>(pool.pool().free_pages.size()) == s.model.free_pages());
}

struct PoolSnapshot {
  std::vector<std::pair<int, std::vector<int64_t>>> slots;
  std::vector<std::vector<int>> tables;
  PoolView pool;
  bool operator==(const PoolSnapshot& o) const {
    return slots == o.slots && tables == o.tables && pool.free_pages == o.pool.free_pages &&
           pool.page_owner == o.pool.page_owner;
  }
};
PoolSnapshot snapshot(const PagePool& pool) {
  PoolSnapshot s;
  for (int seq : pool.sequences()) {
    s.slots.emplace_back(seq, pool.window_slots(seq));
    s.tables.push_back(pool.view(seq).block_table);
  }
  s.pool = pool.pool();
  return s;
}

// Runs `action`, which must throw HarnessError of `kind` mentioning `mention`, and leave `pool` as it was.
template <typename Action>
void expect_refused(PagePool& pool, ErrorKind kind, const std::string& mention, Action action) {
  const PoolSnapshot before = snapshot(pool);
  try {
    action();
  } catch (const HarnessError& e) {
    if (e.kind() != kind) fail_case(std::string("refused with the wrong error kind: ") + e.what());
    if (std::string(e.what()).find(mention) == std::string::npos) {
      fail_case("error does not name '" + mention + "': " + e.what());
    }
    if (!(snapshot(pool) == before)) fail_case(std::string("a refused request changed the pool: ") + e.what());
    return;
  }
  fail_case("request accepted; expected a refusal naming '" + mention + "'");
}

std::vector<int> active_ids(const PoolState& s) {
  std::vector<int> ids;
  for (const auto& entry : s.model.next) ids.push_back(entry.first);
  return ids;
}

struct AddSequence : PoolCommand {
  int seq;
  explicit AddSequence(const PoolState& s) : seq(s.next_id) { RC_PRE(s.model.next.size() < 6); }
  void checkPreconditions(const PoolState& s) const override {
    RC_PRE(!s.model.next.count(seq) && !s.model.released.count(seq));
  }
  void apply(PoolState& s) const override {
    s.model.next[seq] = 0;
    s.next_id = std::max(s.next_id, seq + 1);
  }
  void run(const PoolState& s0, PagePool& pool) const override {
    pool.add(seq);
    verify(nextState(s0), pool);
  }
  void show(std::ostream& os) const override { os << "add " << seq; }
};

// Append, slide or plain propose (C = 0) for up to three sequences in one batch; with `exhaust`,
// large counts for every sequence, kept only when the pool cannot hold them.
struct Admit : PoolCommand {
  std::vector<std::pair<int, int64_t>> counts;  // (sequence, C)
  bool exhaust = false;

  Admit(const PoolState& s, bool exhaust_pool) : exhaust(exhaust_pool) {
    std::vector<int> ids = active_ids(s);
    RC_PRE(!ids.empty());
    const int k = exhaust ? static_cast<int>(ids.size()) : *rc::gen::inRange(1, std::min<int>(3, static_cast<int>(ids.size())) + 1);
    for (int i = 0; i < k; ++i) {
      const int pick = *rc::gen::inRange<int>(0, static_cast<int>(ids.size()));
      const int seq = ids[pick];
      ids.erase(ids.begin() + pick);
      const int64_t next = s.model.next.at(seq);
      int64_t count = exhaust ? std::max<int64_t>(0, s.max_positions - next) : *gen_context_count(next, s.shape());
      if (next == 0) count = std::max<int64_t>(count, 1);
      counts.emplace_back(seq, count);
    }
    if (exhaust) RC_PRE(!s.model.fits_in_order(requests(s)));
  }
  std::vector<ContextRequest> requests(const PoolState& s) const {
    std::vector<ContextRequest> r;
    for (const auto& [seq, count] : counts) r.push_back({seq, s.model.next.at(seq) + count, count});
    return r;
  }
  void checkPreconditions(const PoolState& s) const override {
    for (const auto& [seq, count] : counts) {
      RC_PRE(s.model.next.count(seq) != 0);
      RC_PRE(s.model.next.at(seq) > 0 || count > 0);
    }
    if (exhaust) RC_PRE(!s.model.fits_in_order(requests(s)));
  }
  void apply(PoolState& s) const override {
    const auto r = requests(s);
    if (s.model.fits_in_order(r)) s.model.apply(r);
  }
  void run(const PoolState& s0, PagePool& pool) const override {
    const auto r = requests(s0);
    if (!s0.model.fits_in_order(r)) {
      expect_refused(pool, ErrorKind::kPoolExhausted, "exhausted", [&] { pool.admit(r); });
      verify(s0, pool);
      return;
    }
    const std::vector<ContextAdmission> admissions = pool.admit(r);
    RC_ASSERT(admissions.size() == r.size());
    const PoolState s1 = nextState(s0);
    for (size_t i = 0; i < r.size(); ++i) {
      const ContextAdmission& a = admissions[i];
      const int64_t first = r[i].start - r[i].count;
      const int64_t kept_from = std::max(first, s1.model.window_begin(r[i].start));
      RC_ASSERT(a.seq == r[i].seq);
      RC_ASSERT(a.first_position == kept_from);
      RC_ASSERT(a.first_row == kept_from - first);
      // The admitted rows' slots are the newest of the window's slots.
      const std::vector<int64_t> window = pool.window_slots(a.seq);
      RC_ASSERT(static_cast<int64_t>(a.slots.size()) == r[i].start - kept_from);
      RC_ASSERT(std::equal(a.slots.begin(), a.slots.end(), window.end() - static_cast<std::ptrdiff_t>(a.slots.size())));
    }
    verify(s1, pool);
  }
  void show(std::ostream& os) const override {
    os << (exhaust ? "exhaust" : "admit");
    for (const auto& [seq, count] : counts) os << " {s" << seq << " C " << count << "}";
  }
};

struct AdmitSome : Admit {
  explicit AdmitSome(const PoolState& s) : Admit(s, false) {}
};
struct ExhaustPool : Admit {
  explicit ExhaustPool(const PoolState& s) : Admit(s, true) {}
};

// Gaps, overlaps, duplicates, unknown or released ids, an empty new sequence: each refused with
// kBadInput naming the sequence, after a valid request earlier in the same batch (atomicity).
struct BadAdmit : PoolCommand {
  enum Kind { kGap, kOverlap, kDuplicate, kUnknown, kReleased, kEmptyNew, kCount };
  Kind kind;
  int seq = -1;
  int64_t count = 1;
  int valid_seq = -1;  // a valid request placed first, or -1

  explicit BadAdmit(const PoolState& s) : kind(static_cast<Kind>(*rc::gen::inRange(0, static_cast<int>(kCount)))) {
    const std::vector<int> ids = active_ids(s);
    switch (kind) {
      case kUnknown: seq = s.next_id + 1000; break;
      case kReleased:
        RC_PRE(!s.model.released.empty());
        seq = *rc::gen::elementOf(std::vector<int>(s.model.released.begin(), s.model.released.end()));
        break;
      case kEmptyNew: {
        std::vector<int> empty;
        for (int id : ids) {
          if (s.model.next.at(id) == 0) empty.push_back(id);
        }
        RC_PRE(!empty.empty());
        seq = *rc::gen::elementOf(empty);
        count = 0;
        break;
      }
      default:
        RC_PRE(!ids.empty());
        seq = *rc::gen::elementOf(ids);
        if (kind == kOverlap) RC_PRE(s.model.next.at(seq) > 0);
        count = *rc::gen::inRange<int64_t>(1, 4);
    }
    for (int id : ids) {
      if (id != seq && s.model.next.at(id) > 0 && *rc::gen::arbitrary<bool>()) {
        valid_seq = id;
        break;
      }
    }
  }
  void checkPreconditions(const PoolState& s) const override {
    if (kind == kReleased) RC_PRE(s.model.released.count(seq) != 0);
    if (kind == kUnknown) RC_PRE(!s.model.next.count(seq) && !s.model.released.count(seq));
    if (kind == kEmptyNew) RC_PRE(s.model.next.count(seq) && s.model.next.at(seq) == 0);
    if (kind == kGap || kind == kOverlap || kind == kDuplicate) RC_PRE(s.model.next.count(seq) != 0);
    if (kind == kOverlap) RC_PRE(s.model.next.at(seq) > 0);
    if (valid_seq >= 0) RC_PRE(s.model.next.count(valid_seq) && s.model.next.at(valid_seq) > 0);
  }
  void run(const PoolState& s0, PagePool& pool) const override {
    std::vector<ContextRequest> r;
    if (valid_seq >= 0) r.push_back({valid_seq, s0.model.next.at(valid_seq) + 1, 1});
    const int64_t next = s0.model.next.count(seq) ? s0.model.next.at(seq) : 0;
    std::string mention = "sequence " + std::to_string(seq);
    switch (kind) {
      case kGap: r.push_back({seq, next + count + 1, count}); mention += ": context rows cover"; break;
      case kOverlap: r.push_back({seq, next + count - 1, count}); mention += ": context rows cover"; break;
      case kDuplicate:  // C = 0 twice: no pages needed, so only the duplicate can be the error
        r.push_back({seq, next, 0});
        r.push_back({seq, next, 0});
        break;
      default: r.push_back({seq, next + count, count}); break;
    }
    // The valid request alone could exhaust a tiny pool; then exhaustion is the right refusal.
    if (valid_seq >= 0 && !s0.model.fits_in_order({r.front()})) return;
    expect_refused(pool, ErrorKind::kBadInput, mention, [&] { pool.admit(r); });
    verify(s0, pool);
  }
  void show(std::ostream& os) const override {
    static const char* names[] = {"gap", "overlap", "duplicate", "unknown id", "released id", "empty new sequence"};
    os << "bad admit (" << names[kind] << ") s" << seq << " C " << count;
    if (valid_seq >= 0) os << " after a valid s" << valid_seq;
  }
};

struct Release : PoolCommand {
  int seq;
  explicit Release(const PoolState& s) {
    const std::vector<int> ids = active_ids(s);
    RC_PRE(!ids.empty());
    seq = *rc::gen::elementOf(ids);
  }
  void checkPreconditions(const PoolState& s) const override { RC_PRE(s.model.next.count(seq) != 0); }
  void apply(PoolState& s) const override {
    s.model.next.erase(seq);
    s.model.released.insert(seq);
  }
  void run(const PoolState& s0, PagePool& pool) const override {
    pool.release(seq);
    verify(nextState(s0), pool);
  }
  void show(std::ostream& os) const override { os << "release " << seq; }
};

// Adding an id in use or released, releasing one that is not active: refused, nothing changes.
struct BadLifecycle : PoolCommand {
  bool add = true;
  int seq = -1;
  explicit BadLifecycle(const PoolState& s) {
    add = *rc::gen::arbitrary<bool>();
    std::vector<int> candidates;
    if (add) {
      candidates = active_ids(s);
      candidates.insert(candidates.end(), s.model.released.begin(), s.model.released.end());
    } else {
      candidates.assign(s.model.released.begin(), s.model.released.end());
      candidates.push_back(s.next_id + 500);  // never added
    }
    RC_PRE(!candidates.empty());
    seq = *rc::gen::elementOf(candidates);
  }
  void checkPreconditions(const PoolState& s) const override {
    const bool known = s.model.next.count(seq) || s.model.released.count(seq);
    const bool valid = add ? known : s.model.next.count(seq) == 0;
    RC_PRE(valid);
  }
  void run(const PoolState& s0, PagePool& pool) const override {
    const std::string mention = "sequence " + std::to_string(seq);
    if (add) {
      expect_refused(pool, ErrorKind::kBadInput, mention, [&] { pool.add(seq); });
    } else {
      expect_refused(pool, ErrorKind::kBadInput, mention, [&] { pool.release(seq); });
    }
    verify(s0, pool);
  }
  void show(std::ostream& os) const override { os << (add ? "add again " : "release inactive ") << seq; }
};

// One random pool, then a random command sequence on `PoolT` against the model.
template <typename PoolT>
void pool_follows_model() {
  PoolState s;
  s.model.page_size = *rc::gen::element(1, 2, 3, 4, 8);
  const int ps = s.model.page_size;
  s.model.ctx_cap = *rc::gen::element<int64_t>(0, 1, 2, std::max(1, ps - 1), ps, ps + 1, 2 * ps + 3, 13);
  s.model.num_pages = *rc::gen::inRange(1, 25);
  s.max_positions = s.model.ctx_cap > 0 ? 3 * s.model.ctx_cap + 3 * ps + 4 : 48;
  s.page_order_seed = *rc::gen::element<uint64_t>(0, 7, 0x5eed);
  PoolT concrete(s.model.num_pages, s.model.page_size, s.model.ctx_cap, s.page_order_seed);
  PagePool& pool = concrete;
  verify(s, pool);
  rc::state::check(s, pool,
                   rc::state::gen::execOneOfWithArgs<AddSequence, AddSequence, AdmitSome, AdmitSome, AdmitSome,
                                                     ExhaustPool, BadAdmit, Release, BadLifecycle>());
}

TEST(KvPoolModel, KvPageTableFollowsThePoolModelAndKeepsTheCacheInvariants) {
  check_property(100, [] { pool_follows_model<TablePool>(); });
}

TEST(KvPoolModel, CatchesAnAllocatorThatDoubleAssignsAPage) {
  std::string failure;
  ASSERT_TRUE(property_fails(500, 1, [] { pool_follows_model<DoubleAssigningPool>(); }, &failure))
      << "the broken allocator passed 500 cases: " << failure;
  EXPECT_NE(failure.find("slot-unique"), std::string::npos) << failure;
}

}  // namespace
}  // namespace dflash::prop
