// A measurement for the design of a persistent forward (docs/benchmarks.md, "The streaming chain
// probe"): how fast can ONE persistent kernel run the 20 layer GEMMs of the Qwen3-8B-DFlash-b16
// geometry at m = 16 (o, gate|up, down, q|k|v of 5 layers; E4M3 weights) with a grid barrier
// after each GEMM and an empty barrier step where the forward has an RMSNorm, when
//  - every SM runs 16 warps (one CTA of 512 threads), each warp streaming its weight tiles through
//    its own cp.async ring across step boundaries (the weights depend on nothing);
//  - a unit of work is 64 output columns (half the activation re-reads of 32-column units) over a
//    part of K: a GEMM with few column blocks (o, down) has its K split over CTAs so that every
//    step keeps the SMs busy; the parts of a column block are added in part order by the unit that
//    arrives last (an arrival counter), then scaled and stored as bf16.
// Within a unit warp w of its group reduces k-tiles w, w + G, ...; the G warps' sums are added in a
// fixed order through shared memory. The order differs from the drafter's kernels (8 warps, K never
// split across CTAs), so this is a probe, not a kernel of the drafter: it checks its own outputs
// against a plain reference GEMM of each step's input, within the fp32 reordering bound, and exits
// 1 when any element is outside it.
//
// The same 20 GEMMs as separate launches of the drafter's own kernel (gemm(), deep pipeline, PDL,
// one CUDA graph: the forward's GEMM-only chain) run in the same call as the baseline.
//
// Compile-time switches (CMAKE_CUDA_FLAGS), measured on an H200 in docs/benchmarks.md:
//   PROBE_GROUPS=G      the 16 warps as G independent groups of 16 / G (1, 2 or 4; default 1)
// and, timing only (wrong outputs, not checked; the program says so):
//   PROBE_SKIP_REDUCE   no reduction, epilogue or barrier per unit: the stream and the mma alone
//   PROBE_SYNC_ONLY     only the group's barrier per unit
//   PROBE_NO_STORE      the shared-memory reduction, but no output or partial stores
//   PROBE_WARP_PARTIALS each warp's partial sums stored to global memory with an arrival, no sum
//   PROBE_SKIP_MMA      the weight tiles read but neither decoded nor multiplied
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <cuda_runtime_api.h>

#include "bench/copy_bandwidth.h"
#include "bench/median.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/fp8.h"
#include "cuda/cuda_check.h"
#include "cuda/device_buffer.h"
#include "cuda/gemm.h"
#include "cuda/gemm_tiles.cuh"
#include "cuda/grid_barrier.cuh"
#include "cuda/launch.cuh"

