// Device side of GemmEpilogue, shared by the mma kernel and the fallbacks' epilogue kernel so that
// every GEMM kernel finishes a value with the same fp32 operations.
#pragma once
#include <cuda_bf16.h>

#include <climits>
#include <cstdint>

#include "cuda/kernels/gemm/gemm.h"
#include "testing/fault_points.cuh"

namespace dflash {

struct EpilogueArgs {
  const float* scale;  // [n] or null
  const float* bias;   // [n] or null
  int64_t m, n;
  GemmEpilogue ep;
};

inline EpilogueArgs make_epilogue_args(const DeviceMatrixView& w, int64_t m, const GemmEpilogue& ep) {
  EpilogueArgs args;
  args.scale = w.format == WeightFormat::kE4M3 ? w.scale : nullptr;
  args.bias = w.bias;
  args.m = m;
  args.n = w.n;
  args.ep = ep;
  return args;
}

// (a, ia) ranks above (b, ib): NaN above every number (as torch.argmax), then the larger value,
// then the lower index. A strict total order, so any reduction tree picks the same winner.
__device__ __forceinline__ bool argmax_better(float a, int ia, float b, int ib) {
  const bool a_nan = isnan(a), b_nan = isnan(b);
  if (a_nan != b_nan) return a_nan;
  DFLASH_DEVICE_MUTATE(kArgmaxTieOrder, if (!a_nan && a == b) return ia > ib);
  if (!a_nan && a != b) return a > b;
  return ia < ib;
}

__device__ __forceinline__ void warp_argmax(float& value, int& index) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other_value = __shfl_xor_sync(0xffffffffu, value, offset);
    const int other_index = __shfl_xor_sync(0xffffffffu, index, offset);
    if (argmax_better(other_value, other_index, value, index)) {
      value = other_value;
      index = other_index;
    }
  }
}

// silu(g) = g / (1 + exp(-g)), fp32, accurate expf (no fast math).
__device__ __forceinline__ float silu(float g) { return __fdiv_rn(g, __fadd_rn(1.0f, expf(-g))); }

// What the epilogue of element (row, col) reads besides its sum. A kernel may load these early to
// hide their latency (the mma deep kernel: the weights' scale and bias before the PDL wait, the
// residual right after it); the arithmetic is the same whenever they were loaded.
struct EpilogueInputs {
  float scale = 1.0f, bias = 0.0f, residual = 0.0f, row_scale = 1.0f;
};

// The weights' part (scale, bias): no kernel of a forward writes it.
__device__ __forceinline__ void load_epilogue_constants(const EpilogueArgs& e, int64_t row, int64_t col,
                                                        EpilogueInputs& in) {
  if (row < e.m && col < e.n) {
    if (e.scale != nullptr) in.scale = e.scale[col];
    if (e.bias != nullptr) in.bias = e.bias[col];
  }
}
// The residual and W8A8's activation scale: written by earlier kernels, so read after the PDL wait;
// only this element's own epilogue writes the residual.
__device__ __forceinline__ void load_epilogue_residual(const EpilogueArgs& e, int64_t row, int64_t col,
                                                       EpilogueInputs& in) {
  if (row < e.m && col < e.n && e.ep.residual != nullptr) {
    in.residual = e.ep.residual[row * e.ep.ld_residual + col];
  }
  if (row < e.m && e.ep.row_scale != nullptr) in.row_scale = e.ep.row_scale[row];
}

// The finished value of one element: v = acc · scale (· row_scale, W8A8: vLLM's scaled-mm order) +
// bias, fp32, in that order. Every epilogue form calls this and the two below, so each element gets
// the same operations in every kernel.
__device__ __forceinline__ float epilogue_value(const EpilogueArgs& e, float acc, const EpilogueInputs& in) {
  float v = acc;
  if (e.scale != nullptr) v = __fmul_rn(v, in.scale);
  if (e.ep.row_scale != nullptr) v = __fmul_rn(in.row_scale, v);
  if (e.bias != nullptr) v = __fadd_rn(v, in.bias);
  return v;
}
__device__ __forceinline__ float residual_sum(float residual, float v) { return __fadd_rn(residual, v); }
// SwiGLU of an interleaved (gate, up) pair of finished values.
__device__ __forceinline__ __nv_bfloat16 swiglu_value(float gate, float up) {
  DFLASH_DEVICE_MUTATE(kTruncatedSwiglu, return __float2bfloat16_rz(__fmul_rn(silu(gate), up)));
  return __float2bfloat16_rn(__fmul_rn(silu(gate), up));
}

// Called by all 32 lanes of a warp for one output row; lane l holds column col_block + l, and `in`
// that column's inputs (load_epilogue_constants / load_epilogue_residual).
__device__ __forceinline__ void epilogue_warp_loaded(const EpilogueArgs& e, int64_t row, int64_t col_block, float acc,
                                                     const EpilogueInputs& in) {
  const int lane = threadIdx.x & 31;
  const int64_t col = col_block + lane;
  const bool valid = row < e.m && col < e.n;
  float v = acc;
  if (valid) {
    v = epilogue_value(e, acc, in);
    if (e.ep.out != nullptr) e.ep.out[row * e.ep.ld_out + col] = v;
    if (e.ep.residual != nullptr) e.ep.residual[row * e.ep.ld_residual + col] = residual_sum(in.residual, v);
  }
  if (e.ep.swiglu_out != nullptr) {
    const float up = __shfl_down_sync(0xffffffffu, v, 1);
    if (valid && (col & 1) == 0) {
      reinterpret_cast<__nv_bfloat16*>(e.ep.swiglu_out)[row * e.ep.ld_swiglu + col / 2] = swiglu_value(v, up);
    }
  }
  if (e.ep.argmax_value != nullptr) {
    float best = valid ? v : -INFINITY;
    int best_index = valid ? static_cast<int>(col) : INT_MAX;
    warp_argmax(best, best_index);
    if (lane == 0 && row < e.m) {
      const int64_t slot = row * e.ep.ld_argmax + col_block / kArgmaxBlock;
      e.ep.argmax_value[slot] = best;
      e.ep.argmax_index[slot] = best_index;
    }
  }
}

// epilogue_warp_loaded with its inputs loaded on the spot.
__device__ __forceinline__ void epilogue_warp(const EpilogueArgs& e, int64_t row, int64_t col_block, float acc) {
  const int64_t col = col_block + (threadIdx.x & 31);
  EpilogueInputs in;
  load_epilogue_constants(e, row, col, in);
  load_epilogue_residual(e, row, col, in);
  epilogue_warp_loaded(e, row, col_block, acc, in);
}

}  // namespace dflash
