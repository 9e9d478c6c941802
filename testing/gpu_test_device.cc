#include "testing/gpu_test_device.h"

#include <cstdlib>
#include <sstream>
#include <vector>

namespace dflash {

bool visible_device_for(const std::string& allocation, const std::string& visible, std::string* device,
                        std::string* error) {
  // "id:<n>,slots:<k>"
  const std::string prefix = "id:";
  const size_t comma = allocation.find(',');
  const std::string id = allocation.substr(0, comma);
  if (id.compare(0, prefix.size(), prefix) != 0 || id.size() == prefix.size() ||
      id.find_first_not_of("0123456789", prefix.size()) != std::string::npos) {
    *error = "CTEST_RESOURCE_GROUP_0_GPUS=" + allocation + ": expected id:<n>,slots:<k>";
    return false;
  }
  const std::string n = id.substr(prefix.size());
  if (visible.empty()) {
    *device = n;
    return true;
  }
  std::vector<std::string> entries;
  std::stringstream list(visible);
  for (std::string e; std::getline(list, e, ',');) entries.push_back(e);
  const size_t index = std::stoul(n.size() > 9 ? std::string("999999999") : n);
  if (index >= entries.size()) {
    *error = "CTEST_RESOURCE_GROUP_0_GPUS=" + allocation + ": no device " + n + " in CUDA_VISIBLE_DEVICES=" + visible;
    return false;
  }
  *device = entries[index];
  return true;
}

bool apply_ctest_gpu_allocation(std::string* error) {
  const char* allocation = std::getenv("CTEST_RESOURCE_GROUP_0_GPUS");
  if (allocation == nullptr || *allocation == '\0') return true;
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  std::string device;
  if (!visible_device_for(allocation, visible != nullptr ? visible : "", &device, error)) return false;
  setenv("CUDA_VISIBLE_DEVICES", device.c_str(), 1);
  return true;
}

}  // namespace dflash
