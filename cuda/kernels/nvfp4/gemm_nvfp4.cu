// The NVFP4 lm_head GEMM (gemm_nvfp4.h).
//
// Work split. A CTA of 8 warps owns 128 consecutive weight rows (output columns) and MT·16
// activation rows (MT = 1 m16 tile up to m = 32, 4 beyond). The row tiles are grid.x, so the CTAs
// of one column tile are dispatched together and walk K side by side, the later ones finding the
// weight chunks in L2 (docs/benchmarks.md: a few percent from 32 rows on). Each warp owns
// 16 weight rows as two n8 tiles. K is walked in chunks of 512: each warp loads its weight rows'
// codes and block scales for the chunk into registers (16-byte loads, each weight byte read once;
// three CTAs per SM keep enough bytes in flight), and the CTA double-buffers the chunk's
// activations in shared memory with cp.async (laid out as mma A fragments, fragment_unit), one
// barrier per chunk.
//
// Fragment layout. A reduction may visit k in any order as long as A and B agree, so each thread
// takes the k its own 16-byte code load holds: in a 512-column chunk, thread (g = lane / 4,
// t = lane % 4) loads, for i = 0..3, bytes 64i + 16t .. +15 of weight row g: codes
// k = 128i + 32t + [0, 32), blocks 8i + 2t and 8i + 2t + 1. Each 4-byte word w of that load holds
// codes k0 = 128i + 32t + 8w .. k0 + 7, which feed two mma k-steps: codes k0 + 4p + {0, 1} and
// k0 + 4p + {2, 3} are the thread's B pairs (2t, 2t+1) and (2t+8, 2t+9) in step p, and its A
// registers take the same columns of activation rows g and g+8. The k order of every output
// element is fixed by the weight's shape alone, whatever MT: batch invariant.
//
// Decode. The device layout (nvfp4_layout.h) re-packs each code word so that every code comes out
// as bf16 bits worth its E2M1 value times 2^-126 with one to five integer instructions per two
// codes. One bf16x2 multiply by the block scale times 2^119 then gives e2m1 · e4m3 · 2^-7 exactly
// (e2m1 · e4m3 has at most 6 significant bits and lies in [2^-10, 2688], so the product is a normal
// bf16); the finished fp32 sum is multiplied back by 2^7 (exact) before the global scale. Scaling
// every product by a power of two changes no bit of the sum unless a partial sum underflows.
#include "cuda/kernels/nvfp4/gemm_nvfp4.h"

#include <cuda_bf16.h>

#include <mutex>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda/runtime/cuda_check.h"
#include "cuda/kernels/gemm/gemm_epilogue.cuh"
#include "cuda/kernels/gemm/gemm_tiles.cuh"
#include "cuda/runtime/launch.cuh"
#include "cuda/kernels/nvfp4/nvfp4_layout.h"

namespace dflash {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kTilesPerWarp = 2;                            // n8 tiles
constexpr int kColumnsPerCta = kWarps * kTilesPerWarp * 8;  // 128
constexpr int kChunk = static_cast<int>(kNvFp4KChunk);      // 512
constexpr int kStageStride = kColumnsPerCta + 4;            // the epilogue's staging row, in floats

// The 8 codes of a packed word (nvfp4_layout.h) as four bf16x2 (codes 2r, 2r+1; the lower code in
// the low half), each times `scale2` (the block scale · 2^119 in both halves): e2m1 · e4m3 · 2^-7.
__device__ __forceinline__ void decode_word(uint32_t w, uint32_t scale2, uint32_t (&r)[4]) {
  uint32_t raw[4];
  nvfp4_unpack_word(w, raw);
  __nv_bfloat162 s;
  *reinterpret_cast<uint32_t*>(&s) = scale2;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    __nv_bfloat162 x;
    *reinterpret_cast<uint32_t*>(&x) = raw[i];
    const __nv_bfloat162 p = __hmul2(x, s);
    r[i] = *reinterpret_cast<const uint32_t*>(&p);
  }
}

