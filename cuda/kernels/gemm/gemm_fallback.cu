// The plain GEMM (GemmKernel::kSimple) and the epilogue kernel that the fallbacks (simple and
// cuBLASLt) share: they produce unscaled fp32 sums in a scratch buffer, and this kernel finishes
// them with the same device code as the mma kernel's epilogue.
#include <cuda_bf16.h>

#include <climits>
#include <cstdint>

#include "core/error.h"
#include "cuda/runtime/cuda_check.h"
#include "cuda/kernels/gemm/gemm.h"
#include "cuda/kernels/gemm/gemm_epilogue.cuh"
#include "cuda/runtime/launch.cuh"

namespace dflash {
namespace {

// E4M3 code to float, exactly (the same decoding as core/fp8.cc's e4m3_to_float).
__device__ __forceinline__ float e4m3_to_float_device(uint8_t code) {
  const float sign = (code & 0x80) ? -1.0f : 1.0f;
  const int biased = (code >> 3) & 0xf;
  const int mantissa = code & 0x7;
  if (biased == 15 && mantissa == 7) return NAN;
  if (biased == 0) return sign * ldexpf(static_cast<float>(mantissa), -9);
  return sign * ldexpf(static_cast<float>(8 + mantissa), biased - 10);
}

// One thread per output: raw[row, col] = Σ_k a[row, k]·w[col, k] in k order, fp32.
template <bool kFp8>
__global__ void gemm_simple_kernel(const uint16_t* a, int64_t lda, int64_t m, const void* w, int64_t ldw, int64_t n,
                                   int64_t k, float* raw) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t row = blockIdx.y;
  if (col >= n || row >= m) return;
  const __nv_bfloat16* arow = reinterpret_cast<const __nv_bfloat16*>(a) + row * lda;
  float sum = 0.0f;
  if constexpr (kFp8) {
    const uint8_t* wrow = static_cast<const uint8_t*>(w) + col * ldw;
    for (int64_t i = 0; i < k; ++i) sum = __fadd_rn(sum, __fmul_rn(__bfloat162float(arow[i]), e4m3_to_float_device(wrow[i])));
  } else {
    const __nv_bfloat16* wrow = static_cast<const __nv_bfloat16*>(w) + col * ldw;
    for (int64_t i = 0; i < k; ++i) sum = __fadd_rn(sum, __fmul_rn(__bfloat162float(arow[i]), __bfloat162float(wrow[i])));
  }
  raw[row * n + col] = sum;
}

// W8A8: one thread per output, raw[row, col] = Σ_k a[row, k]·w[col, k] over E4M3 codes of both, in
// k order, fp32 (each product is exact).
__global__ void gemm_simple_e4m3_activations_kernel(const uint8_t* a, int64_t lda, int64_t m, const uint8_t* w,
                                                    int64_t ldw, int64_t n, int64_t k, float* raw) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t row = blockIdx.y;
  if (col >= n || row >= m) return;
  const uint8_t* arow = a + row * lda;
  const uint8_t* wrow = w + col * ldw;
  float sum = 0.0f;
  for (int64_t i = 0; i < k; ++i) sum = __fadd_rn(sum, __fmul_rn(e4m3_to_float_device(arow[i]), e4m3_to_float_device(wrow[i])));
  raw[row * n + col] = sum;
}

constexpr int kEpilogueWarps = 4;
// 32-column blocks per warp: their loads are issued together (the libraries' products reach this
// kernel at hundreds of MB per propose at batch 32; one block per warp left it launch-bound).
constexpr int kEpilogueBlocksPerWarp = 8;

// Each warp finishes kEpilogueBlocksPerWarp consecutive 32-column blocks of one row; every element
// gets the same operations whichever warp runs it.
__global__ void __launch_bounds__(kEpilogueWarps * 32) gemm_epilogue_kernel(const float* raw, int64_t ld_raw,
                                                                             EpilogueArgs args) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t row = blockIdx.y;
  const int64_t first_block =
      (static_cast<int64_t>(blockIdx.x) * kEpilogueWarps + threadIdx.x / 32) * kEpilogueBlocksPerWarp;
  const int lane = threadIdx.x & 31;
  float v[kEpilogueBlocksPerWarp];
#pragma unroll
  for (int i = 0; i < kEpilogueBlocksPerWarp; ++i) {
    const int64_t col = (first_block + i) * kArgmaxBlock + lane;
    v[i] = col < args.n ? raw[row * ld_raw + col] : 0.0f;
  }
#pragma unroll
  for (int i = 0; i < kEpilogueBlocksPerWarp; ++i) {
    const int64_t col_block = (first_block + i) * kArgmaxBlock;
    if (col_block >= args.n) break;  // the whole warp leaves together
    epilogue_warp(args, row, col_block, v[i]);
  }
}

