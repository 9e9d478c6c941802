#include "cuda/kernels/conv/grouped_conv.h"

#include <cuda_bf16.h>

#include <cstdint>
#include <string>

#include "core/error.h"
#include "cuda/runtime/cuda_check.h"
#include "cuda/runtime/launch.cuh"

namespace dflash {
namespace {

// One CTA per (sequence, slab of 32 channels); warp w takes block rows w, w + 8, ... and lane l
// channel slab·32 + l, so each warp reads 32 consecutive channels of a row and every output element
// has its own thread: the loads of a whole block are in flight at once.
constexpr int kConvWarps = 8;
constexpr int kConvSlab = 32;  // channels per CTA: one per lane

// A thread's (sequence, channel). Every index is formed once, in 32-bit arithmetic (batch·H is at
// most 2^26, docs/limits.md): a 64-bit division per tap and row costs more than the taps' loads.
struct ConvThread {
  int64_t row0;  // the sequence's first block row
  int ch;        // the channel (>= channels: past the last slab's end, no work)
  int group;     // ch / G: its coefficient's column within a (side, tap)
  int groups;    // H / G
};

__device__ __forceinline__ ConvThread conv_thread(const GroupedConvArgs& a) {
  const int channels = static_cast<int>(a.channels);
  const int slabs = (channels + kConvSlab - 1) / kConvSlab;
  ConvThread th;
  th.row0 = static_cast<int64_t>(blockIdx.x / slabs) * a.block_width;
  th.ch = static_cast<int>(blockIdx.x % slabs) * kConvSlab + static_cast<int>(threadIdx.x % 32);
  th.group = th.ch / a.group_size;
  th.groups = channels / a.group_size;
  return th;
}

// Output row t (inside the block) of side `side`: Σ_τ (base + bf16(c))·z[t - τ] over the taps in
// order, fp32, with tap τ zero for t < τ (the block boundary). z_at(r) loads the operand of block
// row r (absolute). Both kernels call it, so both sides get the same operations.
template <typename ZAt>
__device__ __forceinline__ float conv_row(const GroupedConvArgs& a, const ConvThread& th, int side, int t,
                                          const ZAt& z_at) {
  const int64_t row = th.row0 + t;
  float acc = 0.0f;
  for (int tau = 0; tau < a.taps && tau <= t; ++tau) {
    const int column = (side * a.taps + tau) * th.groups + th.group;
    const float c = a.coef[row * a.ld_coef + column];
    const float base = a.base[static_cast<int64_t>(side * a.taps + tau) * a.channels + th.ch];
    acc = __fadd_rn(acc, __fmul_rn(__fadd_rn(base, __bfloat162float(__float2bfloat16_rn(c))), z_at(row - tau)));
  }
  return acc;
}

// In place: the rows go in chunks of kConvWarps from the last chunk to the first, every warp
// computing its row before any stores it (a barrier between), so a row is read before it is
// overwritten; a chunk reads only rows at or before its own, none written yet.
__global__ void __launch_bounds__(kConvWarps * 32) conv_prepare_kernel(GroupedConvArgs a, uint16_t* x, int64_t ld_x) {
  pdl_launch_dependents();
  pdl_wait();
  const ConvThread th = conv_thread(a);
  const bool active = th.ch < a.channels;
  __nv_bfloat16* col = reinterpret_cast<__nv_bfloat16*>(x) + th.ch;
  const auto z_at = [&](int64_t r) { return __bfloat162float(col[r * ld_x]); };
  const int warp = static_cast<int>(threadIdx.x / 32);
  for (int t0 = (a.block_width - 1) / kConvWarps * kConvWarps; t0 >= 0; t0 -= kConvWarps) {
    const int t = t0 + warp;
    const bool mine = active && t < a.block_width;
    const float out = mine ? conv_row(a, th, 0, t, z_at) : 0.0f;
    __syncthreads();
    if (mine) col[(th.row0 + t) * ld_x] = __float2bfloat16_rn(out);
  }
}

__global__ void __launch_bounds__(kConvWarps * 32) conv_finish_kernel(GroupedConvArgs a, const float* z, int64_t ld_z,
                                                                     float* residual, float* tap_out) {
  pdl_launch_dependents();
  pdl_wait();
  const ConvThread th = conv_thread(a);
  if (th.ch >= a.channels) return;
  const auto z_at = [&](int64_t r) { return z[r * ld_z + th.ch]; };
  for (int t = static_cast<int>(threadIdx.x / 32); t < a.block_width; t += kConvWarps) {
    const float out = conv_row(a, th, 1, t, z_at);
    const int64_t at = (th.row0 + t) * ld_z + th.ch;
    if (tap_out != nullptr) tap_out[at] = out;
    residual[at] = __fadd_rn(residual[at], out);
  }
}

dim3 conv_grid(const GroupedConvArgs& a) {
  const int64_t ctas = static_cast<int64_t>(a.batch) * ((a.channels + kConvSlab - 1) / kConvSlab);
  if (static_cast<int64_t>(a.batch) * a.channels > INT32_MAX) {  // the kernels index in 32 bits (ctas <= this)
    throw internal_error("grouped conv: batch " + std::to_string(a.batch) + " x channels " + std::to_string(a.channels) +
                         " exceeds 32-bit thread indices");
  }
  return dim3(static_cast<unsigned>(ctas));
}

}  // namespace

void launch_conv_prepare(const GroupedConvArgs& a, uint16_t* x, int64_t ld_x, cudaStream_t stream, bool pdl) {
  launch_kernel(DFLASH_KERNEL_SITE("conv_prepare_kernel"), conv_prepare_kernel, conv_grid(a), dim3(kConvWarps * 32), 0, stream, pdl, a, x,
                ld_x);
}

void launch_conv_finish(const GroupedConvArgs& a, const float* z, int64_t ld_z, float* residual, float* tap_out,
                        cudaStream_t stream, bool pdl) {
  launch_kernel(DFLASH_KERNEL_SITE("conv_finish_kernel"), conv_finish_kernel, conv_grid(a), dim3(kConvWarps * 32), 0, stream, pdl, a, z, ld_z,
                residual, tap_out);
}

void prepare_grouped_conv_kernels() {
  cudaFuncAttributes attributes;
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&attributes, conv_prepare_kernel));
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&attributes, conv_finish_kernel));
}

}  // namespace dflash
