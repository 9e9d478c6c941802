// The row-parallel reduction of docs/spec/tensor-parallel.md §4 on the device: N partials summed
// linearly from rank 0's in fp32 (s = p_0; s = fl32(s + p_r) for r = 1..N-1). kBf16: each partial is
// bf16 as it travels (p_r = bf16(P_r)) and the sum is rounded once to bf16 at the end (stored as its
// fp32 value); kFp32: fp32 partials and sum. Deterministic: the same bits as the reference's
// Linear::set_row_parallel emulation (reference/linear.h).
#pragma once
#include <cstdint>

#include <cuda_runtime_api.h>

namespace dflash {

enum class TpWire { kFp32, kBf16 };  // a partial as it travels (§4: tp_reduce_dtype)

// The partials as an NCCL all-gather brings them (nccl_group.h): [ranks, count], float for kFp32,
// bf16 bits (rounded by their senders) for kBf16; out: [count] fp32.
void launch_tp_reduce(cudaStream_t stream, const void* partials, int ranks, int64_t count, TpWire wire, float* out);

// The fake shards of one device (the CUDA drafter at TP = N): rank r's fp32 GEMM output, [rows,
// cols] with leading dimension ld, at partials + r·rank_stride (rounded to bf16 here for kBf16, as
// its sender would), then the rest of §4:
//   o = fl32(R + bias[c])  (bias may be null: o = R);  out[m, c] = o;  residual[m, c] = fl32(residual + o)
// (residual may be null). out and residual have the leading dimensions ld_out and ld_residual.
struct TpPartials {
  const float* base = nullptr;
  int64_t rank_stride = 0;  // elements from one rank's partial to the next
  int ranks = 0;
  int64_t rows = 0, cols = 0, ld = 0;
};
void launch_tp_reduce_rows(cudaStream_t stream, const TpPartials& partials, TpWire wire, const float* bias, float* out,
                           int64_t ld_out, float* residual, int64_t ld_residual);

}  // namespace dflash
