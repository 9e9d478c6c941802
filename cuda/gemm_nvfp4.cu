// The NVFP4 lm_head GEMM (gemm_nvfp4.h).
//
// Work split. A CTA of 8 warps owns 128 consecutive weight rows (output columns) and 16 activation
// rows (grid.y walks the rows in 16s); each warp owns 16 weight rows as two n8 tiles. K is walked
// in slabs of 1024: the CTA copies the slab's 16 activation rows into shared memory, then each warp
// streams its weight rows' codes and block scales for the slab straight into registers (16-byte
// loads, each weight byte read once) and runs mma.sync m16n8k16 on them.
//
// Fragment layout. A reduction may visit k in any order as long as A and B agree, so each thread
// takes the k its own 16-byte code load holds: in a 512-column chunk, thread (g = lane / 4,
// t = lane % 4) loads, for i = 0..3, bytes 64i + 16t .. +15 of weight row g: codes
// k = 128i + 32t + [0, 32), blocks 8i + 2t and 8i + 2t + 1. Each 4-byte word w of that load holds
// codes k0 = 128i + 32t + 8w .. k0 + 7, which feed two mma k-steps; in the step of bytes (2p, 2p+1)
// the thread's B pair (2t, 2t+1) is codes k0 + 4p + {0, 1} and its pair (2t+8, 2t+9) is
// k0 + 4p + {2, 3}; its A registers take the same columns of activation rows g and g+8. The k
// order of every output element is therefore fixed by the weight's shape alone: batch invariant.
//
// Decode. prmt looks each 3-bit magnitude up in two byte tables (the high and low byte of its bf16
// value), the sign bit is moved to bit 15 of its half, and one bf16x2 multiply by the block scale
// (E4M3 -> bf16 with gemm_tiles' exact decode) gives e2m1 · e4m3 exactly (products lie in
// [2^-10, 2688], normal in bf16).
#include "cuda/gemm_nvfp4.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda/cuda_check.h"
#include "cuda/gemm_epilogue.cuh"
#include "cuda/gemm_tiles.cuh"
#include "cuda/launch.cuh"

namespace dflash {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kTilesPerWarp = 2;                         // n8 tiles
constexpr int kColumnsPerCta = kWarps * kTilesPerWarp * 8;  // 128
constexpr int kRows = 16;                                // activation rows per CTA (one m16 tile)
constexpr int kSlab = 1024;                              // K per shared-memory slab
constexpr int kSlabUnits = kSlab / 8;                    // 16-byte units of one activation row
constexpr int kChunk = static_cast<int>(kNvFp4KChunk);   // 512
static_assert(kSlab % kChunk == 0, "a slab holds whole chunks");
// The epilogue's staging of the CTA's [16, 128] sums (over the activation slab, after a barrier).
constexpr int kStageStride = kColumnsPerCta + 4;
static_assert(kRows * kStageStride * 4 <= kRows * kSlab * 2, "the staging fits in the slab's memory");

// E2M1 magnitudes 0..7 as bf16: high bytes 00 3F 3F 3F 40 40 40 40, low bytes 00 00 80 C0 00 40 80 C0.
constexpr uint32_t kHighBytes0 = 0x3F3F3F00u, kHighBytes1 = 0x40404040u;
constexpr uint32_t kLowBytes0 = 0xC0800000u, kLowBytes1 = 0xC0804000u;

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t selector) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(selector));
  return r;
}

// Four E2M1 codes (bits 0-15: code j in bits 4j..4j+3) to two bf16x2 (codes 0, 1 and codes 2, 3;
// the lower code in the low half), times the bf16x2 block scale `scale2` (the scale in both halves).
__device__ __forceinline__ void e2m1x4_to_bf16(uint32_t codes, uint32_t scale2, uint32_t& b01, uint32_t& b23) {
  const uint32_t selector = codes & 0x7777u;  // magnitudes; the 8 bit (prmt's sign mode) cleared
  const uint32_t high = prmt(kHighBytes0, kHighBytes1, selector);
  const uint32_t low = prmt(kLowBytes0, kLowBytes1, selector);
  const uint32_t v01 = prmt(low, high, 0x5140u) | ((codes << 12) & 0x8000u) | ((codes << 24) & 0x80000000u);
  const uint32_t v23 = prmt(low, high, 0x7362u) | ((codes << 4) & 0x8000u) | ((codes << 16) & 0x80000000u);
  __nv_bfloat162 s, x;
  *reinterpret_cast<uint32_t*>(&s) = scale2;
  *reinterpret_cast<uint32_t*>(&x) = v01;
  const __nv_bfloat162 r01 = __hmul2(x, s);
  *reinterpret_cast<uint32_t*>(&x) = v23;
  const __nv_bfloat162 r23 = __hmul2(x, s);
  b01 = *reinterpret_cast<const uint32_t*>(&r01);
  b23 = *reinterpret_cast<const uint32_t*>(&r23);
}

