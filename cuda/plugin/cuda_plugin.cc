// The CUDA drafter as a drafter plugin (libdflash_cuda_plugin.so): the proof that the ABI carries a
// real GPU drafter. The GPU gate replays every bundled fixture through it and through the in-process
// backend and requires the same verdicts (ci/gpu-gate.sh plugin_replays). Options:
//   warmup=N                eager passes before a shape's graph is captured (default 1, as replay's)
//   poison_freed_pages=0|1  the debug fill of freed pages the in-process backend uses (default 1)
#include "core/error.h"
#include "core/parse_number.h"
#include "cuda/drafter/cuda_drafter.h"
#include "plugin/export/proposer_export.h"

namespace dflash {
namespace {

std::unique_ptr<DraftProposer> make_cuda_plugin_drafter(const DrafterConfig& config,
                                                        std::shared_ptr<const DrafterWeights> weights,
                                                        const HeadSettings& head, const PluginOptions& options) {
  CudaOptions cuda = CudaOptions{}.with_environment();
  cuda.warmup = 1;
  HeadSettings settings = head;
  settings.poison_freed_pages = true;
  for (const auto& [key, value] : options) {
    int n = -1;
    const bool integer = parse_whole_int(value, &n);
    if (key == "warmup" && integer && n >= 0 && n <= 1000) {
      cuda.warmup = n;
    } else if (key == "poison_freed_pages" && integer && (n == 0 || n == 1)) {
      settings.poison_freed_pages = n == 1;
    } else {
      throw bad_input("plugin option " + key + "=" + value + ": the CUDA plugin takes warmup=0..1000 and poison_freed_pages=0|1");
    }
  }
  std::string why;
  if (!cuda_device_available(&why)) throw unsupported("no CUDA device can run the CUDA drafter here: " + why);
  return make_cuda_drafter(config, std::move(weights), settings, cuda);
}

}  // namespace
}  // namespace dflash

extern "C" __attribute__((visibility("default"))) const dflash_drafter_api* dflash_drafter_get_api(uint32_t abi_version) {
  (void)abi_version;
  static const dflash_drafter_api* api =
      dflash::export_proposer("cuda", DFLASH_CAP_TAPS | DFLASH_CAP_KV_READ | DFLASH_CAP_DESCRIBE | DFLASH_CAP_PATH,
                              dflash::make_cuda_plugin_drafter);
  return api;
}
