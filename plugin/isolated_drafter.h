// A plugin's drafter in a child process (`--isolate`, the default for plugins): the harness forks,
// the child opens the plugin and runs a PluginDrafter, and every call crosses a Channel. A child
// that dies (a signal, an exit) or does not answer within the timeout becomes a DrafterFault
// (core/error.h) naming the signal and the call: that fixture fails, the run goes on.
//
// The child is a fork of the harness: it inherits the weights (the tensor views point into its copy)
// and must not meet a CUDA context the parent made, so a run that isolates a CUDA plugin does not
// also run the CUDA drafter in the harness process.
#pragma once
#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "core/proposer.h"
#include "plugin/channel.h"
#include "plugin/create_args.h"
#include "plugin/plugin_proposer_base.h"

namespace dflash {

class IsolatedDrafter : public PluginProposerBase {
 public:
  // Forks and waits (at most timeout_s) for the child's create(); what the child's create or open
  // threw is rethrown here with its kind.
  IsolatedDrafter(const std::string& plugin_path, const DrafterConfig& config,
                  std::shared_ptr<const DrafterWeights> weights, const HeadSettings& settings,
                  const std::string& drafter_dir, const std::string& target_path, const PluginOptions& options,
                  double timeout_s);
  ~IsolatedDrafter() override;

  std::string name() const override { return name_; }
  void release_sequence(int seq) override;
  void set_block_g(int g) override;
  int block_g() const override { return clamp_block_width(block_g_, settings_.gamma); }
  std::vector<ProposeOutput> propose(const std::vector<ProposeInput>& batch, bool want_taps) override;

  std::optional<KvRows> read_kv_at(int layer, int seq, const std::vector<int64_t>& positions) const override;

  Introspection introspection() const override { return introspection_; }
  bool bf16_attention_partials() const override { return bf16_attention_partials_; }
  std::vector<std::pair<std::string, std::string>> describe() const override { return describe_; }

 private:
  // Sends one request and returns the answer; a dead or silent child throws a DrafterFault naming
  // `during`, an error the child reported is rethrown with its kind.
  std::string call(uint32_t op, const std::string& payload, const std::string& during) const;
  [[noreturn]] void child_died(const std::string& during) const;

  std::string name_ = "plugin";
  int timeout_ms_;
  mutable std::unique_ptr<Channel> channel_;
  mutable pid_t child_ = -1;  // -1 once reaped
  mutable bool dead_ = false;
  int block_g_ = 2;
  Introspection introspection_;
  bool bf16_attention_partials_ = false;
  std::vector<std::pair<std::string, std::string>> describe_;
};

// Opens the plugin in a child process and checks its table (PluginLibrary::open): the same errors,
// without the plugin's code ever running in the harness process.
void check_plugin_isolated(const std::string& plugin_path, double timeout_s);

}  // namespace dflash
