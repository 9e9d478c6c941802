// The weight-only tensor-core GEMM (GemmKernel::kMma) for the drafter's small and medium m.
//
// Work split. A CTA of 8 warps owns 32 output columns (4 n-tiles of 8) and MT·16 rows (MT = 1 for
// m <= 16, 4 above). Its warps split K: warp w reduces the 64-column k-tiles w, w + 8, w + 16, ...
// in that order (interleaved, so that the 8 warps of a CTA read 512 contiguous bytes of each
// weight row at a time), and the 8 partial sums are added in shared memory in warp order. The
// split depends on K only and every accumulator sees its k-tiles and mma steps in the same order
// for both MT, so each output element is reduced in the same order whatever m is (batch
// invariance, bit for bit).
//
// Streaming. Each warp runs its own cp.async ring of S stages in shared memory (one k-tile of its
// 4 weight n-tiles and of the MT·16 activation rows per stage), so S-1 k-tiles of weights are in
// flight while it computes one, without holding them in registers.
//
// Fragments. mma.sync m16n8k16 (bf16 in, fp32 accumulate). A dot product does not care which
// physical k feeds which fragment slot as long as A and B agree, so thread (g = lane/4, t = lane%4)
// reads 16 contiguous weight bytes (E4M3) or 32 (bf16) of weight row g of each n-tile per k-tile
// and the matching 16 activations of its rows g and g+8; in mma step j (0..3) the fragment's
// logical k {2t, 2t+1, 2t+8, 2t+9} is physical k 16t + 4j + {0, 1, 2, 3}.
//
// E4M3 → bf16 exactly: the code's 7 magnitude bits are placed at bf16 bit 4 (sign at 15), which is
// the value times 2^-120 (subnormal codes become bf16 subnormals), then one bf16 multiply by 2^120
// restores it exactly. The per-row scale is applied in the epilogue.
#include <cuda_bf16.h>

#include <cstdint>
#include <mutex>
#include <string>

#include "core/error.h"
#include "cuda/cuda_check.h"
#include "cuda/gemm.h"
#include "cuda/gemm_epilogue.cuh"

namespace dflash {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kNTiles = 4;              // n-tiles of 8 columns per CTA
constexpr int kColumns = kNTiles * 8;   // 32 columns per CTA
constexpr int kKTile = 64;              // k per pipeline stage (4 mma k-steps of 16)
constexpr int kReduceStride = kColumns + 1;  // padded row of the split-K reduction buffer
constexpr int kARowBytes = kKTile * 2 + 16;  // one activation row of a stage, padded (no bank conflicts)

// Shared-memory layout of one warp's pipeline, per weight format and MT.
template <bool kFp8, int MT>
struct Stages {
  static constexpr int kWeightRowBytes = kFp8 ? kKTile : kKTile * 2 + 16;  // bf16 rows padded
  static constexpr int kWeightBytes = kNTiles * 8 * kWeightRowBytes;
  static constexpr int kActivationBytes = MT * 16 * kARowBytes;
  static constexpr int kStageBytes = kWeightBytes + kActivationBytes;
  static constexpr int kCount = MT == 1 ? (kFp8 ? 3 : 2) : 2;  // S
  static constexpr size_t kSmem = static_cast<size_t>(kWarps) * kCount * kStageBytes;
  static constexpr size_t kReduceSmem = static_cast<size_t>(kWarps) * MT * 16 * kReduceStride * sizeof(float);
  static constexpr size_t kTotalSmem = kSmem > kReduceSmem ? kSmem : kReduceSmem;
};

__device__ __forceinline__ void cp_async_16(void* smem, const void* global, bool valid) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int bytes = valid ? 16 : 0;  // 0: the 16 bytes are zero-filled, nothing is read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(global), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Two E4M3 codes (bytes 0 and 1 of x after the permute) to bf16x2 (low half = first code), exactly.
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t codes, uint32_t selector) {
  const uint32_t t = __byte_perm(codes, 0, selector);  // [c_lo, 0, c_hi, 0]
  const uint32_t shifted = ((t & 0x007f007fu) << 4) | ((t & 0x00800080u) << 8);
  __nv_bfloat162 v;
  *reinterpret_cast<uint32_t*>(&v) = shifted;
  const __nv_bfloat162 r = __hmul2(v, __floats2bfloat162_rn(0x1p120f, 0x1p120f));
  return *reinterpret_cast<const uint32_t*>(&r);
}

__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

