// One RMSNorm row in the tuned order, as the RMSNorm kernel (elementwise.cu: 512 threads per row)
// computes it; a kernel with fewer threads per row that plays the same virtual threads gets the
// same bits.
//
// The order: 512 "virtual" threads; virtual thread v holds the row's float4s v, v + 512, ... (at
// most kMaxVecs), sums their squares in that order with fmaf (x, y, z, w), the 16 virtual
// warps reduce with an xor-shuffle tree (offsets 16, 8, 4, 2, 1) and their sums are added in warp
// order. A CTA of 512 / V threads plays it with V virtual threads each: thread t is virtual
// threads t + j·(512 / V), j < V, whose lanes are its own lane, so each shuffle tree is the
// virtual warp's.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/kernels/elementwise/elementwise.h"
#include "testing/fault_points.cuh"

namespace dflash {
namespace rmsnorm_row {

constexpr int kVirtualThreads = 512;
constexpr int kVirtualWarps = kVirtualThreads / 32;
constexpr int kMaxVecs = 8;  // float4 per virtual thread: rows of up to 16384 columns
// Rows of up to 4096 columns need only 2: a kernel compiled for that holds the row and its weights
// in 32 registers, four CTAs of 512 threads per SM.
constexpr int kShortRowVecs = 2;

// 1 / sqrt(mean + eps) with IEEE sqrt and division.
__device__ __forceinline__ float inverse_rms(float sum_squares, int64_t cols, float eps) {
  const float mean = __fdiv_rn(sum_squares, static_cast<float>(cols));
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
}

// The virtual thread that copy j of this thread plays, for CTAs of 512 / V threads.
template <int V>
__device__ __forceinline__ int virtual_thread(int j) {
  return static_cast<int>(threadIdx.x) + j * (kVirtualThreads / V);
}

// x[j][i] is float4 number i·512 + virtual_thread(j) of the row (only those below `vecs` are read;
// N float4s per virtual thread, vecs <= 512·N).
// Returns 1 / rms of the row; scratch: kVirtualWarps floats of shared memory. Every thread of the
// CTA calls it (two __syncthreads inside).
template <int V, int N>
__device__ __forceinline__ float row_inverse_rms(const float4 (&x)[V][N], int vecs, int64_t cols, float eps,
                                                 float* scratch) {
  float ss[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    ss[j] = 0.0f;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if (i * kVirtualThreads + virtual_thread<V>(j) < vecs) {
        ss[j] = fmaf(x[j][i].x, x[j][i].x, ss[j]);
        ss[j] = fmaf(x[j][i].y, x[j][i].y, ss[j]);
        ss[j] = fmaf(x[j][i].z, x[j][i].z, ss[j]);
        ss[j] = fmaf(x[j][i].w, x[j][i].w, ss[j]);
      }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) ss[j] = __fadd_rn(ss[j], __shfl_xor_sync(0xffffffffu, ss[j], offset));
  }
  __syncthreads();  // scratch may still be read by an earlier row
  if ((threadIdx.x & 31) == 0) {
#pragma unroll
    for (int j = 0; j < V; ++j) scratch[virtual_thread<V>(j) >> 5] = ss[j];
  }
  __syncthreads();
  float r = scratch[0];
  for (int w = 1; w < kVirtualWarps; ++w) r = __fadd_rn(r, scratch[w]);
  return inverse_rms(r, cols, eps);
}

// The weight's float4s that store_row multiplies x[j][i] by. No kernel of a forward writes the
// weights, so a kernel may load them before its PDL wait (their latency then overlaps the kernel
// before it).
template <int V, int N>
__device__ __forceinline__ void load_weights(const RmsNormArgs& a, int vecs, float4 (&w)[V][N]) {
  const float4* weight = reinterpret_cast<const float4*>(a.weight);
#pragma unroll
  for (int j = 0; j < V; ++j) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const int v = i * kVirtualThreads + virtual_thread<V>(j);
      if (v < vecs) w[j][i] = weight[v];
    }
  }
}

// out[row] = bf16(x · r · weight), and the draft copy of rows i >= 1 of each block (RmsNormArgs);
// weight: from load_weights, or with kLoad each float4 read as it is used (fewer live registers).
template <int V, int N, bool kLoad>
__device__ __forceinline__ void store_row(const RmsNormArgs& a, int64_t row, const float4 (&x)[V][N],
                                          const float4 (&weight)[V][N], int vecs, float r) {
  __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(a.out) + row * a.ld_out;
  __nv_bfloat16* draft = nullptr;
  if (a.draft_out != nullptr && row % a.block_width >= 1) {
    const int64_t draft_row = row / a.block_width * (a.block_width - 1) + (row % a.block_width - 1);
    draft = reinterpret_cast<__nv_bfloat16*>(a.draft_out) + draft_row * a.ld_out;
  }
  DFLASH_DEVICE_MUTATE(kDraftRowShift, if (draft != nullptr) draft = row % a.block_width + 1 < a.block_width ? draft + a.ld_out : nullptr);
#pragma unroll
  for (int j = 0; j < V; ++j) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const int v = i * kVirtualThreads + virtual_thread<V>(j);
      if (v < vecs) {
        const float4 w = kLoad ? reinterpret_cast<const float4*>(a.weight)[v] : weight[j][i];
        __nv_bfloat162 lo, hi;
        lo.x = __float2bfloat16_rn(__fmul_rn(__fmul_rn(x[j][i].x, r), w.x));
        lo.y = __float2bfloat16_rn(__fmul_rn(__fmul_rn(x[j][i].y, r), w.y));
        hi.x = __float2bfloat16_rn(__fmul_rn(__fmul_rn(x[j][i].z, r), w.z));
        hi.y = __float2bfloat16_rn(__fmul_rn(__fmul_rn(x[j][i].w, r), w.w));
        uint2 packed;
        packed.x = *reinterpret_cast<const uint32_t*>(&lo);
        packed.y = *reinterpret_cast<const uint32_t*>(&hi);
        reinterpret_cast<uint2*>(out)[v] = packed;
        if (draft != nullptr) reinterpret_cast<uint2*>(draft)[v] = packed;
      }
    }
  }
}

}  // namespace rmsnorm_row
}  // namespace dflash
