// A drafter plugin's shared library, opened and its ABI table checked (include/dflash/drafter_plugin.h).
#pragma once
#include <memory>
#include <string>

#include "dflash/drafter_plugin.h"

namespace dflash {

class PluginLibrary {
 public:
  // dlopen + dflash_drafter_get_api(DFLASH_DRAFTER_ABI_VERSION). A table of version 1 or 2 is read (their
  // tables have one layout; version 1's head settings end before the tensor-parallel fields). Refused
  // as bad input (exit 2), naming the path: a library that does not load, a missing symbol, a NULL
  // table, a table of another ABI version (the versions named), a table of another size than the
  // header's, a missing required entry point, an optional one missing while its capability flag is
  // set, or a capability bit its version does not define.
  static std::shared_ptr<const PluginLibrary> open(const std::string& path);
  ~PluginLibrary();
  PluginLibrary(const PluginLibrary&) = delete;
  PluginLibrary& operator=(const PluginLibrary&) = delete;

  const dflash_drafter_api& api() const { return *api_; }
  const std::string& path() const { return path_; }
  bool has(uint64_t capability) const { return (api_->capabilities & capability) != 0; }
  uint32_t abi_version() const { return api_->abi_version; }
  // "plugin:<the table's name>"
  std::string name() const;

 private:
  PluginLibrary(std::string path, void* handle, const dflash_drafter_api* api)
      : path_(std::move(path)), handle_(handle), api_(api) {}
  std::string path_;
  void* handle_ = nullptr;
  const dflash_drafter_api* api_ = nullptr;
};

}  // namespace dflash
