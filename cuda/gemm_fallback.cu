// The plain GEMM (GemmKernel::kSimple) and the epilogue kernel that the fallbacks (simple and
// cuBLASLt) share: they produce unscaled fp32 sums in a scratch buffer, and this kernel finishes
// them with the same device code as the mma kernel's epilogue.
#include <cuda_bf16.h>

#include <cstdint>

#include "core/error.h"
#include "cuda/cuda_check.h"
#include "cuda/gemm.h"
#include "cuda/gemm_epilogue.cuh"

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

constexpr int kEpilogueWarps = 4;
// 32-column blocks per warp: their loads are issued together (the libraries' products reach this
// kernel at hundreds of MB per propose at batch 32; one block per warp left it launch-bound).
constexpr int kEpilogueBlocksPerWarp = 8;

// Each warp finishes kEpilogueBlocksPerWarp consecutive 32-column blocks of one row; every element
// gets the same operations whichever warp runs it.
__global__ void __launch_bounds__(kEpilogueWarps * 32) gemm_epilogue_kernel(const float* raw, int64_t ld_raw,
                                                                             EpilogueArgs args) {
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

}  // namespace

void prepare_gemm_fallback_kernels() {
  cudaFuncAttributes a;
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&a, gemm_simple_kernel<true>));
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&a, gemm_simple_kernel<false>));
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&a, gemm_epilogue_kernel));
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

void launch_gemm_epilogue(cudaStream_t stream, const float* raw, int64_t ld_raw, int64_t m, const DeviceMatrixView& w,
                          const GemmEpilogue& epilogue) {
  if (ld_raw < w.n) throw internal_error("gemm epilogue: ld_raw below n");
  const EpilogueArgs args = make_epilogue_args(w, m, epilogue);
  const int64_t per_cta = kEpilogueWarps * kEpilogueBlocksPerWarp;
  const dim3 grid(static_cast<unsigned>((argmax_blocks(w.n) + per_cta - 1) / per_cta), static_cast<unsigned>(m));
  gemm_epilogue_kernel<<<grid, kEpilogueWarps * 32, 0, stream>>>(raw, ld_raw, args);
  DFLASH_CUDA_CHECK_LAUNCH("gemm_epilogue_kernel");
}

}  // namespace dflash