// The 16-byte unit `unit` of activation row `row` in the slab, swizzled so that the 8 lanes of a
// quarter warp (rows g, g+1; t = 0..3; one word w) hit 8 different bank groups.
__device__ __forceinline__ int slab_unit(int row, int unit) {
  return row * kSlabUnits + (unit ^ (((unit >> 3) & 1) | ((row & 1) << 1)));
}

__device__ __forceinline__ uint4 load_stream(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__global__ void __launch_bounds__(kThreads, 2)
    gemm_nvfp4_kernel(const uint16_t* __restrict__ a, int64_t lda, int64_t m, DeviceNvFp4View w, EpilogueArgs e) {
  __shared__ uint4 slab[kRows * kSlabUnits];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kRows;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kColumnsPerCta;
  const int64_t code_stride = w.k_pad / 2, scale_stride = w.k_pad / 16;

  // This thread's weight rows (clamped past n: read, never stored).
  const uint8_t* codes[kTilesPerWarp];
  const uint8_t* scales[kTilesPerWarp];
#pragma unroll
  for (int j = 0; j < kTilesPerWarp; ++j) {
    int64_t row = n0 + warp * (kTilesPerWarp * 8) + j * 8 + g;
    if (row >= w.n) row = w.n - 1;
    codes[j] = w.codes + row * code_stride + 16 * t;
    scales[j] = w.block_scales + row * scale_stride;
  }

  float acc[kTilesPerWarp][4] = {};
  pdl_wait();  // the activations come from the previous kernel
  for (int64_t s0 = 0; s0 < w.k_pad; s0 += kSlab) {
    const int slab_k = w.k_pad - s0 < kSlab ? static_cast<int>(w.k_pad - s0) : kSlab;
    __syncthreads();  // the previous slab's readers are done
    for (int x = threadIdx.x; x < kRows * kSlabUnits; x += kThreads) {
      const int row = x / kSlabUnits, unit = x % kSlabUnits;
      const int64_t k = s0 + 8 * unit;
      uint4 v = make_uint4(0, 0, 0, 0);
      // K is a multiple of 16, so a unit starting below k lies whole inside it.
      if (m0 + row < m && k < w.k) v = *reinterpret_cast<const uint4*>(a + (m0 + row) * lda + k);
      slab[slab_unit(row, unit)] = v;
    }
    __syncthreads();

    for (int c = 0; c < slab_k / kChunk; ++c) {
      const int64_t chunk_k = s0 + static_cast<int64_t>(c) * kChunk;
      uint4 q[kTilesPerWarp][4], sc[kTilesPerWarp][2];
#pragma unroll
      for (int j = 0; j < kTilesPerWarp; ++j) {
#pragma unroll
        for (int i = 0; i < 4; ++i) q[j][i] = load_stream(codes[j] + chunk_k / 2 + 64 * i);
        // The chunk's 32 block scales of the row; every lane of the row reads the same 32 bytes.
        sc[j][0] = __ldg(reinterpret_cast<const uint4*>(scales[j] + chunk_k / 16));
        sc[j][1] = __ldg(reinterpret_cast<const uint4*>(scales[j] + chunk_k / 16 + 16));
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        // Blocks 8i + 2t and 8i + 2t + 1: halfword 4i + t of the 32 scale bytes.
        uint32_t scale_pair[kTilesPerWarp];
#pragma unroll
        for (int j = 0; j < kTilesPerWarp; ++j) {
          const uint4 half = sc[j][i >> 1];
          const uint32_t word = (i & 1) ? ((t >> 1) ? half.w : half.z) : ((t >> 1) ? half.y : half.x);
          const uint32_t pair = (word >> (16 * (t & 1))) & 0xFFFFu;
          scale_pair[j] = gemm_tiles::e4m3x2_to_bf16x2(pair, gemm_tiles::kCodes01);  // low half: block 8i+2t
        }
#pragma unroll
        for (int wd = 0; wd < 4; ++wd) {
          const int unit = c * (kChunk / 8) + 16 * i + 4 * t + wd;
          const uint4 lo = slab[slab_unit(g, unit)];
          const uint4 hi = slab[slab_unit(g + 8, unit)];
#pragma unroll
          for (int j = 0; j < kTilesPerWarp; ++j) {
            const uint32_t word = gemm_tiles::word_of(q[j][i], wd);
            // Words 0, 1 lie in the first block of the thread's 32 codes, words 2, 3 in the second.
            const uint32_t scale2 = __byte_perm(scale_pair[j], 0, wd < 2 ? 0x1010u : 0x3232u);
            uint32_t b01, b23;
            e2m1x4_to_bf16(word & 0xFFFFu, scale2, b01, b23);
            gemm_tiles::mma_bf16_16816(acc[j], lo.x, hi.x, lo.y, hi.y, b01, b23);
            e2m1x4_to_bf16(word >> 16, scale2, b01, b23);
            gemm_tiles::mma_bf16_16816(acc[j], lo.z, hi.z, lo.w, hi.w, b01, b23);
          }
        }
      }
    }
  }
  pdl_launch_dependents();

  // Stage the sums as [row][column] so that a warp finishes 32 adjacent columns of one row at once.
  __syncthreads();
  float* stage = reinterpret_cast<float*>(slab);
#pragma unroll
  for (int j = 0; j < kTilesPerWarp; ++j) {
    const int col = warp * (kTilesPerWarp * 8) + j * 8 + 2 * t;
    stage[g * kStageStride + col] = acc[j][0];
    stage[g * kStageStride + col + 1] = acc[j][1];
    stage[(g + 8) * kStageStride + col] = acc[j][2];
    stage[(g + 8) * kStageStride + col + 1] = acc[j][3];
  }
  __syncthreads();
  constexpr int kBlocks = kColumnsPerCta / static_cast<int>(kArgmaxBlock);
  for (int item = warp; item < kRows * kBlocks; item += kWarps) {
    const int row = item / kBlocks, block = item % kBlocks;
    // A column block wholly past n stores nothing (its argmax partial would land in the next
    // row's first slot). Uniform per warp.
    if (n0 + block * kArgmaxBlock >= w.n) continue;
    const float sum = stage[row * kStageStride + block * static_cast<int>(kArgmaxBlock) + lane];
    // The global scale, once per finished sum (a multiplier, never a divisor).
    epilogue_warp(e, m0 + row, n0 + block * kArgmaxBlock, __fmul_rn(sum, w.global_scale));
  }
}

}  // namespace