struct MmaParams {
  const uint16_t* a;
  int64_t lda, m;
  const uint8_t* w;      // bytes
  int64_t ldw_bytes;     // bytes per weight row
  int k_tiles;
  EpilogueArgs epilogue;
};

template <bool kFp8, int MT>
__global__ void __launch_bounds__(kThreads, MT == 1 ? 2 : 1) gemm_mma_kernel(MmaParams p) {
  using L = Stages<kFp8, MT>;
  constexpr int kTileBytes = kFp8 ? kKTile : 2 * kKTile;  // bytes of one weight row per k-tile
  constexpr int kPieces = kTileBytes / 16;               // 16-byte pieces of it
  extern __shared__ __align__(16) uint8_t smem[];

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * MT * 16;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kColumns;
  // This warp's k-tiles: warp, warp + kWarps, ... below k_tiles (none when k_tiles <= warp).
  const int tiles = warp < p.k_tiles ? (p.k_tiles - warp + kWarps - 1) / kWarps : 0;
  uint8_t* ring = smem + static_cast<size_t>(warp) * L::kCount * L::kStageBytes;

  // Copies k-tile kt into stage `stage` of this warp's ring (rows past n or m are zero-filled).
  auto issue = [&](int kt, int stage) {
    uint8_t* st = ring + stage * L::kStageBytes;
#pragma unroll
    for (int i = 0; i < kNTiles * 8 * kPieces / 32; ++i) {
      const int c = lane + 32 * i;
      const int row = c / kPieces, piece = c % kPieces;  // row = nt·8 + g'
      const int64_t n = n0 + row;
      const bool valid = n < p.epilogue.n;
      const uint8_t* src = p.w + (valid ? n : 0) * p.ldw_bytes + static_cast<int64_t>(kt) * kTileBytes + piece * 16;
      cp_async_16(st + row * L::kWeightRowBytes + piece * 16, src, valid);
    }
    uint8_t* act = st + L::kWeightBytes;
#pragma unroll
    for (int i = 0; i < MT * 16 * 8 / 32; ++i) {
      const int c = lane + 32 * i;
      const int row = c / 8, piece = c % 8;
      const int64_t m = m0 + row;
      const bool valid = m < p.m;
      const uint16_t* src = p.a + (valid ? m : 0) * p.lda + static_cast<int64_t>(kt) * kKTile + piece * 8;
      cp_async_16(act + row * kARowBytes + piece * 16, src, valid);
    }
  };

  float acc[MT][kNTiles][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;

#pragma unroll
  for (int s = 0; s < L::kCount - 1; ++s) {
    if (s < tiles) issue(warp + kWarps * s, s);
    cp_async_commit();
  }
  for (int i = 0; i < tiles; ++i) {
    cp_async_wait<L::kCount - 2>();  // stage i has landed
    __syncwarp();                    // ... for every lane, and stage i-1 is no longer read
    if (i + L::kCount - 1 < tiles) issue(warp + kWarps * (i + L::kCount - 1), (i + L::kCount - 1) % L::kCount);
    cp_async_commit();
    const uint8_t* st = ring + (i % L::kCount) * L::kStageBytes;

    uint4 b[kNTiles][kFp8 ? 1 : 2];
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
      const uint8_t* row = st + (nt * 8 + g) * L::kWeightRowBytes;
      if constexpr (kFp8) {
        b[nt][0] = *reinterpret_cast<const uint4*>(row + 16 * t);
      } else {
        b[nt][0] = *reinterpret_cast<const uint4*>(row + 32 * t);
        b[nt][1] = *reinterpret_cast<const uint4*>(row + 32 * t + 16);
      }
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      uint4 a[2][2];  // [row g / g+8][k 0-7 / 8-15 of the thread's 16]
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint8_t* row = st + L::kWeightBytes + (mt * 16 + g + 8 * h) * kARowBytes + 32 * t;
        a[h][0] = *reinterpret_cast<const uint4*>(row);
        a[h][1] = *reinterpret_cast<const uint4*>(row + 16);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t a0 = word_of(a[0][(2 * j) / 4], (2 * j) % 4);
        const uint32_t a1 = word_of(a[1][(2 * j) / 4], (2 * j) % 4);
        const uint32_t a2 = word_of(a[0][(2 * j + 1) / 4], (2 * j + 1) % 4);
        const uint32_t a3 = word_of(a[1][(2 * j + 1) / 4], (2 * j + 1) % 4);
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
          uint32_t b0, b1;
          if constexpr (kFp8) {
            const uint32_t codes = word_of(b[nt][0], j);  // bytes 4j .. 4j+3
            b0 = e4m3x2_to_bf16x2(codes, 0x4140);
            b1 = e4m3x2_to_bf16x2(codes, 0x4342);
          } else {
            b0 = word_of(b[nt][(2 * j) / 4], (2 * j) % 4);  // elements 4j, 4j+1 of 16
            b1 = word_of(b[nt][(2 * j + 1) / 4], (2 * j + 1) % 4);
          }
          mma_bf16_16816(acc[mt][nt], a0, a1, a2, a3, b0, b1);
        }
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the rings become the reduction buffer

  // Split-K reduction over the warps, in warp order.
  float* reduce_buffer = reinterpret_cast<float*>(smem);  // [kWarps][MT·16][kReduceStride]
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = mt * 16 + g + (e >= 2 ? 8 : 0);
        const int c = nt * 8 + 2 * t + (e & 1);
        reduce_buffer[(warp * MT * 16 + r) * kReduceStride + c] = acc[mt][nt][e];
      }
  __syncthreads();
  for (int r = warp; r < MT * 16; r += kWarps) {
    float v = reduce_buffer[r * kReduceStride + lane];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) v = __fadd_rn(v, reduce_buffer[(w * MT * 16 + r) * kReduceStride + lane]);
    epilogue_warp(p.epilogue, m0 + r, n0, v);
  }
}

