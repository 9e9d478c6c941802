// What the harness hands a plugin's create(): the config, the resolved head settings, the checkpoint
// as read-only tensor views, the plugin options. One object owns every string and array the C
// structs point at, so it lives as long as the drafter (the ABI's views stay valid until destroy).
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"
#include "core/proposer.h"
#include "core/weights.h"
#include "dflash/drafter_plugin.h"

namespace dflash {

using PluginOptions = std::vector<std::pair<std::string, std::string>>;

struct PluginCreateArgs {
  dflash_create_args args{};  // points into the members below

  std::shared_ptr<const DrafterWeights> weights;  // the views' data
  std::string config_json, drafter_dir, target_path;
  std::vector<int32_t> target_layer_ids;
  dflash_drafter_config config{};
  dflash_head_settings head{};
  std::vector<std::string> view_names;
  std::vector<float> scalars;  // the NVFP4 head's scalar scales
  std::vector<dflash_tensor_view> views;
  PluginOptions option_strings;
  std::vector<dflash_option> options;

  PluginCreateArgs() = default;
  PluginCreateArgs(const PluginCreateArgs&) = delete;
  PluginCreateArgs& operator=(const PluginCreateArgs&) = delete;
};

// `settings` resolved; `drafter_dir` holds config.json (its text becomes config_json). For a plugin of
// ABI version 1 (`abi_version`) the head settings are version 1's: struct_size
// DFLASH_HEAD_SETTINGS_V1_SIZE, no tensor-parallel fields read.
std::unique_ptr<PluginCreateArgs> make_create_args(const DrafterConfig& config,
                                                   std::shared_ptr<const DrafterWeights> weights,
                                                   const HeadSettings& settings, const std::string& drafter_dir,
                                                   const std::string& target_path, const PluginOptions& options,
                                                   uint32_t abi_version);

dflash_precision to_plugin_precision(Precision precision);
bool from_plugin_precision(int32_t value, Precision* out);

// dflash_path <-> ForwardPath::mode ("cpu", "eager", "graph-capture", "graph-replay"; anything else
// is DFLASH_PATH_UNREPORTED, "unreported").
const char* path_mode_name(int32_t path);
int32_t path_code(const std::string& mode);

}  // namespace dflash