// A chunk buffer holds the activations as mma A fragments: row pair rp (rows 16(rp / 8) + rp % 8
// and that + 8) and column quad q (k = 4q .. 4q+3 of the chunk) form one 16-byte unit, words
// {row, k 0-1}, {row + 8, k 0-1}, {row, k 2-3}, {row + 8, k 2-3}: one shared load is the four A
// registers of one mma, in order. Two units of padding per 8 quads and one per row pair put the 8
// lanes of a quarter warp (rp, rp + 1; quads q0 + 8t) on 8 different bank groups, and keep each
// thread's addresses a base plus constants.
constexpr int kQuads = kChunk / 4;
constexpr int kPairStride = kQuads + 2 * (kQuads / 8) + 1;  // units per row pair
__host__ __device__ constexpr int fragment_unit(int rp, int q) { return rp * kPairStride + q + 2 * (q >> 3); }

// Weights are read once: not kept in L1.
__device__ __forceinline__ uint4 load_stream(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ uint2 load_stream8(const uint8_t* p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}

// One chunk of this thread's weights: codes of its two rows, and their 8 block scales each.
struct ChunkWeights {
  uint4 codes[kTilesPerWarp][4];
  uint2 scales[kTilesPerWarp];
};

template <int MT>
constexpr size_t smem_bytes() {
  return static_cast<size_t>(2) * MT * 8 * kPairStride * 16;
}

template <int MT>
__global__ void __launch_bounds__(kThreads, MT == 1 ? 3 : 1)
    gemm_nvfp4_kernel(const uint16_t* __restrict__ a, int64_t lda, int64_t m, DeviceNvFp4View w, EpilogueArgs e) {
  extern __shared__ uint4 smem[];  // two chunk buffers of MT·16 activation rows
  constexpr int kRows = MT * 16;
  constexpr int kBufferUnits = MT * 8 * kPairStride;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kColumnsPerCta;
  const int64_t code_stride = w.k_pad / 2, scale_stride = w.k_pad / 16;
  const int chunks = static_cast<int>(w.k_pad / kChunk);

  // This thread's weight rows (clamped past n: read, never stored).
  const uint8_t* codes[kTilesPerWarp];
  const uint8_t* scales[kTilesPerWarp];
#pragma unroll
  for (int j = 0; j < kTilesPerWarp; ++j) {
    int64_t row = n0 + warp * (kTilesPerWarp * 8) + j * 8 + g;
    if (row >= w.n) row = w.n - 1;
    codes[j] = w.codes + row * code_stride + 16 * t;
    scales[j] = w.block_scales + row * scale_stride + 8 * t;
  }
  auto load_chunk = [&](int c, ChunkWeights& cw) {
#pragma unroll
    for (int j = 0; j < kTilesPerWarp; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) cw.codes[j][i] = load_stream(codes[j] + c * (kChunk / 2) + 64 * i);
      cw.scales[j] = load_stream8(scales[j] + c * (kChunk / 16));
    }
  };
  // The activation copy: the CTA's MT·8·kQuads units of 4 words are 16·MT words per thread. Thread
  // x copies word s = x % 4 of quad q0 = x / 4 and q0 + 64 of every row pair, so that its
  // addresses are a base plus constants.
  const int word_s = threadIdx.x & 3, q0 = threadIdx.x >> 2;
  const int row_s = (word_s & 1) * 8, col_s = 4 * q0 + (word_s >> 1) * 2;
  const uint16_t* const a_thread = a + (m0 + row_s) * lda + col_s;
  const int unit_thread = fragment_unit(0, q0);
  static_assert(kThreads * 16 == 8 * kQuads * 4, "16 words per thread and m16 tile");
  static_assert(8 * MT <= 32, "one bit per row pair");
  // Bit rp: the thread's row of row pair rp is below m. Computed once, so that a copy costs a bit
  // test; an invalid copy reads nothing (zero-filled) whatever its address.
  uint32_t row_mask = 0;
#pragma unroll
  for (int rp = 0; rp < 8 * MT; ++rp) {
    if (m0 + row_s + (rp >> 3) * 16 + (rp & 7) < m) row_mask |= 1u << rp;
  }
  auto copy_activations = [&](int c, uint4* buffer) {
    uint32_t* const words = reinterpret_cast<uint32_t*>(buffer) + 4 * unit_thread + word_s;
    // K is a multiple of 16, so a pair starting below k lies whole inside it.
    const int64_t k0 = static_cast<int64_t>(c) * kChunk + col_s;
    const uint32_t valid_rows[2] = {k0 < w.k ? row_mask : 0u, k0 + 256 < w.k ? row_mask : 0u};
    const uint16_t* src = a_thread + static_cast<int64_t>(c) * kChunk;  // row pair rp's row
#pragma unroll
    for (int rp = 0; rp < 8 * MT; ++rp) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {  // quads q0 and q0 + 64
        gemm_tiles::cp_async_4_if(words + 4 * (rp * kPairStride + 80 * half), src + 256 * half,
                                  valid_rows[half] & (1u << rp));
      }
      src += ((rp & 7) == 7 ? 9 : 1) * lda;  // rows 0..7, then 16..23, ...
    }
    gemm_tiles::cp_async_commit();
  };
  // The weights never depend on the previous kernel: their first chunk is fetched before the wait.
  ChunkWeights cur;
  load_chunk(0, cur);
  float acc[MT][kTilesPerWarp][4] = {};
  pdl_wait();  // the activations come from the previous kernel
  copy_activations(0, smem);
  for (int c = 0; c < chunks; ++c) {
    if (c > 0) load_chunk(c, cur);
    gemm_tiles::cp_async_wait<0>();
    __syncthreads();  // chunk c's activations are in; chunk c-1's buffer has no readers left
    if (c + 1 < chunks) copy_activations(c + 1, smem + ((c + 1) & 1) * kBufferUnits);
    // Unit fragment_unit(8mt + g, 32i + 8t + 2wd) is the lane's base plus 8mt·kPairStride + 40i + 2wd.
    const uint4* lane_units = smem + (c & 1) * kBufferUnits + fragment_unit(g, 8 * t);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      // Blocks 8i + 2t and 8i + 2t + 1 (words 0, 1 and words 2, 3 of the thread's 32 codes), times
      // 2^119, each in both halves.
      uint32_t scale2[kTilesPerWarp][2];
#pragma unroll
      for (int j = 0; j < kTilesPerWarp; ++j) {
        const uint32_t word = i < 2 ? cur.scales[j].x : cur.scales[j].y;
        const uint32_t pair = gemm_tiles::e4m3x2_to_bf16x2(word, (i & 1) ? gemm_tiles::kCodes23 : gemm_tiles::kCodes01);
        __nv_bfloat162 p;
        *reinterpret_cast<uint32_t*>(&p) = pair;
        p = __hmul2(p, __floats2bfloat162_rn(0x1p119f, 0x1p119f));
        const uint32_t scaled = *reinterpret_cast<const uint32_t*>(&p);
        scale2[j][0] = __byte_perm(scaled, 0, 0x1010u);
        scale2[j][1] = __byte_perm(scaled, 0, 0x3232u);
      }
#pragma unroll
      for (int wd = 0; wd < 4; ++wd) {
        // Quads 32i + 8t + 2wd + {0, 1}: codes k0 + {0..3} and k0 + {4..7}.
        uint4 f0[MT], f1[MT];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          const int unit = 8 * mt * kPairStride + 40 * i + 2 * wd;
          f0[mt] = lane_units[unit];
          f1[mt] = lane_units[unit + 1];
        }
#pragma unroll
        for (int j = 0; j < kTilesPerWarp; ++j) {
          uint32_t b[4];
          decode_word(gemm_tiles::word_of(cur.codes[j][i], wd), scale2[j][wd >> 1], b);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            gemm_tiles::mma_bf16_16816(acc[mt][j], f0[mt].x, f0[mt].y, f0[mt].z, f0[mt].w, b[0], b[1]);
            gemm_tiles::mma_bf16_16816(acc[mt][j], f1[mt].x, f1[mt].y, f1[mt].z, f1[mt].w, b[2], b[3]);
          }
        }
      }
    }
  }
  pdl_launch_dependents();

  // Stage the sums as [row][column] so that a warp finishes 32 adjacent columns of one row at once.
  __syncthreads();  // every warp is done with the chunk buffers
  float* stage = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int j = 0; j < kTilesPerWarp; ++j) {
      const int col = warp * (kTilesPerWarp * 8) + j * 8 + 2 * t;
      const int row = 16 * mt + g;
      stage[row * kStageStride + col] = acc[mt][j][0];
      stage[row * kStageStride + col + 1] = acc[mt][j][1];
      stage[(row + 8) * kStageStride + col] = acc[mt][j][2];
      stage[(row + 8) * kStageStride + col + 1] = acc[mt][j][3];
    }
  }
  __syncthreads();
  constexpr int kBlocks = kColumnsPerCta / static_cast<int>(kArgmaxBlock);
  for (int item = warp; item < kRows * kBlocks; item += kWarps) {
    const int row = item / kBlocks, block = item % kBlocks;
    // Rows past m and a column block wholly past n store nothing (the block's argmax partial would
    // land in the next row's first slot). Uniform per warp.
    if (m0 + row >= m || n0 + block * kArgmaxBlock >= w.n) continue;
    const float sum = stage[row * kStageStride + block * static_cast<int>(kArgmaxBlock) + lane];
    // Undo the decode's 2^-7 (exact), then the global scale, once per finished sum (a multiplier,
    // never a divisor).
    epilogue_warp(e, m0 + row, n0 + block * kArgmaxBlock, __fmul_rn(__fmul_rn(sum, 0x1p7f), w.global_scale));
  }
}
static_assert(kStageStride * 16 * 4 <= smem_bytes<1>(), "the staging fits in the chunk buffers");
static_assert(fragment_unit(0, kQuads - 1) < kPairStride, "a row pair's quads fit its stride");
constexpr bool lane_offsets_are_constants() {
  for (int t = 0; t < 4; ++t)
    for (int i = 0; i < 4; ++i)
      for (int wd = 0; wd < 4; ++wd)
        if (fragment_unit(0, 32 * i + 8 * t + 2 * wd) != fragment_unit(0, 8 * t) + 40 * i + 2 * wd) return false;
  return true;
}
static_assert(lane_offsets_are_constants(), "the lane's shared loads are its base plus constants");
static_assert(fragment_unit(0, 64) - fragment_unit(0, 0) == 80 && kQuads == 128, "the copy's offset of quad q0 + 64");

