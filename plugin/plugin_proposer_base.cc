#include "plugin/plugin_proposer_base.h"

#include "core/error.h"

namespace dflash {

SequenceView PluginProposerBase::sequence_view(int seq) const {
  throw unsupported(name() + ": sequence_view(" + std::to_string(seq) + "): the plugin ABI has no page tables");
}

std::vector<int64_t> PluginProposerBase::window_slots(int seq) const {
  throw unsupported(name() + ": window_slots(" + std::to_string(seq) + "): the plugin ABI has no page tables");
}

PoolView PluginProposerBase::pool_view() const { throw unsupported(name() + ": pool_view(): the plugin ABI has no page tables"); }

}  // namespace dflash