// The vector form: lane l of a warp holds columns 4l..4l+3 of a 128-column segment of one row
// (16-byte loads and stores). Each thread finishes its four values with the warp form's operations;
// the SwiGLU pairs lie inside a thread, and the argmax of a 32-column block is its eight lanes' best:
// the warp form's winner under argmax_better's total order, found by the maximum and the first
// column equal to it, or, where the warp's columns hold a NaN, by that order itself. Each warp
// takes kSegments consecutive segments, their loads issued together and their shuffle rounds
// interleaved. Needs n, every leading dimension and base pointer aligned to four floats
// (vector_epilogue_fits). kAccOnly: no scale, bias or residual to read (the libraries' scaled
// products, finished by SwiGLU or the argmax partials): with only the products held in registers,
// twice the segments' loads are in flight.
constexpr int kVectorWarps = 8;
constexpr int kVectorSegments = 4;
constexpr int kVectorSegmentsAccOnly = 8;
constexpr int kVectorColumns = 128;  // per segment: 32 lanes x 4

// max(a, b), NaN if either is NaN (fmaxf would drop it).
__device__ __forceinline__ float max_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

__device__ __forceinline__ void argmax4(const float (&v)[4], int64_t col0, int64_t n, float& best, int& index) {
  best = -INFINITY;
  index = INT_MAX;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if (col0 + j < n && argmax_better(v[j], static_cast<int>(col0 + j), best, index)) {
      best = v[j];
      index = static_cast<int>(col0 + j);
    }
  }
}

template <int kSegments, bool kAccOnly>
__global__ void __launch_bounds__(kVectorWarps * 32) gemm_epilogue_vector_kernel(const float* raw, int64_t ld_raw,
                                                                                 EpilogueArgs e) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t row = blockIdx.y;
  const int lane = threadIdx.x & 31;
  const int64_t first_segment = (static_cast<int64_t>(blockIdx.x) * kVectorWarps + threadIdx.x / 32) * kSegments;
  const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f), one = make_float4(1.0f, 1.0f, 1.0f, 1.0f);
  float4 acc[kSegments], scale[kAccOnly ? 1 : kSegments], bias[kAccOnly ? 1 : kSegments],
      residual[kAccOnly ? 1 : kSegments];
  const float row_scale = !kAccOnly && e.ep.row_scale != nullptr ? e.ep.row_scale[row] : 1.0f;
#pragma unroll
  for (int s = 0; s < kSegments; ++s) {
    const int64_t col = (first_segment + s) * kVectorColumns + 4 * lane;
    const bool valid = col < e.n;  // n is a multiple of 4: all four columns or none
    acc[s] = valid ? *reinterpret_cast<const float4*>(raw + row * ld_raw + col) : zero;
    if constexpr (!kAccOnly) {
      scale[s] = valid && e.scale != nullptr ? *reinterpret_cast<const float4*>(e.scale + col) : one;
      bias[s] = valid && e.bias != nullptr ? *reinterpret_cast<const float4*>(e.bias + col) : zero;
      residual[s] = valid && e.ep.residual != nullptr
                        ? *reinterpret_cast<const float4*>(e.ep.residual + row * e.ep.ld_residual + col)
                        : zero;
    }
  }
  // Each segment's values and stores; the argmax below reads the values (-inf past n).
  float vals[kSegments][4];
#pragma unroll
  for (int s = 0; s < kSegments; ++s) {
    const int64_t col = (first_segment + s) * kVectorColumns + 4 * lane;
    const bool valid = col < e.n;
    float4 sc4 = one, bi4 = zero, re4 = zero;
    if constexpr (!kAccOnly) {
      sc4 = scale[s];
      bi4 = bias[s];
      re4 = residual[s];
    }
    const float a[4] = {acc[s].x, acc[s].y, acc[s].z, acc[s].w};
    const float sc[4] = {sc4.x, sc4.y, sc4.z, sc4.w};
    const float bi[4] = {bi4.x, bi4.y, bi4.z, bi4.w};
    const float re[4] = {re4.x, re4.y, re4.z, re4.w};
    float v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      EpilogueInputs in;
      in.scale = sc[j];
      in.bias = bi[j];
      if constexpr (!kAccOnly) in.row_scale = row_scale;
      v[j] = epilogue_value(e, a[j], in);  // with kAccOnly, e has no scale or bias: v = acc
      vals[s][j] = valid ? v[j] : -INFINITY;
    }
    if (valid) {
      if (e.ep.out != nullptr) {
        *reinterpret_cast<float4*>(e.ep.out + row * e.ep.ld_out + col) = make_float4(v[0], v[1], v[2], v[3]);
      }
      if (e.ep.residual != nullptr) {
        *reinterpret_cast<float4*>(e.ep.residual + row * e.ep.ld_residual + col) =
            make_float4(residual_sum(re[0], v[0]), residual_sum(re[1], v[1]), residual_sum(re[2], v[2]),
                        residual_sum(re[3], v[3]));
      }
      if (e.ep.swiglu_out != nullptr) {
        __nv_bfloat162 pair;
        pair.x = swiglu_value(v[0], v[1]);
        pair.y = swiglu_value(v[2], v[3]);
        *reinterpret_cast<__nv_bfloat162*>(reinterpret_cast<__nv_bfloat16*>(e.ep.swiglu_out) + row * e.ep.ld_swiglu +
                                           col / 2) = pair;
      }
    }
  }
  if (e.ep.argmax_value == nullptr) return;
  float best[kSegments];
  int index[kSegments];
  // Each 32-column block's maximum over its 8 lanes, NaN if the block holds one (max_nan).
  float top[kSegments];
