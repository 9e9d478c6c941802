// The other side of the ABI, for drafters written against this harness's DraftProposer: one call
// turns a factory into a plugin's dflash_drafter_api table. The example plugin (examples/plugin/) and
// the CUDA drafter's plugin (cuda/plugin/) are built on it; an engine's own drafter implements
// include/dflash/drafter_plugin.h directly (docs/plugin.md).
#pragma once
#include <functional>
#include <memory>

#include "core/proposer.h"
#include "core/weights.h"
#include "dflash/drafter_plugin.h"
#include "plugin/create_args.h"

namespace dflash {

// Makes the drafter from what create() was given (config from config_json, weights from the tensor
// views, the head settings, the plugin options); throws HarnessErrors, which become statuses.
using ProposerFactory = std::function<std::unique_ptr<DraftProposer>(
    const DrafterConfig&, std::shared_ptr<const DrafterWeights>, const HeadSettings&, const PluginOptions&)>;

// The table, in static storage, of a plugin named `name` with `capabilities` (any of taps, K/V
// read-back, describe and path: a DraftProposer serves them all). One factory per library.
const dflash_drafter_api* export_proposer(const char* name, uint64_t capabilities, ProposerFactory factory);

// create()'s inputs read back: the config of config_json checked against the struct's fields, the
// weights from the views by name (F32 drafter tensors, the head as F32 or NVFP4).
DrafterConfig config_from_plugin_args(const dflash_create_args& args);
std::shared_ptr<const DrafterWeights> weights_from_plugin_args(const dflash_create_args& args, const DrafterConfig& config);
HeadSettings head_from_plugin_args(const dflash_create_args& args);

}  // namespace dflash
