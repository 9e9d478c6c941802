// Device side of the planted mutations (testing/fault_points.h): every .cu file that includes this holds
// its own __device__ copy of the active mutation, set at drafter construction by the setter its
// DFLASH_DEVICE_MUTATION_SETTER defines. Without -DDFLASH_MUTATIONS=ON every macro is empty.
#pragma once
#include "testing/fault_points.h"

#ifdef DFLASH_FAULT_POINTS
#include <cuda_runtime_api.h>

#include "cuda/runtime/cuda_check.h"

namespace dflash {
namespace {
__device__ int g_device_mutation = 0;
}  // namespace
}  // namespace dflash

#define DFLASH_DEVICE_MUTATE(id, ...)                                                 \
  do {                                                                                \
    if (::dflash::g_device_mutation == static_cast<int>(::dflash::Mutation::id)) {    \
      __VA_ARGS__;                                                                    \
    }                                                                                 \
  } while (0)
#define DFLASH_DEVICE_MUTATION_SETTER(name)                                          \
  void set_device_mutation_##name(Mutation mutation) {                               \
    const int value = static_cast<int>(mutation);                                    \
    DFLASH_CUDA_CHECK(cudaMemcpyToSymbol(g_device_mutation, &value, sizeof value));  \
  }
#else
#define DFLASH_DEVICE_MUTATE(id, ...) \
  do {                                \
  } while (0)
#define DFLASH_DEVICE_MUTATION_SETTER(name)
#endif
