#include "bench/copy_bandwidth.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

#include "cuda/runtime/cuda_check.h"
#include "cuda/runtime/device_buffer.h"

namespace dflash {

double measure_copy_bandwidth(size_t bytes, int repeats) {
  DeviceBuffer<uint8_t> a(bytes), b(bytes);
  DFLASH_CUDA_CHECK(cudaMemset(a.get(), 1, bytes));
  cudaEvent_t start, stop;
  DFLASH_CUDA_CHECK(cudaEventCreate(&start));
  DFLASH_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<float> ms;
  for (int i = 0; i < repeats + 3; ++i) {
    DFLASH_CUDA_CHECK(cudaEventRecord(start));
    DFLASH_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice));
    DFLASH_CUDA_CHECK(cudaEventRecord(stop));
    DFLASH_CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    DFLASH_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    if (i >= 3) ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return 2.0 * static_cast<double>(bytes) / (ms[ms.size() / 2] * 1e-3);
}

}  // namespace dflash