#pragma unroll
  for (int s = 0; s < kSegments; ++s) top[s] = max_nan(max_nan(vals[s][0], vals[s][1]), max_nan(vals[s][2], vals[s][3]));
#pragma unroll
  for (int offset = 1; offset < static_cast<int>(kArgmaxBlock) / 4; offset <<= 1) {
#pragma unroll
    for (int s = 0; s < kSegments; ++s) top[s] = max_nan(top[s], __shfl_xor_sync(0xffffffffu, top[s], offset));
  }
  bool has_nan = false;
#pragma unroll
  for (int s = 0; s < kSegments; ++s) has_nan |= isnan(top[s]);
  if (__any_sync(0xffffffffu, has_nan)) {
    // A NaN in the warp's columns: argmax_better's total order, a thread's four values first, then
    // three xor shuffles over a block's 8 lanes (all segments' chains interleaved).
#pragma unroll
    for (int s = 0; s < kSegments; ++s) {
      argmax4(vals[s], (first_segment + s) * kVectorColumns + 4 * lane, e.n, best[s], index[s]);
    }
#pragma unroll
    for (int offset = 1; offset < static_cast<int>(kArgmaxBlock) / 4; offset <<= 1) {
#pragma unroll
      for (int s = 0; s < kSegments; ++s) {
        const float other = __shfl_xor_sync(0xffffffffu, best[s], offset);
        const int other_index = __shfl_xor_sync(0xffffffffu, index[s], offset);
        if (argmax_better(other, other_index, best[s], index[s])) {
          best[s] = other;
          index[s] = other_index;
        }
      }
    }
  } else {
    // No NaN (the common case): the same winner in fewer instructions. The block's maximum (exact
    // in any order), then its lowest column holding a value equal to it: the first of the block's
    // 8 lanes with a match (a ballot), that lane's first match. The stored value is that column's
    // own (±0 compare equal but differ in bits).
    const int group_lane = lane & ~7;
#pragma unroll
    for (int s = 0; s < kSegments; ++s) {
      const unsigned bits = (vals[s][0] == top[s] ? 1u : 0u) | (vals[s][1] == top[s] ? 2u : 0u) |
                            (vals[s][2] == top[s] ? 4u : 0u) | (vals[s][3] == top[s] ? 8u : 0u);
      const unsigned group = (__ballot_sync(0xffffffffu, bits != 0u) >> group_lane) & 0xffu;  // never 0
      int source = group_lane + __ffs(group) - 1;
      DFLASH_DEVICE_MUTATE(kArgmaxTieOrder, source = group_lane + 31 - __clz(group));
      const unsigned source_bits = __shfl_sync(0xffffffffu, bits, source);
      int bit = __ffs(source_bits) - 1;
      DFLASH_DEVICE_MUTATE(kArgmaxTieOrder, bit = 31 - __clz(source_bits));
      const float mine = bit == 0 ? vals[s][0] : bit == 1 ? vals[s][1] : bit == 2 ? vals[s][2] : vals[s][3];
      best[s] = __shfl_sync(0xffffffffu, mine, source);
      index[s] = static_cast<int>((first_segment + s) * kVectorColumns + 4 * source + bit);
    }
  }
#pragma unroll
  for (int s = 0; s < kSegments; ++s) {
    const int64_t block_col = (first_segment + s) * kVectorColumns + (lane / 8) * kArgmaxBlock;
    if (lane % 8 == 0 && block_col < e.n) {
      const int64_t slot = row * e.ep.ld_argmax + block_col / kArgmaxBlock;
      e.ep.argmax_value[slot] = best[s];
      e.ep.argmax_index[slot] = index[s];
    }
  }
}