DeviceNvFp4View DeviceNvFp4Linear::view() const {
  DeviceNvFp4View v;
  v.n = n;
  v.k = k;
  v.k_pad = k_pad;
  v.codes = codes.get();
  v.block_scales = block_scales.get();
  v.global_scale = global_scale;
  return v;
}

DeviceNvFp4Linear upload_nvfp4(const NvFp4Weight& w) {
  validate_nvfp4_head(w, w.rows, w.cols, "upload_nvfp4");
  DeviceNvFp4Linear d;
  d.n = w.rows;
  d.k = w.cols;
  d.k_pad = nvfp4_pad_k(w.cols);
  d.global_scale = w.global_scale;
  const int64_t code_row = w.cols / 2, code_row_pad = d.k_pad / 2;
  const int64_t scale_row = w.cols / kNvFp4GroupSize, scale_row_pad = d.k_pad / kNvFp4GroupSize;
  std::vector<uint8_t> codes(static_cast<size_t>(d.n * code_row_pad), 0), scales(static_cast<size_t>(d.n * scale_row_pad), 0);
  for (int64_t r = 0; r < d.n; ++r) {
    std::copy(w.codes.begin() + r * code_row, w.codes.begin() + (r + 1) * code_row, codes.begin() + r * code_row_pad);
    std::copy(w.block_scales.begin() + r * scale_row, w.block_scales.begin() + (r + 1) * scale_row,
              scales.begin() + r * scale_row_pad);
  }
  d.codes.allocate(codes.size());
  d.block_scales.allocate(scales.size());
  DFLASH_CUDA_CHECK(cudaMemcpy(d.codes.get(), codes.data(), codes.size(), cudaMemcpyHostToDevice));
  DFLASH_CUDA_CHECK(cudaMemcpy(d.block_scales.get(), scales.data(), scales.size(), cudaMemcpyHostToDevice));
  return d;
}

void launch_gemm_nvfp4(cudaStream_t stream, bool pdl, const uint16_t* a, int64_t lda, int64_t m,
                       const DeviceNvFp4View& w, const GemmEpilogue& epilogue) {
  if (m < 1 || w.n < 1 || w.k < 1 || w.k % kNvFp4GroupSize != 0 || w.k_pad != nvfp4_pad_k(w.k) || lda < w.k ||
      lda % 8 != 0 || reinterpret_cast<uintptr_t>(a) % 16 != 0 || w.codes == nullptr || w.block_scales == nullptr) {
    throw internal_error("gemm nvfp4: operands do not fit (m " + std::to_string(m) + ", n " + std::to_string(w.n) +
                         ", k " + std::to_string(w.k) + ", k_pad " + std::to_string(w.k_pad) + ", lda " +
                         std::to_string(lda) + ")");
  }
  const int64_t row_tiles = (m + kRows - 1) / kRows;
  if (row_tiles > 65535) throw internal_error("gemm nvfp4: " + std::to_string(m) + " rows exceed the grid");
  EpilogueArgs args;
  args.scale = nullptr;
  args.bias = nullptr;
  args.m = m;
  args.n = w.n;
  args.ep = epilogue;
  const dim3 grid(static_cast<unsigned>((w.n + kColumnsPerCta - 1) / kColumnsPerCta), static_cast<unsigned>(row_tiles));
  launch_kernel("gemm_nvfp4_kernel", gemm_nvfp4_kernel, grid, dim3(kThreads), 0, stream, pdl, a, lda, m, w, args);
}

}  // namespace dflash
