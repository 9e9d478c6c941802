// Shared pieces of the GPU tests: the skip when no device can run them, exact float comparison,
// and the same-precision bound of compare/'s tolerance model for logits.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "compare/tolerance.h"
#include "core/dtype.h"
#include "core/stages.h"
#include "core/tensor.h"
#include "cuda/drafter/cuda_drafter.h"
#include "cuda/runtime/device_buffer.h"

// Every GPU test starts with this: no device means a skip that says why, never a silent pass.
#define DFLASH_REQUIRE_GPU()                                           \
  do {                                                                 \
    std::string dflash_why;                                            \
    if (!::dflash::cuda_device_available(&dflash_why)) {               \
      GTEST_SKIP() << "no usable CUDA device: " << dflash_why;         \
    }                                                                  \
  } while (0)

namespace dflash::gpu_test {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// The logits of two drafters that round at the same bf16 boundaries (a CUDA lever against the
// default, the CUDA drafter against the emulating reference) at `precision`: the same-precision
// pair's bound for windows up to `max_window` context positions at block width `width`.
inline StageBound same_precision_logits_bound(const DrafterConfig& config, Precision precision, int64_t max_window,
                                              int width) {
  const TolerancePair pair = cross_pair(precision, "expected", precision, "actual");
  return stage_bound(pair, stage_paths(config, max_window, width).at("logits"), config.vocab_size);
}

// A host vector on the device, and a device buffer back on the host.
template <typename T>
DeviceBuffer<T> to_device(const std::vector<T>& host) {
  DeviceBuffer<T> d(host.size());
  DFLASH_CUDA_CHECK(cudaMemcpy(d.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}
template <typename T>
std::vector<T> to_host(const DeviceBuffer<T>& d) {
  std::vector<T> host(d.size());
  DFLASH_CUDA_CHECK(cudaMemcpy(host.data(), d.get(), d.size() * sizeof(T), cudaMemcpyDeviceToHost));
  return host;
}

// The rows of `a` as bf16 bits on the device, `ld` elements apart (the padding zero).
inline DeviceBuffer<uint16_t> upload_activations(const Tensor& a, int64_t ld) {
  std::vector<uint16_t> bits(static_cast<size_t>(a.rows() * ld), 0);
  for (int64_t r = 0; r < a.rows(); ++r)
    for (int64_t c = 0; c < a.cols(); ++c) bits[static_cast<size_t>(r * ld + c)] = float_to_bf16_bits(a.row(r)[c]);
  DeviceBuffer<uint16_t> d(bits.size());
  EXPECT_EQ(cudaSuccess, cudaMemcpy(d.get(), bits.data(), bits.size() * 2, cudaMemcpyHostToDevice));
  return d;
}

}  // namespace dflash::gpu_test
