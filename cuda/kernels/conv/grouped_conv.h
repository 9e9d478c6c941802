// DFlash2's grouped dynamic convolution on the device (docs/spec/dflash2.md §3.1), over the block
// rows of each sequence: out[t, ch] = Σ_{τ ≤ min(k-1, t)} (base[side, τ, ch] + c[t, side, τ, ch / G])
// · z[t-τ, ch], with t the row inside its own sequence's block of B rows (row mod B), so a tap never
// reads a row of another sequence nor a context row. The coefficients are the kernel_projection
// GEMM's fp32 outputs, rounded to bf16 where they are read (the stored precision of the "conv_coef"
// stage). One thread per output element (sequence, row, channel): fixed order, no atomics.
#pragma once
#include <cstdint>

#include <cuda_runtime_api.h>

namespace dflash {

struct GroupedConvArgs {
  int taps = 0;          // k
  int group_size = 0;    // G
  int64_t channels = 0;  // H
  int block_width = 0;   // B, the propose's width: the convolution's block
  int batch = 0;         // sequences; rows = batch·B
  const float* base = nullptr;  // [2, k, H]: [side, tap, channel] (bf16 values)
  const float* coef = nullptr;  // [rows, ld_coef]: column side·k·ng + τ·ng + group
  int64_t ld_coef = 0;
};

// prepare (side 0): x <- conv_0(x) in place, x bf16 [rows, ld_x] (the q|k|v or gate|up GEMM's input).
void launch_conv_prepare(const GroupedConvArgs& args, uint16_t* x, int64_t ld_x, cudaStream_t stream, bool pdl);

// finish (side 1): residual += conv_1(z), z fp32 [rows, ld_z] (the o or down GEMM's output), the
// residual stream [rows, ld_z]; the convolution's output also goes to tap_out ([rows, ld_z]) unless
// it is null.
void launch_conv_finish(const GroupedConvArgs& args, const float* z, int64_t ld_z, float* residual, float* tap_out,
                        cudaStream_t stream, bool pdl);

void prepare_grouped_conv_kernels();

}  // namespace dflash