// Once per instantiation and process, before its first launch (never inside a graph capture when
// prepare_gemm_kernels() ran at construction).
template <bool kFp8, int MT>
void prepare() {
  static std::once_flag once;
  std::call_once(once, [] {
    DFLASH_CUDA_CHECK(cudaFuncSetAttribute(gemm_mma_kernel<kFp8, MT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(Stages<kFp8, MT>::kTotalSmem)));
  });
}

template <bool kFp8, int MT>
void launch(cudaStream_t stream, const MmaParams& params, int64_t m, int64_t n) {
  prepare<kFp8, MT>();
  const int64_t m_blocks = (m + MT * 16 - 1) / (MT * 16);
  const int64_t n_blocks = (n + kColumns - 1) / kColumns;
  if (m_blocks > 0x7fffffff || n_blocks > 65535) {
    throw internal_error("gemm mma: grid too large (m " + std::to_string(m) + ", n " + std::to_string(n) + ")");
  }
  // m-blocks vary fastest, so the CTAs that read the same weights run together (L2 reuse).
  gemm_mma_kernel<kFp8, MT><<<dim3(static_cast<unsigned>(m_blocks), static_cast<unsigned>(n_blocks)), kThreads,
                              Stages<kFp8, MT>::kTotalSmem, stream>>>(params);
  DFLASH_CUDA_CHECK_LAUNCH("gemm_mma_kernel");
}

}  // namespace

void prepare_gemm_kernels() {
  prepare<true, 1>();
  prepare<true, 4>();
  prepare<false, 1>();
  prepare<false, 4>();
}

void launch_gemm_mma(cudaStream_t stream, const uint16_t* a, int64_t lda, int64_t m, const DeviceMatrixView& w,
                     const GemmEpilogue& epilogue) {
  if (w.k_pad % kKTile != 0 || lda % 8 != 0 || lda < w.k_pad || (reinterpret_cast<uintptr_t>(a) & 15) != 0 ||
      (reinterpret_cast<uintptr_t>(w.data) & 15) != 0) {
    throw internal_error("gemm mma: operands not padded/aligned (k_pad " + std::to_string(w.k_pad) + ", lda " +
                         std::to_string(lda) + ")");
  }
  MmaParams p;
  p.a = a;
  p.lda = lda;
  p.m = m;
  p.w = static_cast<const uint8_t*>(w.data);
  const bool fp8 = w.format == WeightFormat::kE4M3;
  p.ldw_bytes = w.k_pad * (fp8 ? 1 : 2);
  p.k_tiles = static_cast<int>(w.k_pad / kKTile);
  p.epilogue = make_epilogue_args(w, m, epilogue);
  if (fp8) {
    if (m <= 16) launch<true, 1>(stream, p, m, w.n); else launch<true, 4>(stream, p, m, w.n);
  } else {
    if (m <= 16) launch<false, 1>(stream, p, m, w.n); else launch<false, 4>(stream, p, m, w.n);
  }
}

}  // namespace dflash
