// Kernel launches with optional programmatic dependent launch (PDL, sm_90).
//
// With PDL on, a kernel may be scheduled while the kernel before it on the stream is still
// running; it must call pdl_wait() before it reads anything an earlier kernel of the PDL chain
// wrote, and before it writes anything an earlier kernel may still read. Work that depends on
// neither runs before the wait and so overlaps the previous kernel's tail: a GEMM streaming its
// weights into shared memory, the attention copying the cached window's K/V (everything enqueued
// before the chain's first kernel, which is launched without PDL, has finished when it starts).
// pdl_wait() returns when every earlier kernel of the stream has finished and its writes are
// visible (transitively: the previous kernel itself waited for its own predecessor before it could
// finish), and at once when the launch carried no PDL attribute, so kernels call it always and the
// host decides per launch. pdl_launch_dependents() lets the next kernel be scheduled early; it
// changes nothing about what that kernel may read (its pdl_wait still waits for this one to finish).
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "cuda/runtime/cuda_check.h"

namespace dflash {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Where a launch is written: a failed launch names the kernel and its caller's file and line
// (DFLASH_KERNEL_SITE("name") at the call site), not this header's.
struct KernelSite {
  const char* what;
  const char* file;
  int line;
};
#define DFLASH_KERNEL_SITE(name) (::dflash::KernelSite{"launch of " name, __FILE__, __LINE__})

namespace launch_detail {
// kernel<<<grid, block, smem, stream>>>(args...) with the `count` launch attributes given; the
// launch is checked and a failure names the site.
template <typename... Params, typename... Args>
void launch_with_attributes(const KernelSite& site, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                            cudaStream_t stream, cudaLaunchAttribute* attributes, unsigned count, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = count;
  const cudaError_t status = DFLASH_INJECTED_FAILURE(kLaunch)
                                 ? cudaErrorLaunchFailure
                                 : cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
  if (status != cudaSuccess) throw_cuda_error(status, site.what, site.file, site.line);
  const cudaError_t late = cudaGetLastError();
  if (late != cudaSuccess) throw_cuda_error(late, site.what, site.file, site.line);
}
}  // namespace launch_detail

// kernel<<<grid, block, smem, stream>>>(args...), with the PDL attribute when `pdl` is set; the
// launch is checked and a failure names the site.
template <typename... Params, typename... Args>
void launch_kernel(const KernelSite& site, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                   bool pdl, Args&&... args) {
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  launch_detail::launch_with_attributes(site, kernel, grid, block, smem, stream, attribute, pdl ? 1u : 0u,
                                        std::forward<Args>(args)...);
}

}  // namespace dflash
