// Thread-block-cluster building blocks (sm_90): mbarriers, bulk copies into this CTA's or the peer
// CTA's shared memory, and cluster barriers. Used by the deep-pair GEMM (gemm_mma.cu), where two
// CTAs of a cluster fetch each activation tile from L2 once between them.
//
// An mbarrier phase completes when its pending arrivals reach zero and its transaction count is
// back to zero; a bulk copy that names the barrier counts its bytes down when they have landed, and
// may land before the receiving thread has announced them with arrive_expect_tx (the count dips
// below zero and the phase still waits for the arrival). Waits give up after kWaitTimeoutNs and
// trap (a CUDA error) instead of hanging the device.
#pragma once
#include <cstdint>
#include <cstdio>

namespace dflash {
namespace cluster_copy {

constexpr uint64_t kWaitTimeoutNs = 2000000000ull;  // 2 s

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// The address of the same shared-memory location in CTA `rank` of the cluster.
__device__ __forceinline__ uint32_t peer_address(uint32_t local, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(rank));
  return remote;
}
__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}

__device__ __forceinline__ void barrier_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_address(bar)), "r"(arrivals) : "memory");
}
// Makes the initialized barriers visible to the cluster (before the first cluster_sync).
__device__ __forceinline__ void barrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival on this CTA's barrier, announcing `bytes` still to land.
__device__ __forceinline__ void arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(shared_address(bar)), "r"(bytes)
               : "memory");
}
// One arrival on the barrier at the same offset in CTA `rank`, releasing this thread's earlier
// shared-memory reads and writes to it.
__device__ __forceinline__ void arrive_on_peer(uint64_t* bar, uint32_t rank) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(
                   peer_address(shared_address(bar), rank))
               : "memory");
}
// An arrival on this CTA's barrier once every cp.async this thread issued so far has landed (the
// barrier's count includes it: .noinc).
__device__ __forceinline__ void cp_async_arrive_noinc(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(shared_address(bar)) : "memory");
}
// 16 bytes to the same offset as `local` in CTA `rank`'s shared memory.
__device__ __forceinline__ void store_to_peer(const void* local, uint4 v, uint32_t rank) {
  asm volatile("st.shared::cluster.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(peer_address(shared_address(local), rank)),
               "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}
// Waits until the phase of parity `parity` of this CTA's barrier has completed.
__device__ __forceinline__ void wait_phase(uint64_t* bar, uint32_t parity) {
  const uint32_t address = shared_address(bar);
  uint32_t done = 0;
  uint64_t start = 0;
  while (true) {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(address), "r"(parity)
        : "memory");
    if (done) return;
    if (start == 0) {
      start = global_ns();
    } else if (global_ns() - start > kWaitTimeoutNs) {
      printf("dflash cluster_copy: block (%d, %d) waited over 2 s for an mbarrier phase (parity %u)\n",
             static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y), parity);
      __trap();
    }
  }
}

// `bytes` (a multiple of 16, 16-byte aligned ends) from global memory into this CTA's shared
// memory; they count down `bar`'s transactions when they land.
__device__ __forceinline__ void bulk_global_to_local(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          shared_address(dst)),
      "l"(src), "r"(bytes), "r"(shared_address(bar))
      : "memory");
}
// `bytes` of this CTA's shared memory at `src` to the same offset in CTA `rank`, counting down
// the barrier at `bar`'s offset there.
__device__ __forceinline__ void bulk_local_to_peer(const void* src, uint32_t bytes, uint64_t* bar, uint32_t rank) {
  const uint32_t local = shared_address(src);
  asm volatile(
      "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          peer_address(local, rank)),
      "r"(local), "r"(bytes), "r"(peer_address(shared_address(bar), rank))
      : "memory");
}
// Orders this thread's earlier generic-proxy shared-memory accesses before later bulk copies.
__device__ __forceinline__ void fence_before_bulk() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Every thread of every CTA of the cluster.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

}  // namespace cluster_copy
}  // namespace dflash
