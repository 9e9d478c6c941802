#include "cuda/grouped_conv.h"

#include <cuda_bf16.h>

#include <cstdint>
#include <string>

#include "core/error.h"
#include "cuda/cuda_check.h"
#include "cuda/launch.cuh"

namespace dflash {
namespace {

constexpr int kConvThreads = 128;
constexpr int kConvRows = 8;  // block rows per chunk: one load round each

// One thread's (sequence, channel). Every index is formed once, in 32-bit arithmetic (batch·H is
// at most 2^26, docs/limits.md): a 64-bit division per tap and row costs more than the taps' loads.
struct ConvThread {
  int64_t row0;  // the sequence's first block row
  int ch;        // the channel
  int group;     // ch / G: its coefficient's column within a (side, tap)
  int groups;    // H / G
};

// This thread's (sequence, channel): false past the last one.
__device__ __forceinline__ bool conv_thread(const GroupedConvArgs& a, ConvThread* th) {
  const int channels = static_cast<int>(a.channels);
  const int idx = static_cast<int>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= a.batch * channels) return false;
  th->row0 = static_cast<int64_t>(idx / channels) * a.block_width;
  th->ch = idx % channels;
  th->group = th->ch / a.group_size;
  th->groups = channels / a.group_size;
  return true;
}

// (base + bf16(coefficient)) of output row `row`, side `side`, tap `tau`, the thread's channel.
__device__ __forceinline__ float conv_weight(const GroupedConvArgs& a, const ConvThread& th, int side, int64_t row,
                                             int tau) {
  const int column = (side * a.taps + tau) * th.groups + th.group;
  const float c = a.coef[row * a.ld_coef + column];
  const float base = a.base[static_cast<int64_t>(side * a.taps + tau) * a.channels + th.ch];
  return __fadd_rn(base, __bfloat162float(__float2bfloat16_rn(c)));
}

// Rows of one sequence from the last chunk of kConvRows to the first: a chunk reads rows at or
// before its own, none written yet, so the update can be in place. Each chunk loads every operand
// before it stores, so its loads are in flight together; each row's sum runs over the taps in order.
__global__ void __launch_bounds__(kConvThreads) conv_prepare_kernel(GroupedConvArgs a, uint16_t* x, int64_t ld_x) {
  pdl_launch_dependents();
  pdl_wait();
  ConvThread th;
  if (!conv_thread(a, &th)) return;
  const int64_t row0 = th.row0;
  __nv_bfloat16* col = reinterpret_cast<__nv_bfloat16*>(x) + th.ch;
  for (int t0 = (a.block_width - 1) / kConvRows * kConvRows; t0 >= 0; t0 -= kConvRows) {
    float acc[kConvRows];
#pragma unroll
    for (int i = 0; i < kConvRows; ++i) acc[i] = 0.0f;
    for (int tau = 0; tau < a.taps; ++tau) {
#pragma unroll
      for (int i = 0; i < kConvRows; ++i) {
        const int t = t0 + i;
        if (t >= a.block_width || tau > t) continue;  // block boundary: tap τ is zero for rows t < τ
        const float z = __bfloat162float(col[(row0 + t - tau) * ld_x]);
        acc[i] = __fadd_rn(acc[i], __fmul_rn(conv_weight(a, th, 0, row0 + t, tau), z));
      }
    }
#pragma unroll
    for (int i = 0; i < kConvRows; ++i) {
      if (t0 + i < a.block_width) col[(row0 + t0 + i) * ld_x] = __float2bfloat16_rn(acc[i]);
    }
  }
}

__global__ void __launch_bounds__(kConvThreads) conv_finish_kernel(GroupedConvArgs a, const float* z, int64_t ld_z,
                                                                   float* residual, float* tap_out) {
  pdl_launch_dependents();
  pdl_wait();
  ConvThread th;
  if (!conv_thread(a, &th)) return;
  const int64_t row0 = th.row0, ch = th.ch;
  for (int t0 = 0; t0 < a.block_width; t0 += kConvRows) {
    float acc[kConvRows];
#pragma unroll
    for (int i = 0; i < kConvRows; ++i) acc[i] = 0.0f;
    for (int tau = 0; tau < a.taps; ++tau) {
#pragma unroll
      for (int i = 0; i < kConvRows; ++i) {
        const int t = t0 + i;
        if (t >= a.block_width || tau > t) continue;
        acc[i] = __fadd_rn(acc[i], __fmul_rn(conv_weight(a, th, 1, row0 + t, tau), z[(row0 + t - tau) * ld_z + ch]));
      }
    }
#pragma unroll
    for (int i = 0; i < kConvRows; ++i) {
      if (t0 + i >= a.block_width) continue;
      const int64_t at = (row0 + t0 + i) * ld_z + ch;
      if (tap_out != nullptr) tap_out[at] = acc[i];
      residual[at] = __fadd_rn(residual[at], acc[i]);
    }
  }
}

dim3 conv_grid(const GroupedConvArgs& a) {
  const int64_t threads = static_cast<int64_t>(a.batch) * a.channels;
  if (threads > INT32_MAX) {  // the kernels index in 32 bits
    throw internal_error("grouped conv: batch " + std::to_string(a.batch) + " x channels " + std::to_string(a.channels) +
                         " exceeds 32-bit thread indices");
  }
  return dim3(static_cast<unsigned>((threads + kConvThreads - 1) / kConvThreads));
}

}  // namespace

void launch_conv_prepare(const GroupedConvArgs& a, uint16_t* x, int64_t ld_x, cudaStream_t stream, bool pdl) {
  launch_kernel("conv_prepare_kernel", conv_prepare_kernel, conv_grid(a), dim3(kConvThreads), 0, stream, pdl, a, x,
                ld_x);
}

void launch_conv_finish(const GroupedConvArgs& a, const float* z, int64_t ld_z, float* residual, float* tap_out,
                        cudaStream_t stream, bool pdl) {
  launch_kernel("conv_finish_kernel", conv_finish_kernel, conv_grid(a), dim3(kConvThreads), 0, stream, pdl, a, z, ld_z,
                residual, tap_out);
}

void prepare_grouped_conv_kernels() {
  cudaFuncAttributes attributes;
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&attributes, conv_prepare_kernel));
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&attributes, conv_finish_kernel));
}

}  // namespace dflash