namespace dflash {
namespace {

using gemm_tiles::cp_async_16_stream;
using gemm_tiles::cp_async_commit;
using gemm_tiles::cp_async_wait;
using gemm_tiles::kKTile;
using gemm_tiles::load_activation_fragments;
using gemm_tiles::mma_k_tile;

constexpr int kRows = 16;                        // m: one block of 16 rows
constexpr int kWarps = 16;
constexpr int kThreads = kWarps * 32;
// The CTA's warps form kGroups groups, each computing its own units (a "virtual CTA" of
// kGroupWarps warps with its own named barrier), so that one group's reduction can overlap the
// other's streaming. 1 (all 16 warps on each unit) measured fastest.
#ifndef PROBE_GROUPS
#define PROBE_GROUPS 1
#endif
#if defined(PROBE_SKIP_MMA) || defined(PROBE_SKIP_REDUCE) || defined(PROBE_SYNC_ONLY) || defined(PROBE_WARP_PARTIALS) || \
    defined(PROBE_NO_STORE)
constexpr bool kTimingOnly = true;
#else
constexpr bool kTimingOnly = false;
#endif
constexpr int kGroups = PROBE_GROUPS;
static_assert(kGroups == 1 || kGroups == 2 || kGroups == 4, "PROBE_GROUPS: 1, 2 or 4 groups of warps");
constexpr int kGroupWarps = kWarps / kGroups;
constexpr int kGroupThreads = kGroupWarps * 32;
constexpr int kNT = 8;                           // n-tiles of 8: 64 columns per unit
constexpr int kUnitColumns = kNT * 8;
constexpr int kTileBytes = kUnitColumns * kKTile;  // one warp's k-tile of a unit: 64 rows × 64 codes
constexpr int kSlots = 3;                          // per warp: 2 tiles in flight while one is computed
constexpr size_t kRingBytes = static_cast<size_t>(kWarps) * kSlots * kTileBytes;
constexpr size_t kGroupRedFloats = static_cast<size_t>(kGroupWarps / 2) * kRows * kUnitColumns;
constexpr size_t kRedBytes = kGroups * kGroupRedFloats * sizeof(float);
constexpr size_t kSmemBytes = kRingBytes + kRedBytes + 16;
constexpr int kMaxSteps = 32;
constexpr unsigned long long kBarrierTimeoutNs = 2'000'000'000;  // a barrier takes microseconds

struct Step {
  const uint16_t* a;  // bf16 [16, lda]
  int64_t lda;
  const uint8_t* w;  // E4M3 [n, ldw]
  int64_t ldw;
  const float* scale;  // [n]
  uint16_t* out;       // bf16 [16, ldo]
  int64_t ldo;
  float* partials;     // [col_blocks][ksplit][16·64]
  unsigned* arrivals;  // [col_blocks]: grows by ksplit per launch
  int k_tiles, col_blocks, ksplit, part_tiles, units, rotation;
  int barrier_only;  // an empty step: stands for an RMSNorm step's barrier
};

struct Params {
  Step step[kMaxSteps];
  int steps, ctas, vctas;  // vctas = ctas · kGroups
  unsigned long long* barrier;
  unsigned long long* stamps;  // [steps + 1]: CTA 0's %globaltimer at each step's start, and the end
};

__device__ __forceinline__ int first_unit(const Step& s, int cta, int ctas) {
  const int u = (cta - s.rotation) % ctas;
  return u < 0 ? u + ctas : u;
}
// K-tiles [begin, end) of unit u; warp w's are begin + w, begin + w + 16, ...
__device__ __forceinline__ void unit_range(const Step& s, int u, int& cb, int& part, int& begin, int& end) {
  cb = u / s.ksplit;
  part = u - cb * s.ksplit;
  begin = part * s.part_tiles;
  end = min(s.k_tiles, begin + s.part_tiles);
}
__device__ __forceinline__ int group_warp_tiles(int tiles, int wg) {
  return wg < tiles ? (tiles - wg + kGroupWarps - 1) / kGroupWarps : 0;
}
// The group's barrier (named barrier 1 + group; barrier 0 is __syncthreads).
__device__ __forceinline__ void group_sync(int group) {
  if constexpr (kGroups == 1) {
    __syncthreads();
  } else {
    asm volatile("bar.sync %0, %1;" ::"r"(1 + group), "r"(kGroupThreads) : "memory");
  }
}

// One warp's weight stream over every GEMM step: the tiles in the order the warp computes them.
// `cta` is the warp's virtual CTA (group · ctas + cta), `warp` its warp within the group.
struct Ring {
  uint8_t* slots;
  int step, unit, left;  // the unit being copied; left: its tiles still to copy (0 at the end)
  const uint8_t* src;    // this lane's piece of the next tile's row lane/4
  int64_t ldw8;          // 8 rows
  int slot_in = 0, slot_out = 0;

