#include "cuda/tp/tp_reduce.h"

#include <cuda_bf16.h>

#include <string>

#include "core/error.h"
#include "cuda/runtime/cuda_check.h"
#include "cuda/runtime/launch.cuh"

namespace dflash {
namespace {

__device__ __forceinline__ float bf16_round(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

// §4's sum of one element: `partial(r)` is p_r as it travelled.
template <bool kBf16, typename Partial>
__device__ __forceinline__ float reduce_linear(int ranks, Partial partial) {
  float s = partial(0);
  for (int r = 1; r < ranks; ++r) s = __fadd_rn(s, partial(r));
  return kBf16 ? bf16_round(s) : s;  // R = bf16(s): one rounding of the sum
}

template <bool kBf16>
__global__ void tp_reduce_kernel(const void* partials, int ranks, int64_t count, float* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  if constexpr (kBf16) {
    const __nv_bfloat16* p = static_cast<const __nv_bfloat16*>(partials);
    out[i] = reduce_linear<true>(ranks, [&](int r) { return __bfloat162float(p[r * count + i]); });
  } else {
    const float* p = static_cast<const float*>(partials);
    out[i] = reduce_linear<false>(ranks, [&](int r) { return p[r * count + i]; });
  }
}

template <bool kBf16>
__global__ void tp_reduce_rows_kernel(TpPartials p, const float* bias, float* out, int64_t ld_out, float* residual,
                                      int64_t ld_residual) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.rows * p.cols) return;
  const int64_t m = i / p.cols, c = i % p.cols;
  const float* element = p.base + m * p.ld + c;
  const float reduced = reduce_linear<kBf16>(p.ranks, [&](int r) {
    const float v = element[r * p.rank_stride];
    return kBf16 ? bf16_round(v) : v;  // p_r = bf16(P_r): rounded as its sender would
  });
  const float o = bias != nullptr ? __fadd_rn(reduced, bias[c]) : reduced;
  out[m * ld_out + c] = o;
  if (residual != nullptr) residual[m * ld_residual + c] = __fadd_rn(residual[m * ld_residual + c], o);
}

}  // namespace

void launch_tp_reduce(cudaStream_t stream, const void* partials, int ranks, int64_t count, TpWire wire, float* out) {
  if (ranks < 1 || count < 0) {
    throw internal_error("tp_reduce: " + std::to_string(ranks) + " ranks of " + std::to_string(count) + " elements");
  }
  if (count == 0) return;
  const dim3 blocks(static_cast<unsigned>((count + 255) / 256));
  if (wire == TpWire::kBf16) {
    launch_kernel(DFLASH_KERNEL_SITE("tp_reduce_kernel"), tp_reduce_kernel<true>, blocks, dim3(256), 0, stream, false,
                  partials, ranks, count, out);
  } else {
    launch_kernel(DFLASH_KERNEL_SITE("tp_reduce_kernel"), tp_reduce_kernel<false>, blocks, dim3(256), 0, stream, false,
                  partials, ranks, count, out);
  }
}

void launch_tp_reduce_rows(cudaStream_t stream, const TpPartials& partials, TpWire wire, const float* bias, float* out,
                           int64_t ld_out, float* residual, int64_t ld_residual) {
  if (partials.ranks < 1 || partials.rows < 0 || partials.cols < 0 || partials.ld < partials.cols || ld_out < partials.cols ||
      (residual != nullptr && ld_residual < partials.cols)) {
    throw internal_error("tp_reduce_rows: " + std::to_string(partials.ranks) + " ranks of [" +
                         std::to_string(partials.rows) + ", " + std::to_string(partials.cols) + "]");
  }
  const int64_t count = partials.rows * partials.cols;
  if (count == 0) return;
  const dim3 blocks(static_cast<unsigned>((count + 255) / 256));
  if (wire == TpWire::kBf16) {
    launch_kernel(DFLASH_KERNEL_SITE("tp_reduce_rows_kernel"), tp_reduce_rows_kernel<true>, blocks, dim3(256), 0, stream,
                  false, partials, bias, out, ld_out, residual, ld_residual);
  } else {
    launch_kernel(DFLASH_KERNEL_SITE("tp_reduce_rows_kernel"), tp_reduce_rows_kernel<false>, blocks, dim3(256), 0,
                  stream, false, partials, bias, out, ld_out, residual, ld_residual);
  }
}

}  // namespace dflash
