// A plugin's drafter in this process: the DraftProposer the replay drives, over the plugin's C table
// (include/dflash/drafter_plugin.h). The isolated form (plugin/isolated_drafter.h) runs one of these
// in a child process.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/proposer.h"
#include "plugin/create_args.h"
#include "plugin/plugin_library.h"
#include "plugin/plugin_proposer_base.h"

namespace dflash {

class PluginDrafter : public PluginProposerBase {
 public:
  // `settings` resolved. A create() that fails throws with the plugin's message verbatim: its
  // status's kind (bad input, unsupported), or a DrafterFault for an internal failure.
  PluginDrafter(std::shared_ptr<const PluginLibrary> library, const DrafterConfig& config,
                std::shared_ptr<const DrafterWeights> weights, const HeadSettings& settings,
                const std::string& drafter_dir, const std::string& target_path, const PluginOptions& options);
  ~PluginDrafter() override;

  std::string name() const override { return name_; }
  void release_sequence(int seq) override;
  void set_block_g(int g) override { block_g_ = clamp_block_width(g, settings_.gamma); }
  int block_g() const override { return block_g_; }
  std::vector<ProposeOutput> propose(const std::vector<ProposeInput>& batch, bool want_taps) override;

  std::optional<KvRows> read_kv_at(int layer, int seq, const std::vector<int64_t>& positions) const override;

  Introspection introspection() const override;
  std::vector<std::pair<std::string, std::string>> describe() const override;
  bool bf16_attention_partials() const override;

 private:
  // Throws for a status that is not OK: `during` names the call ("propose of sequences [0, 2]").
  void check(int status, const char* message, const std::string& during) const;
  Tensor read_tap(int seq, const std::string& stage, bool* given);

  std::shared_ptr<const PluginLibrary> library_;
  std::unique_ptr<PluginCreateArgs> args_;
  dflash_drafter* drafter_ = nullptr;
  std::string name_;
  int block_g_ = 2;
  std::vector<std::string> stages_not_given_;
};

// "[0, 2]"
std::string sequence_list(const std::vector<ProposeInput>& batch);

}  // namespace dflash
