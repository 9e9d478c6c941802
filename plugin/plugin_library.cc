#include "plugin/plugin_library.h"

#include <dlfcn.h>

#include "core/error.h"

namespace dflash {

std::shared_ptr<const PluginLibrary> PluginLibrary::open(const std::string& path) {
  const std::string where = "plugin " + path + ": ";
  // RTLD_LOCAL: two plugins (or a plugin and the harness) may define the same symbols.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    throw bad_input(where + "cannot be loaded: " + (why ? why : "unknown dlopen error"));
  }
  auto close = [&] { dlclose(handle); };
  void* symbol = dlsym(handle, "dflash_drafter_get_api");
  if (symbol == nullptr) {
    close();
    throw bad_input(where + "exports no dflash_drafter_get_api (the harness speaks drafter plugin ABI version " +
                    std::to_string(DFLASH_DRAFTER_ABI_VERSION) + ", docs/plugin.md)");
  }
  const auto get_api = reinterpret_cast<dflash_drafter_get_api_fn>(symbol);
  const dflash_drafter_api* api = get_api(DFLASH_DRAFTER_ABI_VERSION);
  std::string problem;
  if (api == nullptr) {
    problem = "dflash_drafter_get_api(" + std::to_string(DFLASH_DRAFTER_ABI_VERSION) + ") returned NULL";
  } else if (api->abi_version != 1 && api->abi_version != DFLASH_DRAFTER_ABI_VERSION) {
    problem = "implements drafter plugin ABI version " + std::to_string(api->abi_version) +
              ", the harness reads versions 1 and " + std::to_string(DFLASH_DRAFTER_ABI_VERSION);
  } else if (api->struct_size != sizeof(dflash_drafter_api)) {
    problem = "its ABI version " + std::to_string(api->abi_version) + " table is " + std::to_string(api->struct_size) +
              " bytes, version " + std::to_string(DFLASH_DRAFTER_ABI_VERSION) + "'s is " +
              std::to_string(sizeof(dflash_drafter_api)) + " (built against another header?)";
  } else if (!api->create || !api->propose || !api->release || !api->destroy) {
    problem = "its table lacks a required entry point (create, propose, release, destroy)";
  } else if (((api->capabilities & DFLASH_CAP_TAPS) && !api->read_tap) ||
             ((api->capabilities & DFLASH_CAP_KV_READ) && !api->read_kv) ||
             ((api->capabilities & DFLASH_CAP_DESCRIBE) && !api->describe)) {
    problem = "announces a capability whose entry point is NULL (read_tap, read_kv or describe)";
  } else if (api->capabilities & ~(DFLASH_CAP_TAPS | DFLASH_CAP_KV_READ | DFLASH_CAP_DESCRIBE | DFLASH_CAP_PATH |
                                   (api->abi_version >= 2 ? DFLASH_CAP_TENSOR_PARALLEL | DFLASH_CAP_BF16_ATTENTION_PARTIALS
                                                          : 0))) {
    problem = "announces capability bits ABI version " + std::to_string(api->abi_version) + " does not define";
  }
  if (!problem.empty()) {
    close();
    throw bad_input(where + problem);
  }
  return std::shared_ptr<const PluginLibrary>(new PluginLibrary(path, handle, api));
}

PluginLibrary::~PluginLibrary() {
  if (handle_ != nullptr) dlclose(handle_);
}

std::string PluginLibrary::name() const {
  return std::string("plugin:") + (api_->name != nullptr && api_->name[0] != '\0' ? api_->name : "unnamed");
}

}  // namespace dflash
