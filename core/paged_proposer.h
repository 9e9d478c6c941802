// What every paged drafter shares, so that each implementation adds only its arithmetic: the
// config and resolved head settings, the paged-cache bookkeeping (KvPageTable), the block width
// and its clamp, the introspection, and the validation of a batch before any state changes.
#pragma once
#include <vector>

#include "core/kv_pages.h"
#include "core/proposer.h"

namespace dflash {

class PagedProposer : public DraftProposer {
 public:
  // `settings` must already be resolved (HeadSettings::resolved); the block width starts at
  // clamp(gamma, 2, max(gamma, 2)).
  PagedProposer(const DrafterConfig& config, const HeadSettings& settings);

  const DrafterConfig& config() const override { return config_; }
  const HeadSettings& settings() const override { return settings_; }

  void add_sequence(int seq) override { table_.add(seq); }
  void release_sequence(int seq) override;
  void set_block_g(int g) override { block_g_ = clamp_block_width(g, settings_.gamma); }
  int block_g() const override { return block_g_; }

  std::vector<int> sequences() const override { return table_.sequences(); }
  SequenceView sequence_view(int seq) const override { return table_.view(seq); }
  std::vector<int64_t> window_slots(int seq) const override { return table_.window_slots(seq); }
  PoolView pool_view() const override { return table_.pool(); }

 private:
  // Runs `change` on the table and, in the debug mode, poisons the pages it freed.
  template <typename Change>
  auto poisoning_freed(Change change) -> decltype(change());

 protected:
  // Everything that can be wrong with a batch apart from positions and pool space (which
  // admit_context checks): empty or larger than max_batch, a sequence twice or not active, a
  // missing or misshapen ctx tensor, an anchor outside [0, V), rows before position 0, NaN/Inf.
  void validate_batch(const std::vector<ProposeInput>& batch) const;
  // validate_batch, then KvPageTable::admit: atomic, nothing changes on any error.
  std::vector<ContextAdmission> admit_context(const std::vector<ProposeInput>& batch);
  // HeadSettings::poison_freed_pages: fills every slot of `pages` with NaN in every layer's K and V
  // pools. Called after a release or an admission freed them; the default refuses (a proposer
  // without pools of its own cannot run in that mode).
  virtual void poison_pages(const std::vector<int>& pages);
  // In the debug mode, every page (all start on the free list) poisoned: for the most-derived
  // constructor, once its pools exist.
  void poison_free_pool();

  const DrafterConfig config_;
  const HeadSettings settings_;
  KvPageTable table_;
  int block_g_;
};

}  // namespace dflash
