#include "cuda/grouped_conv.h"

#include <cuda_bf16.h>

#include "cuda/cuda_check.h"
#include "cuda/launch.cuh"

namespace dflash {
namespace {

constexpr int kConvThreads = 256;

// (base + bf16(coefficient)) of output row `row`, side `side`, tap `tau`, channel `ch`.
__device__ __forceinline__ float conv_weight(const GroupedConvArgs& a, int side, int64_t row, int tau, int64_t ch) {
  const int64_t groups = a.channels / a.group_size;
  const float c = a.coef[row * a.ld_coef + (side * a.taps + tau) * groups + ch / a.group_size];
  const float base = a.base[(static_cast<int64_t>(side) * a.taps + tau) * a.channels + ch];
  return __fadd_rn(base, __bfloat162float(__float2bfloat16_rn(c)));
}

// This thread's (sequence, channel): false past the last one. row0 is the sequence's first block row.
__device__ __forceinline__ bool conv_thread(const GroupedConvArgs& a, int64_t* row0, int64_t* ch) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<int64_t>(a.batch) * a.channels) return false;
  *row0 = idx / a.channels * a.block_width;
  *ch = idx % a.channels;
  return true;
}

// Rows of one sequence from the last to the first: row t reads rows t-k+1..t, none written yet, so
// the update can be in place.
__global__ void __launch_bounds__(kConvThreads) conv_prepare_kernel(GroupedConvArgs a, uint16_t* x, int64_t ld_x) {
  pdl_launch_dependents();
  pdl_wait();
  int64_t row0, ch;
  if (!conv_thread(a, &row0, &ch)) return;
  __nv_bfloat16* col = reinterpret_cast<__nv_bfloat16*>(x) + ch;
  for (int t = a.block_width - 1; t >= 0; --t) {
    float acc = 0.0f;
    for (int tau = 0; tau < a.taps && tau <= t; ++tau) {  // block boundary: tap τ is zero for rows t < τ
      const float z = __bfloat162float(col[(row0 + t - tau) * ld_x]);
      acc = __fadd_rn(acc, __fmul_rn(conv_weight(a, 0, row0 + t, tau, ch), z));
    }
    col[(row0 + t) * ld_x] = __float2bfloat16_rn(acc);
  }
}

__global__ void __launch_bounds__(kConvThreads) conv_finish_kernel(GroupedConvArgs a, const float* z, int64_t ld_z,
                                                                   float* residual, float* tap_out) {
  pdl_launch_dependents();
  pdl_wait();
  int64_t row0, ch;
  if (!conv_thread(a, &row0, &ch)) return;
  for (int t = 0; t < a.block_width; ++t) {
    float acc = 0.0f;
    for (int tau = 0; tau < a.taps && tau <= t; ++tau) {
      acc = __fadd_rn(acc, __fmul_rn(conv_weight(a, 1, row0 + t, tau, ch), z[(row0 + t - tau) * ld_z + ch]));
    }
    const int64_t at = (row0 + t) * ld_z + ch;
    if (tap_out != nullptr) tap_out[at] = acc;
    residual[at] = __fadd_rn(residual[at], acc);
  }
}

dim3 conv_grid(const GroupedConvArgs& a) {
  const int64_t threads = static_cast<int64_t>(a.batch) * a.channels;
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