  __device__ __forceinline__ void seek(const Params& p, int cta, int warp, int lane, bool next_unit) {
    while (step < p.steps) {
      const Step& s = p.step[step];
      if (!s.barrier_only) {
        if (next_unit) unit += p.vctas;
        next_unit = true;
        if (unit < s.units) {
          int cb, part, begin, end;
          unit_range(s, unit, cb, part, begin, end);
          left = group_warp_tiles(end - begin, warp);
          if (left > 0) {
            ldw8 = 8 * s.ldw;
            src = s.w + (static_cast<int64_t>(cb) * kUnitColumns + (lane >> 2)) * s.ldw +
                  static_cast<int64_t>(begin + warp) * kKTile + (lane & 3) * 16;
            return;
          }
          continue;
        }
      }
      next_unit = false;
      if (++step < p.steps) unit = first_unit(p.step[step], cta, p.vctas);
    }
    left = 0;
  }
  __device__ __forceinline__ void start(const Params& p, uint8_t* ring, int cta, int warp, int lane) {
    slots = ring;
    step = 0;
    unit = first_unit(p.step[0], cta, p.vctas);
    seek(p, cta, warp, lane, false);
  }
  __device__ __forceinline__ void issue(const Params& p, int cta, int warp, int lane) {
    if (left > 0) {
      uint8_t* dst = slots + slot_in * kTileBytes + lane * 16;
      const uint8_t* s = src;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        cp_async_16_stream(dst + i * 512, s, true);
        s += ldw8;
      }
      src += kGroupWarps * kKTile;
      if (++slot_in == kSlots) slot_in = 0;
      if (--left == 0) seek(p, cta, warp, lane, true);
    }
    cp_async_commit();
  }
  __device__ __forceinline__ const uint8_t* wait_next(const Params& p, int cta, int warp, int lane) {
    cp_async_wait<kSlots - 2>();
    __syncwarp();
    issue(p, cta, warp, lane);
    const uint8_t* tile = slots + slot_out * kTileBytes;
    if (++slot_out == kSlots) slot_out = 0;
    return tile;
  }
};

__device__ __forceinline__ void store_output(const Step& s, int cb, int r, int c, float v, float scale) {
  const int64_t col = static_cast<int64_t>(cb) * kUnitColumns + c;
  const __nv_bfloat16 b = __float2bfloat16_rn(v * scale);
  s.out[r * s.ldo + col] = *reinterpret_cast<const uint16_t*>(&b);
}

// PROBE_SKIP_MMA (timing only, wrong outputs): each tile's weights are read but neither decoded
// nor multiplied: the stream and the synchronization alone.
__device__ __forceinline__ void compute_tile(float (&acc)[kNT][4], const uint4 (&a)[2][2], const uint8_t* w, int g,
                                             int t) {
#ifdef PROBE_SKIP_MMA
  const uint4 x = *reinterpret_cast<const uint4*>(w + g * kKTile + 16 * t);
  acc[0][0] += __uint_as_float((x.x ^ x.y ^ x.z ^ x.w ^ a[0][0].x) & 0x3f800000u);
#else
  mma_k_tile<true, kNT>(acc, a, w, kKTile, g, t);
#endif
}

__global__ void __launch_bounds__(kThreads, 1) stream_chain_kernel(const __grid_constant__ Params p) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int cta = static_cast<int>(blockIdx.x);
  const int group = warp / kGroupWarps, wg = warp % kGroupWarps;    // wg: the warp within its group
  const int gtid = threadIdx.x % kGroupThreads;                      // the thread within its group
  const int vcta = group * p.ctas + cta;  // group 0 of every CTA first: a narrow step spreads over the SMs
  float* red = reinterpret_cast<float*>(smem + kRingBytes) + group * kGroupRedFloats;
  int* last_flag = reinterpret_cast<int*>(smem + kRingBytes + kRedBytes) + group;

  Ring ring;
  ring.start(p, smem + static_cast<size_t>(warp) * kSlots * kTileBytes, vcta, wg, lane);
  for (int i = 0; i < kSlots - 1; ++i) ring.issue(p, vcta, wg, lane);

  const unsigned long long per_launch = static_cast<unsigned long long>(p.steps - 1) * p.ctas;
  unsigned long long base = 0;
  if (threadIdx.x == 0) base = launch_base(p.barrier, per_launch);