bool aligned4(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The vector form's 16-byte accesses need every row of every operand to start on four floats.
bool vector_epilogue_fits(const float* raw, int64_t ld_raw, const EpilogueArgs& e) {
  const GemmEpilogue& ep = e.ep;
  return e.n % 4 == 0 && ld_raw % 4 == 0 && aligned4(raw) && aligned4(e.scale) && aligned4(e.bias) &&
         (ep.out == nullptr || (ep.ld_out % 4 == 0 && aligned4(ep.out))) &&
         (ep.residual == nullptr || (ep.ld_residual % 4 == 0 && aligned4(ep.residual))) &&
         (ep.swiglu_out == nullptr || (ep.ld_swiglu % 2 == 0 && reinterpret_cast<uintptr_t>(ep.swiglu_out) % 4 == 0));
}

}  // namespace

void prepare_gemm_fallback_kernels() {
  cudaFuncAttributes a;
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&a, gemm_simple_kernel<true>));
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&a, gemm_simple_kernel<false>));
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&a, gemm_epilogue_kernel));
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&a, gemm_epilogue_vector_kernel<kVectorSegments, false>));
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&a, gemm_epilogue_vector_kernel<kVectorSegmentsAccOnly, true>));
}

void launch_gemm_simple(cudaStream_t stream, const uint16_t* a, int64_t lda, int64_t m, const DeviceMatrixView& w,
                        float* raw) {
  const dim3 block(128);
  const dim3 grid(static_cast<unsigned>((w.n + 127) / 128), static_cast<unsigned>(m));
  if (w.format == WeightFormat::kE4M3) {
    gemm_simple_kernel<true><<<grid, block, 0, stream>>>(a, lda, m, w.data, w.k_pad, w.n, w.k, raw);
  } else {
    gemm_simple_kernel<false><<<grid, block, 0, stream>>>(a, lda, m, w.data, w.k_pad, w.n, w.k, raw);
  }
  DFLASH_CUDA_CHECK_LAUNCH("gemm_simple_kernel");
}

void launch_gemm_simple_e4m3_activations(cudaStream_t stream, const uint8_t* a, int64_t lda, int64_t m,
                                         const DeviceMatrixView& w, float* raw) {
  if (w.format != WeightFormat::kE4M3) throw internal_error("gemm w8a8: the weight is not E4M3");
  const dim3 block(128);
  const dim3 grid(static_cast<unsigned>((w.n + 127) / 128), static_cast<unsigned>(m));
  gemm_simple_e4m3_activations_kernel<<<grid, block, 0, stream>>>(a, lda, m, static_cast<const uint8_t*>(w.data),
                                                                   w.k_pad, w.n, w.k, raw);
  DFLASH_CUDA_CHECK_LAUNCH("gemm_simple_e4m3_activations_kernel");
}

void launch_gemm_epilogue(cudaStream_t stream, const float* raw, int64_t ld_raw, int64_t m, const DeviceMatrixView& w,
                          const GemmEpilogue& epilogue, EpilogueKernel kernel, bool pdl) {
  if (ld_raw < w.n) throw internal_error("gemm epilogue: ld_raw below n");
  const EpilogueArgs args = make_epilogue_args(w, m, epilogue);
  if (kernel == EpilogueKernel::kVector && vector_epilogue_fits(raw, ld_raw, args)) {
    const bool acc_only = args.scale == nullptr && args.bias == nullptr && epilogue.residual == nullptr &&
                          epilogue.row_scale == nullptr;
    const int64_t per_cta = kVectorWarps * (acc_only ? kVectorSegmentsAccOnly : kVectorSegments) * kVectorColumns;
    const dim3 grid(static_cast<unsigned>((w.n + per_cta - 1) / per_cta), static_cast<unsigned>(m));
    launch_kernel(DFLASH_KERNEL_SITE("gemm_epilogue_vector_kernel"),
                  acc_only ? gemm_epilogue_vector_kernel<kVectorSegmentsAccOnly, true>
                           : gemm_epilogue_vector_kernel<kVectorSegments, false>,
                  grid, dim3(kVectorWarps * 32), 0, stream, pdl, raw, ld_raw, args);
    return;
  }
  const int64_t per_cta = kEpilogueWarps * kEpilogueBlocksPerWarp;
  const dim3 grid(static_cast<unsigned>((argmax_blocks(w.n) + per_cta - 1) / per_cta), static_cast<unsigned>(m));
  launch_kernel(DFLASH_KERNEL_SITE("gemm_epilogue_kernel"), gemm_epilogue_kernel, grid, dim3(kEpilogueWarps * 32), 0, stream, pdl, raw,
                ld_raw, args);
}

DFLASH_DEVICE_MUTATION_SETTER(gemm_fallback)

}  // namespace dflash
