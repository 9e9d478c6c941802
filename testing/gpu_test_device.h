// Which GPU a test process runs on when CTest's resource allocation assigns one (ctest
// --resource-spec-file with RESOURCE_GROUPS "gpus:1"): CTEST_RESOURCE_GROUP_0_GPUS holds
// "id:<n>,slots:1". The process then sees only that device, as device 0, through
// CUDA_VISIBLE_DEVICES; an id indexes an existing CUDA_VISIBLE_DEVICES list when one is set.
#pragma once
#include <string>

namespace dflash {

// The CUDA_VISIBLE_DEVICES value for the allocation `allocation` ("id:3,slots:1") given the current
// value `visible` (empty when unset): "3", or the third entry of `visible`. Returns false with `error`
// set for a malformed allocation or an id past the visible list.
bool visible_device_for(const std::string& allocation, const std::string& visible, std::string* device,
                        std::string* error);

// Applies CTEST_RESOURCE_GROUP_0_GPUS to CUDA_VISIBLE_DEVICES (before any CUDA call). Without an
// allocation nothing changes. Returns false with `error` set when the allocation is malformed.
bool apply_ctest_gpu_allocation(std::string* error);

}  // namespace dflash