  for (int si = 0; si < p.steps; ++si) {
    if (si > 0) grid_barrier(p.barrier, base + static_cast<unsigned long long>(si) * p.ctas, si, kBarrierTimeoutNs);
    if (cta == 0 && threadIdx.x == 0) p.stamps[si] = globaltimer_ns();
    const Step& s = p.step[si];
    if (s.barrier_only) continue;
    const uint16_t* rows[2];
    gemm_tiles::activation_rows(rows, s.a, s.lda, 0, kRows, g, t);
    for (int u = first_unit(s, vcta, p.vctas); u < s.units; u += p.vctas) {
      int cb, part, begin, end;
      unit_range(s, u, cb, part, begin, end);
      const int tiles = group_warp_tiles(end - begin, wg);
      // This thread's output column's scale (the same column for each of its outputs), loaded now:
      // with the weight stream saturating HBM, a load issued at the epilogue waits microseconds.
      const float scale = s.scale[static_cast<int64_t>(cb) * kUnitColumns + gtid % kUnitColumns];
      float acc[1][kNT][4];
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[0][nt][e] = 0.0f;
      uint4 a[2][2][2];
      if (tiles > 0) load_activation_fragments<true>(a[0], rows, begin + wg);
      for (int i = 0; i < tiles; i += 2) {
        if (i + 1 < tiles) load_activation_fragments<true>(a[1], rows, begin + wg + kGroupWarps * (i + 1));
        compute_tile(acc[0], a[0], ring.wait_next(p, vcta, wg, lane), g, t);
        if (i + 1 < tiles) {
          if (i + 2 < tiles) load_activation_fragments<true>(a[0], rows, begin + wg + kGroupWarps * (i + 2));
          compute_tile(acc[0], a[1], ring.wait_next(p, vcta, wg, lane), g, t);
        }
      }
#ifdef PROBE_SKIP_REDUCE
      // Timing only (wrong outputs): no reduction, no epilogue, no synchronization per unit.
      if (wg == 0 && lane == 0) store_output(s, cb, 0, 0, acc[0][0][0], scale);
      continue;
#endif
#ifdef PROBE_SYNC_ONLY
      // Timing only: the unit's group barrier alone (the lock step), no reduction.
      if (wg == 0 && lane == 0) store_output(s, cb, 0, 0, acc[0][0][0], scale);
      group_sync(group);
      continue;
#endif
#ifdef PROBE_WARP_PARTIALS
      // Timing only: what a reduction without any CTA barrier would write: each warp's partial
      // sums to global memory (coalesced, fragment order) and one arrival, no final sum.
      {
        float* mine = s.partials + ((static_cast<int64_t>(cb) * s.ksplit + part) * kWarps + warp) * (kRows * kUnitColumns);
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) __stcg(mine + (nt * 4 + e) * 32 + lane, acc[0][nt][e]);
        __syncwarp();
        if (lane == 0) {
          __threadfence();
          atomicAdd(s.arrivals + cb, 1u);
        }
        continue;
      }
#endif
      // The group's sums: warp w + G/2's added to warp w's, then the G/2 in warp order. Rows of 64
      // floats, the 8-column groups XOR-swizzled by row (float2 accesses without bank conflicts).
      constexpr int kHalf = kGroupWarps / 2;
      auto slot = [&](int w, int nt, int h) -> float2& {
        const int r = g + 8 * h, c = ((nt ^ (r & 7)) << 3) + 2 * t;
        return *reinterpret_cast<float2*>(red + (w * kRows + r) * kUnitColumns + c);
      };
      if (wg >= kHalf) {
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int h = 0; h < 2; ++h) slot(wg - kHalf, nt, h) = make_float2(acc[0][nt][2 * h], acc[0][nt][2 * h + 1]);
      }
      group_sync(group);
      if (wg < kHalf) {  // each thread reads and rewrites only its own elements: no barrier between
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            float2& x = slot(wg, nt, h);
            const float2 y = x;
            x = make_float2(__fadd_rn(acc[0][nt][2 * h], y.x), __fadd_rn(acc[0][nt][2 * h + 1], y.y));
          }
      }
      group_sync(group);
      constexpr int kPerThread = kRows * kUnitColumns / kGroupThreads;
      float v[kPerThread];
#pragma unroll
      for (int j = 0; j < kPerThread; ++j) {
        const int o = gtid + kGroupThreads * j, r = o / kUnitColumns, c = o % kUnitColumns;
        const int sc = (((c >> 3) ^ (r & 7)) << 3) + (c & 7);
        float x = red[r * kUnitColumns + sc];
#pragma unroll
        for (int w = 1; w < kHalf; ++w) x = __fadd_rn(x, red[(w * kRows + r) * kUnitColumns + sc]);
        v[j] = x;
      }
#ifdef PROBE_NO_STORE
      if (gtid == 0) store_output(s, cb, 0, 0, v[0], scale);
      group_sync(group);
      continue;
#endif
      if (s.ksplit == 1) {
#pragma unroll
        for (int j = 0; j < kPerThread; ++j) {
          const int o = gtid + kGroupThreads * j;
          store_output(s, cb, o / kUnitColumns, o % kUnitColumns, v[j], scale);
        }
      } else {
        float* mine = s.partials + (static_cast<int64_t>(cb) * s.ksplit + part) * (kRows * kUnitColumns);
#pragma unroll
        for (int j = 0; j < kPerThread; ++j) __stcg(mine + gtid + kGroupThreads * j, v[j]);
        // The group's stores, then one thread's fence and arrival (cumulative over the group's
        // writes through the barrier); the last arriver's thread fences before the group reads.
        group_sync(group);
        if (gtid == 0) {
          __threadfence();
          const unsigned old = atomicAdd(s.arrivals + cb, 1u);
          const bool last = (old + 1) % static_cast<unsigned>(s.ksplit) == 0;
          if (last) __threadfence();
          *last_flag = last;
        }
        group_sync(group);
        if (*last_flag) {
          const float* parts = s.partials + static_cast<int64_t>(cb) * s.ksplit * (kRows * kUnitColumns);
#pragma unroll
          for (int j = 0; j < kPerThread; ++j) {
            const int o = gtid + kGroupThreads * j;
            float x = __ldcg(parts + o);
            for (int q = 1; q < s.ksplit; ++q) x = __fadd_rn(x, __ldcg(parts + q * (kRows * kUnitColumns) + o));
            store_output(s, cb, o / kUnitColumns, o % kUnitColumns, x, scale);
          }
        }
      }
      group_sync(group);  // the reduction buffer and the flag are free for the next unit
    }
  }
  cp_async_wait<0>();
  if (cta == 0 && threadIdx.x == 0) p.stamps[p.steps] = globaltimer_ns();
}

