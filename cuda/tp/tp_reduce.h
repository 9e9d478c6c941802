// The row-parallel reduction of docs/spec/tensor-parallel.md §4 on the device, for the fake shards
// of one GPU and for the partials an NCCL all-gather brought (nccl_group.h): N partials of `count`
// elements, [N, count] in rank order, summed linearly from rank 0's in fp32
// (s = p_0; s = fl32(s + p_r) for r = 1..N-1). kBf16: each partial is bf16 bits as it travelled
// (p_r = bf16(P_r), rounded by its sender) and the sum is rounded once to bf16 at the end (stored as
// its fp32 value); kFp32: fp32 partials and sum. Deterministic: the same bits as the reference's
// Linear::set_row_parallel emulation (reference/linear.h).
#pragma once
#include <cstdint>

#include <cuda_runtime_api.h>

#include "cuda/tp/nccl_group.h"

namespace dflash {

// partials: [ranks, count] (float for kFp32, bf16 bits for kBf16); out: [count] fp32.
void launch_tp_reduce(cudaStream_t stream, const void* partials, int ranks, int64_t count, TpWire wire, float* out);

}  // namespace dflash
