// The ceiling the benchmarks compare with: device-to-device copy bandwidth, measured in the same
// run on the same device.
#pragma once
#include <cstddef>

namespace dflash {

// Bytes read + written per second by cudaMemcpyAsync between two device buffers of `bytes` each
// (allocated here), median of `repeats` copies after 3 untimed ones, on the current device.
double measure_copy_bandwidth(size_t bytes, int repeats = 10);

}  // namespace dflash
