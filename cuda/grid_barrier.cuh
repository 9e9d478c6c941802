// A grid-wide barrier for persistent kernels whose CTAs are all resident (the layer chain; the
// streaming chain probe in bench/). The counter only grows: arrival s of a launch waits until it
// reaches `target` = (the launch's base) + s · ctas, so one counter serves every launch without a
// reset (see launch_base). A CTA that waits longer than `timeout_ns` prints what it saw and traps
// (a CUDA error, not a hang): some CTA was not resident.
//
// Visibility: __syncthreads, then thread 0 fences (gpu scope), arrives and spins with acquire loads,
// fences, __syncthreads; data written before the barrier by any CTA is then visible to reads
// through L2 (ld.global.cg; L1 is not coherent across SMs within a kernel).
#pragma once
#include <cstdint>
#include <cstdio>

namespace dflash {

__device__ __forceinline__ unsigned long long globaltimer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ unsigned long long load_acquire_gpu(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// The counter's value at this launch's start, for a launch of `arrivals_per_launch` arrivals
// (barriers × CTAs): no CTA of this launch can have passed its first barrier yet, so the count is
// below the launch boundary + ctas, and rounding down finds the boundary. Thread 0 only.
__device__ __forceinline__ unsigned long long launch_base(const unsigned long long* counter,
                                                          unsigned long long arrivals_per_launch) {
  return arrivals_per_launch > 0 ? load_acquire_gpu(counter) / arrivals_per_launch * arrivals_per_launch : 0;
}

// Every CTA has arrived `target` times in all; `step` only names the barrier in the timeout message.
__device__ __forceinline__ void grid_barrier(unsigned long long* counter, unsigned long long target, int step,
                                             unsigned long long timeout_ns) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(counter, 1ull);
    const unsigned long long start = globaltimer_ns();
    while (load_acquire_gpu(counter) < target) {
      if (globaltimer_ns() - start > timeout_ns) {
        printf("grid barrier: CTA %d waited over %llu ns before step %d (%llu of %llu arrivals): are all CTAs "
               "resident?\n",
               static_cast<int>(blockIdx.x), timeout_ns, step, load_acquire_gpu(counter), target);
        __trap();
      }
    }
    __threadfence();
  }
  __syncthreads();
}

}  // namespace dflash