// Once per instantiation and process, before its first launch (prepare_nvfp4_kernels runs them at
// upload, outside any graph capture).
template <int MT>
void prepare() {
  static std::once_flag once;
  std::call_once(once, [] {
    DFLASH_CUDA_CHECK(cudaFuncSetAttribute(gemm_nvfp4_kernel<MT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem_bytes<MT>())));
  });
}
void prepare_all() {
  prepare<1>();
  prepare<4>();
}

template <int MT>
void launch(cudaStream_t stream, bool pdl, const uint16_t* a, int64_t lda, int64_t m, const DeviceNvFp4View& w,
            const EpilogueArgs& args) {
  prepare<MT>();
  const int64_t row_tiles = (m + MT * 16 - 1) / (MT * 16);
  const int64_t column_tiles = (w.n + kColumnsPerCta - 1) / kColumnsPerCta;
  if (row_tiles > 0x7fffffff || column_tiles > 65535) {
    throw internal_error("gemm nvfp4: " + std::to_string(m) + " rows and " + std::to_string(w.n) +
                         " columns exceed the grid");
  }
  const dim3 grid(static_cast<unsigned>(row_tiles), static_cast<unsigned>(column_tiles));
  launch_kernel(DFLASH_KERNEL_SITE("gemm_nvfp4_kernel"), gemm_nvfp4_kernel<MT>, grid, dim3(kThreads), smem_bytes<MT>(), stream, pdl, a, lda,
                m, w, args);
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
  prepare_all();
  DeviceNvFp4Linear d;
  d.n = w.rows;
  d.k = w.cols;
  d.k_pad = nvfp4_pad_k(w.cols);
  d.global_scale = w.global_scale;
  const std::vector<uint8_t> codes = nvfp4_device_codes(w), scales = nvfp4_device_block_scales(w);
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
  EpilogueArgs args;
  args.scale = nullptr;
  args.bias = nullptr;
  args.m = m;
  args.n = w.n;
  args.ep = epilogue;
  // One m16 tile per CTA (two CTAs per SM) up to 32 rows, four (one CTA per SM, the weights read
  // once per 64 rows) beyond: measured on the H200, 32 rows take less time as two 16-row passes.
  if (m <= 32) {
    launch<1>(stream, pdl, a, lda, m, w, args);
  } else {
    launch<4>(stream, pdl, a, lda, m, w, args);
  }
}

}  // namespace dflash
