#include "cuda/tp/tp_reduce.h"

#include <cuda_bf16.h>

#include <string>

#include "core/error.h"
#include "cuda/runtime/cuda_check.h"

namespace dflash {
namespace {

template <bool kBf16>
__global__ void tp_reduce_kernel(const void* partials, int ranks, int64_t count, float* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  float s;
  if constexpr (kBf16) {
    const __nv_bfloat16* p = static_cast<const __nv_bfloat16*>(partials);
    s = __bfloat162float(p[i]);
    for (int r = 1; r < ranks; ++r) s = __fadd_rn(s, __bfloat162float(p[r * count + i]));
    s = __bfloat162float(__float2bfloat16_rn(s));  // R = bf16(s): one rounding of the sum
  } else {
    const float* p = static_cast<const float*>(partials);
    s = p[i];
    for (int r = 1; r < ranks; ++r) s = __fadd_rn(s, p[r * count + i]);
  }
  out[i] = s;
}

}  // namespace

void launch_tp_reduce(cudaStream_t stream, const void* partials, int ranks, int64_t count, TpWire wire, float* out) {
  if (ranks < 1 || count < 0) {
    throw internal_error("tp_reduce: " + std::to_string(ranks) + " ranks of " + std::to_string(count) + " elements");
  }
  if (count == 0) return;
  const unsigned blocks = static_cast<unsigned>((count + 255) / 256);
  if (wire == TpWire::kBf16) {
    tp_reduce_kernel<true><<<blocks, 256, 0, stream>>>(partials, ranks, count, out);
  } else {
    tp_reduce_kernel<false><<<blocks, 256, 0, stream>>>(partials, ranks, count, out);
  }
  DFLASH_CUDA_CHECK_LAUNCH("tp_reduce_kernel");
}

}  // namespace dflash
