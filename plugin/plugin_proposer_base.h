// What a plugin's drafter in this process (plugin_drafter.h) and in a child (isolated_drafter.h)
// share: the config and settings it was made with, the sequences the harness has handed it, and the
// page-table introspection the ABI does not have (Introspection::cache_view is false for both, so
// the replay never asks; a caller that does gets kUnsupported).
#pragma once
#include <set>
#include <string>
#include <vector>

#include "core/proposer.h"

namespace dflash {

class PluginProposerBase : public DraftProposer {
 public:
  PluginProposerBase(const DrafterConfig& config, const HeadSettings& settings) : config_(config), settings_(settings) {}

  const DrafterConfig& config() const override { return config_; }
  const HeadSettings& settings() const override { return settings_; }
  void add_sequence(int seq) override { active_.insert(seq); }
  std::vector<int> sequences() const override { return {active_.begin(), active_.end()}; }
  SequenceView sequence_view(int seq) const override;
  std::vector<int64_t> window_slots(int seq) const override;
  PoolView pool_view() const override;

 protected:
  DrafterConfig config_;
  HeadSettings settings_;
  std::set<int> active_;
};

}  // namespace dflash
