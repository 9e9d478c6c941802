// The cp.async group steps every kernel with an asynchronous shared-memory pipeline shares (the
// GEMM tiles, the attention tiles): close the copies issued so far into a group, and wait for
// groups. A wait orders nothing for the compiler: each caller's __syncthreads (or its reads'
// own asm) comes after it.
#pragma once

namespace dflash {

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Returns once at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

}  // namespace dflash