// |x| of bf16 bits or E4M3 codes (the sign bit cleared): the plain GEMM of the magnitudes gives
// Σ|terms| for the reordering bound.
template <typename T>
__global__ void clear_sign_bits(const T* in, T* out, size_t count, T sign) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = static_cast<T>(in[i] & ~sign);
  }
}

__device__ uint32_t hash32(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}
// Random E4M3 codes, NaN codes (0x7f, 0xff) excluded.
__global__ void fill_codes(uint8_t* w, size_t count, uint64_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint8_t c = static_cast<uint8_t>(hash32(seed * 0x9e3779b97f4a7c15ull + i));
    if ((c & 0x7f) == 0x7f) c ^= 1;
    w[i] = c;
  }
}
__global__ void fill_bf16(uint16_t* x, size_t count, uint64_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float v = static_cast<float>(hash32(seed * 0x9e3779b97f4a7c15ull + i) % 2001) / 1000.0f - 1.0f;
    const __nv_bfloat16 b = __float2bfloat16_rn(v);
    x[i] = *reinterpret_cast<const uint16_t*>(&b);
  }
}

// A GEMM step's weights as the drafter's GEMMs take them.
DeviceMatrixView step_weights(const Step& s) {
  DeviceMatrixView w;
  w.format = WeightFormat::kE4M3;
  w.n = static_cast<int64_t>(s.col_blocks) * kUnitColumns;
  w.k = w.k_pad = static_cast<int64_t>(s.k_tiles) * kKTile;
  w.data = s.w;
  w.scale = s.scale;
  return w;
}

struct GemmShape {
  const char* name;
  int64_t n, k;
};

