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

namespace dflash {

[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line);

// Test-only fault injection: the n-th device allocation (counted from the last set_cuda_fault, or
// from the start of the process) reports cudaErrorMemoryAllocation without allocating, or the
// n-th kernel launch reports cudaErrorLaunchFailure (launched through launch.cuh: not launched).
// Set by set_cuda_fault or, for whole programs, DFLASH_CUDA_FAULT=alloc:N|launch:N. Off otherwise;
// tests/gpu/fault_gpu_test.cc and ci/gpu-gate.sh use it to check the errors that follow.
enum class CudaFaultSite { kAlloc, kLaunch };
void set_cuda_fault(CudaFaultSite site, long long nth);  // nth 0: off
void clear_cuda_fault();
bool cuda_fault_due(CudaFaultSite site);  // counts one event at `site`; true for the chosen one
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
      ::dflash::cuda_fault_due(::dflash::CudaFaultSite::kLaunch) ? cudaErrorLaunchFailure : cudaGetLastError(), \
      "launch of " kernel_name, __FILE__, __LINE__)
