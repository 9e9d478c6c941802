// One checking macro for every CUDA runtime, cuBLAS and cuBLASLt call and for kernel launches, and
// one exception path: a failure becomes a HarnessError naming the call, the file and the line
// (kUnsupported when the device is out of memory or missing, kInternal otherwise).
//
//   DFLASH_CUDA_CHECK(cudaMemcpyAsync(...));
//   my_kernel<<<grid, block, 0, stream>>>(...);
//   DFLASH_CUDA_CHECK_LAUNCH("my_kernel");
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "testing/fault_points.h"  // DFLASH_INJECTED_FAILURE: nothing unless -DDFLASH_FAULT_POINTS=ON

namespace dflash {

[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line);

[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line);

namespace cuda_check_detail {
inline void check(cudaError_t status, const char* call, const char* file, int line) {
  if (status != cudaSuccess) throw_cuda_error(status, call, file, line);
}
inline void check(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status != CUBLAS_STATUS_SUCCESS) throw_cublas_error(status, call, file, line);
}
}  // namespace cuda_check_detail

}  // namespace dflash

#define DFLASH_CUDA_CHECK(call) ::dflash::cuda_check_detail::check((call), #call, __FILE__, __LINE__)
// After every kernel launch: launch-configuration errors surface here, with the kernel's name.
#define DFLASH_CUDA_CHECK_LAUNCH(kernel_name)                                                                   \
  ::dflash::cuda_check_detail::check(                                                                           \
      DFLASH_INJECTED_FAILURE(kLaunch) ? cudaErrorLaunchFailure : cudaGetLastError(),                           \
      "launch of " kernel_name, __FILE__, __LINE__)