int main_impl(int argc, char** argv) {
  CLI::App app{"persistent streaming-chain probe: the 20 layer GEMMs (m = 16, E4M3) in one kernel"};
  int reps = 50, max_ksplit = 2, layers = 5;
  bool no_norm_barriers = false;
  uint64_t seed = 1;
  app.add_option("--reps", reps, "timed launches (median)");
  app.add_option("--max-ksplit", max_ksplit,
                 "most K parts per column block (1: never split K; 2, the default, measured fastest)");
  app.add_option("--layers", layers, "layers (4 GEMMs each)");
  app.add_flag("--no-norm-barriers", no_norm_barriers, "leave out the empty steps standing for the RMSNorms");
  app.add_option("--seed", seed, "weights and activations");
  CLI11_PARSE(app, argc, argv);
  if (max_ksplit < 1 || layers < 1 || layers > 5 || reps < 1) {
    throw bad_input("stream_chain_probe: --max-ksplit and --reps must be >= 1, --layers 1 to 5");
  }
  std::printf("stream_chain_probe: seed %llu, %d layers, max ksplit %d, norm barriers %s, %d timed launches\n",
              static_cast<unsigned long long>(seed), layers, max_ksplit, no_norm_barriers ? "off" : "on", reps);

  int sm_count = 0;
  DFLASH_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0));
  DFLASH_CUDA_CHECK(cudaFuncSetAttribute(stream_chain_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(kSmemBytes)));
  int per_sm = 0;
  DFLASH_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, stream_chain_kernel, kThreads, kSmemBytes));
  if (per_sm < 1) throw internal_error("stream_chain_kernel does not fit on an SM");
  const int ctas = sm_count;
  const int vctas = ctas * kGroups;
  const double copy_rate = measure_copy_bandwidth(size_t{1} << 30);
  std::printf("%d SMs, %d CTA of %d threads per SM (%d groups of %d warps), %zu B shared memory; copy rate %.0f GB/s\n",
              sm_count, per_sm, kThreads, kGroups, kGroupWarps, kSmemBytes, copy_rate / 1e9);

  const GemmShape layer_shapes[4] = {{"o", 4096, 4096}, {"gate|up", 24576, 4096}, {"down", 4096, 12288}, {"q|k|v", 6144, 4096}};
  size_t max_n = 6144, max_weight = 0;  // x0 has q|k|v's 6144 columns; every step reads at most max_n
  for (const GemmShape& sh : layer_shapes) {
    max_n = std::max(max_n, static_cast<size_t>(sh.n));
    max_weight = std::max(max_weight, static_cast<size_t>(sh.n * sh.k));
  }
  const int gemms = 4 * layers;
  std::vector<DeviceBuffer<uint8_t>> weights(gemms);
  std::vector<DeviceBuffer<float>> scales(gemms), partials(gemms);
  std::vector<DeviceBuffer<uint16_t>> outs(gemms);
  std::vector<DeviceBuffer<unsigned>> arrivals(gemms);
  DeviceBuffer<uint16_t> x0(kRows * 6144);
  fill_bf16<<<64, 256>>>(x0.get(), x0.size(), seed);
  DFLASH_CUDA_CHECK_LAUNCH("fill_bf16");

  // The per-row scale keeps each output's variance that of its input: 1 / sqrt(k · E[code²]).
  double mean_square = 0;
  for (int c = 0; c < 256; ++c) {
    const double v = e4m3_to_float(static_cast<uint8_t>((c & 0x7f) == 0x7f ? c ^ 1 : c));  // fill_codes' NaN substitute
    mean_square += v * v;
  }
  mean_square /= 256;

  Params p = {};
  std::vector<int> gemm_step;
  double weight_bytes = 0;
  int64_t units_before = 0;
  const uint16_t* prev = x0.get();
  int64_t prev_ld = 6144;
  for (int l = 0; l < layers; ++l) {
    for (int j = 0; j < 4; ++j) {
      const GemmShape& sh = layer_shapes[j];
      const int i = 4 * l + j;
      if (!no_norm_barriers && (j == 1 || j == 3)) {  // the post-attention and the next input RMSNorm
        if (p.steps >= kMaxSteps) throw internal_error("too many steps");
        p.step[p.steps++].barrier_only = 1;
      }
      // Whole units and k-tiles: the ring copies every row of a unit, unguarded.
      if (sh.n % kUnitColumns != 0 || sh.k % kKTile != 0) throw internal_error(std::string(sh.name) + ": not whole units");
      weights[i].allocate(sh.n * sh.k);
      fill_codes<<<1024, 256>>>(weights[i].get(), weights[i].size(), seed + 100 + i);
      DFLASH_CUDA_CHECK_LAUNCH("fill_codes");
      std::vector<float> sc(sh.n, static_cast<float>(1.0 / std::sqrt(sh.k * mean_square)));
      scales[i].allocate(sh.n);
      DFLASH_CUDA_CHECK(cudaMemcpy(scales[i].get(), sc.data(), sh.n * 4, cudaMemcpyHostToDevice));
      outs[i].allocate(kRows * sh.n);
      weight_bytes += static_cast<double>(sh.n) * sh.k + 4.0 * sh.n;

      Step& s = p.step[p.steps];
      s.a = prev;
      s.lda = prev_ld;
      s.w = weights[i].get();
      s.ldw = sh.k;
      s.scale = scales[i].get();
      s.out = outs[i].get();
      s.ldo = sh.n;
      s.k_tiles = static_cast<int>(sh.k / kKTile);
      s.col_blocks = static_cast<int>(sh.n / kUnitColumns);
      // The split whose busiest CTA computes the fewest k-tiles (ties: fewer parts).
      int best = 1;
      int64_t best_cost = INT64_MAX;
      for (int q = 1; q <= max_ksplit; ++q) {
        const int part = (s.k_tiles + q - 1) / q;
        const int64_t units = static_cast<int64_t>(s.col_blocks) * q;
        const int64_t cost = (units + vctas - 1) / vctas * part;
        if (cost < best_cost) best = q, best_cost = cost;
      }
      s.ksplit = best;
      s.part_tiles = (s.k_tiles + best - 1) / best;
      s.units = s.col_blocks * best;
      s.rotation = static_cast<int>(units_before % vctas);
      units_before += s.units;
#ifdef PROBE_WARP_PARTIALS
      partials[i].allocate(static_cast<size_t>(s.col_blocks) * best * kWarps * kRows * kUnitColumns);
#else
      partials[i].allocate(static_cast<size_t>(s.col_blocks) * best * kRows * kUnitColumns);
#endif
      arrivals[i].allocate(s.col_blocks);
      DFLASH_CUDA_CHECK(cudaMemset(arrivals[i].get(), 0, s.col_blocks * sizeof(unsigned)));
      s.partials = partials[i].get();
      s.arrivals = arrivals[i].get();
      if (l == 0) {
        std::printf("  %-8s %6lld x %5lld: %d column blocks x %d K parts of %d k-tiles = %d units, busiest group %lld k-tiles\n",
                    sh.name, static_cast<long long>(sh.n), static_cast<long long>(sh.k), s.col_blocks, best,
                    s.part_tiles, s.units, static_cast<long long>(best_cost));
      }
      gemm_step.push_back(p.steps);
      ++p.steps;
      prev = outs[i].get();
      prev_ld = sh.n;
    }
  }
  DeviceBuffer<unsigned long long> barrier(1), stamps(kMaxSteps + 1);
  DFLASH_CUDA_CHECK(cudaMemset(barrier.get(), 0, 8));
  p.ctas = ctas;
  p.vctas = vctas;
  p.barrier = barrier.get();
  p.stamps = stamps.get();

  cudaStream_t stream;
  DFLASH_CUDA_CHECK(cudaStreamCreate(&stream));
  auto launch = [&] {
    launch_cooperative_kernel("stream_chain_kernel", stream_chain_kernel, dim3(ctas), dim3(kThreads), kSmemBytes, stream, p);
  };
  cudaEvent_t start, stop;
  DFLASH_CUDA_CHECK(cudaEventCreate(&start));
  DFLASH_CUDA_CHECK(cudaEventCreate(&stop));
  auto timed = [&](auto&& body) {
    for (int i = 0; i < 5; ++i) body();
    std::vector<float> us;
    for (int r = 0; r < reps; ++r) {
      DFLASH_CUDA_CHECK(cudaEventRecord(start, stream));
      body();
      DFLASH_CUDA_CHECK(cudaEventRecord(stop, stream));
      DFLASH_CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      DFLASH_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      us.push_back(ms * 1000.0f);
    }
    return median(us);
  };

  const float chain_us = timed(launch);
  std::vector<unsigned long long> st(p.steps + 1);
  DFLASH_CUDA_CHECK(cudaMemcpy(st.data(), stamps.get(), st.size() * 8, cudaMemcpyDeviceToHost));

  // Check every GEMM step's output against the drafter's plain reference GEMM (kSimple: one thread
  // per output, fp32 in k order) of its own input; the same GEMM of the magnitudes gives Σ|terms|.
  double worst = 0;
  int64_t failures = 0;
  if (!kTimingOnly) {
    DeviceBuffer<uint8_t> abs_w(max_weight);
    DeviceBuffer<uint16_t> abs_a(kRows * max_n);
    DeviceBuffer<float> ref(kRows * max_n), mag(kRows * max_n);
    for (int i = 0; i < gemms; ++i) {
      const Step& s = p.step[gemm_step[i]];
      const DeviceMatrixView w = step_weights(s);
      const size_t n = static_cast<size_t>(w.n), w_count = n * w.k, a_count = kRows * s.lda;
      launch_gemm_simple(stream, s.a, s.lda, kRows, w, ref.get());
      clear_sign_bits<<<1024, 256, 0, stream>>>(s.w, abs_w.get(), w_count, uint8_t{0x80});
      DFLASH_CUDA_CHECK_LAUNCH("clear_sign_bits");
      clear_sign_bits<<<64, 256, 0, stream>>>(s.a, abs_a.get(), a_count, uint16_t{0x8000});
      DFLASH_CUDA_CHECK_LAUNCH("clear_sign_bits");
      DeviceMatrixView abs_view = w;
      abs_view.data = abs_w.get();
      launch_gemm_simple(stream, abs_a.get(), s.lda, kRows, abs_view, mag.get());
      std::vector<float> r(kRows * n), m(kRows * n), sc(n);
      std::vector<uint16_t> o(kRows * n);
      DFLASH_CUDA_CHECK(cudaMemcpyAsync(r.data(), ref.get(), r.size() * 4, cudaMemcpyDeviceToHost, stream));
      DFLASH_CUDA_CHECK(cudaMemcpyAsync(m.data(), mag.get(), m.size() * 4, cudaMemcpyDeviceToHost, stream));
      DFLASH_CUDA_CHECK(cudaMemcpyAsync(sc.data(), s.scale, sc.size() * 4, cudaMemcpyDeviceToHost, stream));
      DFLASH_CUDA_CHECK(cudaMemcpyAsync(o.data(), s.out, o.size() * 2, cudaMemcpyDeviceToHost, stream));
      DFLASH_CUDA_CHECK(cudaStreamSynchronize(stream));
      for (size_t e = 0; e < r.size(); ++e) {
        const double scale = sc[e % n], want = r[e] * scale;
        // bf16 rounding of either sum (2^-8 relative each) plus fp32 reordering (k · 2^-24 · Σ|terms|).
        const double tol = std::ldexp(std::fabs(want), -7) + w.k * std::ldexp(1.0, -24) * m[e] * std::fabs(scale);
        const double ratio = std::fabs(bf16_bits_to_float(o[e]) - want) / tol;
        if (!(ratio <= 1.0)) ++failures;
        worst = std::max(worst, std::isfinite(ratio) ? ratio : 1e30);
      }
    }
  }
  if (kTimingOnly) {
    std::printf("timing-only build (a PROBE_ switch): the outputs are wrong and were not checked\n");
  } else {
    std::printf("outputs vs the plain reference, every GEMM step: worst |diff| / bound %.3f, %lld elements over it\n",
                worst, static_cast<long long>(failures));
  }

  // Per step, from CTA 0's clock in the last timed launch: mean over the layers.
  std::printf("| step | us (mean over layers) | weight MB | TB/s |\n|---|---|---|---|\n");
  for (int j = 0; j < 4; ++j) {
    double us = 0, norm_us = 0;
    for (int l = 0; l < layers; ++l) {
      const int si = gemm_step[4 * l + j];
      us += (st[si + 1] - st[si]) / 1e3;
      if (si > 0 && p.step[si - 1].barrier_only) norm_us += (st[si] - st[si - 1]) / 1e3;
    }
    const double mb = layer_shapes[j].n * layer_shapes[j].k / 1e6;
    if (norm_us > 0) std::printf("| (empty step before %s) | %.2f | 0 | |\n", layer_shapes[j].name, norm_us / layers);
    std::printf("| %s | %.2f | %.1f | %.2f |\n", layer_shapes[j].name, us / layers, mb, mb / (us / layers));
  }

  // The baseline: the same 20 GEMMs as the drafter's own kernels, PDL, one graph.
  prepare_gemm_kernels();
  DeviceBuffer<float> base_out(kRows * max_n);
  GemmContext ctx;
  ctx.stream = stream;
  ctx.sm_count = sm_count;
  ctx.pdl = true;
  auto baseline_body = [&] {
    for (int i = 0; i < gemms; ++i) {
      const Step& s = p.step[gemm_step[i]];
      const DeviceMatrixView w = step_weights(s);
      GemmEpilogue ep;
      ep.out = base_out.get();
      ep.ld_out = w.n;
      gemm(GemmKernel::kMma, ctx, s.a, s.lda, kRows, w, ep);
    }
  };
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  baseline_body();  // outside the capture: first launches
  DFLASH_CUDA_CHECK(cudaStreamSynchronize(stream));
  DFLASH_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  baseline_body();
  DFLASH_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  DFLASH_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const float baseline_us = timed([&] { DFLASH_CUDA_CHECK(cudaGraphLaunch(exec, stream)); });
  const float chain_again_us = timed(launch);

  const double floor_us = weight_bytes / copy_rate * 1e6;
  std::printf("| form | median us | weight MB | TB/s | x copy-rate time |\n|---|---|---|---|---|\n");
  std::printf("| the drafter's kernels, %d launches, PDL, one graph | %.1f | %.0f | %.2f | %.2f |\n", gemms, baseline_us,
              weight_bytes / 1e6, weight_bytes / baseline_us / 1e6, baseline_us / floor_us);
  std::printf("| the streaming chain, one launch (first / second round) | %.1f / %.1f | %.0f | %.2f | %.2f |\n", chain_us,
              chain_again_us, weight_bytes / 1e6, weight_bytes / chain_us / 1e6, chain_us / floor_us);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace dflash

int main(int argc, char** argv) { return dflash::run_program("stream_chain_probe", dflash::main_impl, argc, argv); }
