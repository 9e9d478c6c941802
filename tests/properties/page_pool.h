// The paged-cache bookkeeping as the model-based test drives it: KvPageTable itself, a
// deliberately broken allocator around it, and an adapter that lets the invariant checker of
// compare/invariants.h read a bare pool through the proposer introspection interface.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/kv_pages.h"
#include "core/proposer.h"

namespace dflash::prop {

class PagePool {
 public:
  virtual ~PagePool() = default;
  virtual void add(int seq) = 0;
  virtual void release(int seq) = 0;
  virtual std::vector<ContextAdmission> admit(const std::vector<ContextRequest>& requests) = 0;
  virtual std::vector<int> sequences() const = 0;
  virtual SequenceView view(int seq) const = 0;
  virtual std::vector<int64_t> window_slots(int seq) const = 0;
  virtual PoolView pool() const = 0;
};

class TablePool : public PagePool {
 public:
  TablePool(int num_pages, int page_size, int64_t ctx_cap, uint64_t page_order_seed)
      : table_(num_pages, page_size, ctx_cap, page_order_seed) {}
  void add(int seq) override { table_.add(seq); }
  void release(int seq) override { table_.release(seq); }
  std::vector<ContextAdmission> admit(const std::vector<ContextRequest>& requests) override { return table_.admit(requests); }
  std::vector<int> sequences() const override { return table_.sequences(); }
  SequenceView view(int seq) const override { return table_.view(seq); }
  std::vector<int64_t> window_slots(int seq) const override { return table_.window_slots(seq); }
  PoolView pool() const override { return table_.pool(); }

 protected:
  KvPageTable table_;
};

// Broken on purpose: when an admission takes the pool's last free page, the allocator hands out
// one page too many, "past the end of the free list": the newest page of the last request is
// replaced by the first page of another sequence, which then holds two (sequence, position)s per
// slot. Only a full pool with two sequences holding context shows it.
class DoubleAssigningPool : public TablePool {
 public:
  using TablePool::TablePool;
  void release(int seq) override;
  std::vector<ContextAdmission> admit(const std::vector<ContextRequest>& requests) override;
  SequenceView view(int seq) const override;
  std::vector<int64_t> window_slots(int seq) const override;

 private:
  std::map<std::pair<int, int64_t>, int> substituted_;  // (sequence, logical page) -> page handed out
};

// Read-only DraftProposer view of a pool for check_all_invariants; everything else is refused.
class PoolIntrospection : public DraftProposer {
 public:
  PoolIntrospection(const PagePool& pool, int page_size, int64_t ctx_cap);
  std::string name() const override { return "page-pool"; }
  const DrafterConfig& config() const override { return config_; }
  const HeadSettings& settings() const override { return settings_; }
  void add_sequence(int) override;
  void release_sequence(int) override;
  void set_block_g(int) override;
  int block_g() const override { return 2; }
  std::vector<ProposeOutput> propose(const std::vector<ProposeInput>&, bool) override;
  std::vector<int> sequences() const override { return pool_.sequences(); }
  SequenceView sequence_view(int seq) const override { return pool_.view(seq); }
  std::vector<int64_t> window_slots(int seq) const override { return pool_.window_slots(seq); }
  PoolView pool_view() const override { return pool_.pool(); }
  std::vector<std::pair<std::string, std::string>> describe() const override { return {{"proposer", "page-pool"}}; }

 private:
  const PagePool& pool_;
  DrafterConfig config_;
  HeadSettings settings_;
};

}  // namespace dflash::prop
