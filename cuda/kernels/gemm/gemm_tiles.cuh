// The building blocks of the weight-only tensor-core GEMM kernels (gemm_mma.cu): the
// cp.async copies, the exact E4M3 -> bf16 decode, one k-tile of mma.sync steps, the weight-tile
// copy, and the cross-warp reduction with its epilogue. Every kernel that reduces an output element
// with these pieces, the same k-tiles per warp and the same warp order, gets the same bits
// (gemm_mma.cu's header describes the work split and the fragment layout).
#pragma once
#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>

#include "cuda/runtime/cp_async.cuh"
#include "cuda/kernels/gemm/gemm_epilogue.cuh"

namespace dflash {
namespace gemm_tiles {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kColumns = 32;            // columns of one warp's epilogue item
constexpr int kKTile = 64;              // k per pipeline stage (4 mma k-steps of 16)
constexpr int kARowBytes = kKTile * 2 + 16;  // one activation row of a stage, padded (no bank conflicts)

// The cross-warp reduction buffer (reduce_warps_and_store): kWarps × MT·16 rows of NT·8 floats,
// each row padded by one float against bank conflicts.
constexpr int reduce_stride(int nt) { return nt * 8 + 1; }
constexpr size_t reduce_smem_bytes(int mt, int nt) {
  return static_cast<size_t>(kWarps) * mt * 16 * reduce_stride(nt) * sizeof(float);
}

__device__ __forceinline__ void cp_async_16(void* smem, const void* global, bool valid) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int bytes = valid ? 16 : 0;  // 0: the 16 bytes are zero-filled, nothing is read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(global), "r"(bytes));
}
// Weights that the m <= 16 kernels read exactly once: let L2 fetch the whole 256-byte segment
// around each request (the CTA's 8 warps read 512 contiguous bytes of each weight row between
// them, a few cycles apart). (An evict-first L2 cache hint on these copies was tried: the H200
// stops with an illegal instruction on cp.async ... L2::cache_hint.)
__device__ __forceinline__ void cp_async_16_stream(void* smem, const void* global, bool valid) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(global), "r"(bytes));
}
// 4 bytes (cp.async's smallest copy goes through L1: .ca), only where `copy` is nonzero (a flag
// word tested as one predicate); elsewhere the 4 bytes are zero-filled and nothing is read.
__device__ __forceinline__ void cp_async_4_if(void* smem, const void* global, uint32_t copy) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile(
      "{\n .reg .pred skip;\n setp.eq.u32 skip, %2, 0;\n cp.async.ca.shared.global [%0], [%1], 4, skip;\n}\n" ::"r"(dst),
      "l"(global), "r"(copy));
}
using ::dflash::cp_async_commit;  // cuda/runtime/cp_async.cuh
using ::dflash::cp_async_wait;

__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Two E4M3 codes of `codes` (bytes 0 and 1 for selector 0x9180, bytes 2 and 3 for 0xB3A2) to
// bf16x2 (low half = first code), exactly. prmt copies each code into a 16-bit half with its sign
// bit replicated above it (the 8 in a selector nibble); shifted left by 4 and masked, a half is
// sign << 15 | magnitude << 4 (the bits spilled from the low half into the high one are masked
// off), which as bf16 is the code's value times 2^-120 (subnormal codes become bf16 subnormals);
// one bf16 multiply by 2^120 restores it exactly. 4 instructions per pair.
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t codes, uint32_t selector) {
  uint32_t t;
  asm("prmt.b32 %0, %1, 0, %2;\n" : "=r"(t) : "r"(codes), "r"(selector));
  const uint32_t shifted = (t << 4) & 0x87f087f0u;
  __nv_bfloat162 v;
  *reinterpret_cast<uint32_t*>(&v) = shifted;
  const __nv_bfloat162 r = __hmul2(v, __floats2bfloat162_rn(0x1p120f, 0x1p120f));
  return *reinterpret_cast<const uint32_t*>(&r);
}
constexpr uint32_t kCodes01 = 0x9180u;  // bytes 0, 1 of a word, each with its sign replicated
constexpr uint32_t kCodes23 = 0xB3A2u;  // bytes 2, 3

__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// How many k-tiles warp `warp` reduces of k_tiles (its tiles are warp, warp + kWarps, ...).
__device__ __forceinline__ int warp_tiles(int k_tiles, int warp) {
  return warp < k_tiles ? (k_tiles - warp + kWarps - 1) / kWarps : 0;
}

// This thread's activation rows g and g + 8 of the 16-row tile at m0, at its 16 elements of a
// k-tile (mma_k_tile's fragment layout); null past m, where the fragments stay zero.
__device__ __forceinline__ void activation_rows(const uint16_t* (&rows)[2], const uint16_t* a, int64_t lda, int64_t m0,
                                                int64_t m, int g, int t) {
#pragma unroll
  for (int h = 0; h < 2; ++h) rows[h] = m0 + g + 8 * h < m ? a + (m0 + g + 8 * h) * lda + 16 * t : nullptr;
}
// This thread's activation fragments of k-tile kt, straight into registers.
__device__ __forceinline__ void load_activation_fragments(uint4 (&a)[2][2], const uint16_t* const (&rows)[2], int kt) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (rows[h] != nullptr) {
      const uint4* src = reinterpret_cast<const uint4*>(rows[h] + static_cast<int64_t>(kt) * kKTile);
      a[h][0] = src[0];
      a[h][1] = src[1];
    } else {
      a[h][0] = a[h][1] = make_uint4(0u, 0u, 0u, 0u);
    }
  }
}

// One k-tile of one 16-row m-tile: acc[nt] += A(16 × 64) · W(NT·8 × 64)ᵀ. `a` holds this thread's
// activations (rows g and g+8, elements 16t..16t+15 of the k-tile), `weights` the stage's NT·8
// weight rows of `row_bytes` each. Per n-tile its weight fragment, then the 4 mma k-steps in order:
// each accumulator sees the same sequence of steps whatever NT or the pipeline is.
template <bool kFp8, int NT>
__device__ __forceinline__ void mma_k_tile(float (&acc)[NT][4], const uint4 (&a)[2][2], const uint8_t* weights,
                                           int row_bytes, int g, int t) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    uint4 b[kFp8 ? 1 : 2];
    const uint8_t* row = weights + (nt * 8 + g) * row_bytes;
    if constexpr (kFp8) {
      b[0] = *reinterpret_cast<const uint4*>(row + 16 * t);
    } else {
      b[0] = *reinterpret_cast<const uint4*>(row + 32 * t);
      b[1] = *reinterpret_cast<const uint4*>(row + 32 * t + 16);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t a0 = word_of(a[0][(2 * j) / 4], (2 * j) % 4);
      const uint32_t a1 = word_of(a[1][(2 * j) / 4], (2 * j) % 4);
      const uint32_t a2 = word_of(a[0][(2 * j + 1) / 4], (2 * j + 1) % 4);
      const uint32_t a3 = word_of(a[1][(2 * j + 1) / 4], (2 * j + 1) % 4);
      uint32_t b0, b1;
      if constexpr (kFp8) {
        const uint32_t codes = word_of(b[0], j);  // bytes 4j .. 4j+3
        b0 = e4m3x2_to_bf16x2(codes, kCodes01);
        b1 = e4m3x2_to_bf16x2(codes, kCodes23);
      } else {
        b0 = word_of(b[(2 * j) / 4], (2 * j) % 4);  // elements 4j, 4j+1 of 16
        b1 = word_of(b[(2 * j + 1) / 4], (2 * j + 1) % 4);
      }
      mma_bf16_16816(acc[nt], a0, a1, a2, a3, b0, b1);
    }
  }
}

// Copies k-tile kt of the CTA's NT·8 weight rows (from n0) into `stage` (rows of `row_bytes`;
// rows past n are zero-filled). `w_base` already points at the CTA's first k-tile.
// kStream: with the read-once L2 hint of cp_async_16_stream.
template <bool kFp8, int NT, bool kStream = false>
__device__ __forceinline__ void issue_weight_tile(uint8_t* stage, int row_bytes, const uint8_t* w_base,
                                                  int64_t ldw_bytes, int64_t n0, int64_t n, int kt, int lane) {
  constexpr int kTileBytes = kFp8 ? kKTile : 2 * kKTile;  // bytes of one weight row per k-tile
  constexpr int kPieces = kTileBytes / 16;               // 16-byte pieces of it
#pragma unroll
  for (int i = 0; i < NT * 8 * kPieces / 32; ++i) {
    const int c = lane + 32 * i;
    const int row = c / kPieces, piece = c % kPieces;  // row = nt·8 + g'
    const bool valid = n0 + row < n;
    const uint8_t* src = w_base + (valid ? n0 + row : 0) * ldw_bytes + static_cast<int64_t>(kt) * kTileBytes + piece * 16;
    if constexpr (kStream) {
      cp_async_16_stream(stage + row * row_bytes + piece * 16, src, valid);
    } else {
      cp_async_16(stage + row * row_bytes + piece * 16, src, valid);
    }
  }
}

// The epilogue items of warp w: (row, 32-column block) pairs item = w, w + kWarps, ... of the CTA's
// MT·16 rows × NT·8 / 32 column blocks (SwiGLU pairs and argmax blocks keep the 32-column layout).
template <int MT, int NT>
struct WarpItems {
  static constexpr int kColumnBlocks = NT * 8 / kColumns;
  static constexpr int kCount = MT * 16 * kColumnBlocks / kWarps;
  static_assert(MT * 16 * kColumnBlocks % kWarps == 0, "every warp runs the same number of items");
  __device__ __forceinline__ static int item(int j) { return static_cast<int>(threadIdx.x >> 5) + kWarps * j; }
  __device__ __forceinline__ static int row(int j) { return item(j) / kColumnBlocks; }
  __device__ __forceinline__ static int column_block(int j) { return (item(j) % kColumnBlocks) * kColumns; }
};

// Each of this warp's items' epilogue inputs (gemm_epilogue.cuh), for this lane's column: the
// weights' part (kConstants) and / or the residual (kResidual).
template <int MT, int NT, bool kConstants, bool kResidual>
__device__ __forceinline__ void load_item_inputs(EpilogueInputs (&in)[WarpItems<MT, NT>::kCount], const EpilogueArgs& e,
                                                 int64_t m0, int64_t n0) {
  using Items = WarpItems<MT, NT>;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int j = 0; j < Items::kCount; ++j) {
    const int64_t row = m0 + Items::row(j), col = n0 + Items::column_block(j) + lane;
    if constexpr (kConstants) load_epilogue_constants(e, row, col, in[j]);
    if constexpr (kResidual) load_epilogue_residual(e, row, col, in[j]);
  }
}

// The 8 warps' partial sums added in warp order through shared memory (`smem`, free again after a
// __syncthreads), then each warp runs the epilogue of its items. With kLoaded the items' inputs
// are already in `in`; otherwise they are loaded here, while the other warps store their sums.
template <int MT, int NT, bool kLoaded>
__device__ __forceinline__ void reduce_warps_and_store(float (&acc)[MT][NT][4], uint8_t* smem, const EpilogueArgs& e,
                                                       int64_t m0, int64_t n0,
                                                       EpilogueInputs (&in)[WarpItems<MT, NT>::kCount]) {
  using Items = WarpItems<MT, NT>;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  float* reduce_buffer = reinterpret_cast<float*>(smem);  // [kWarps][MT·16][kStride]
  constexpr int kStride = reduce_stride(NT);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = mt * 16 + g + (e >= 2 ? 8 : 0);
        const int c = nt * 8 + 2 * t + (e & 1);
        reduce_buffer[(warp * MT * 16 + r) * kStride + c] = acc[mt][nt][e];
      }
  if constexpr (!kLoaded) load_item_inputs<MT, NT, true, true>(in, e, m0, n0);
  __syncthreads();
#pragma unroll
  for (int j = 0; j < Items::kCount; ++j) {
    const int r = Items::row(j), c = Items::column_block(j) + lane;
    // A wide CTA's last column blocks may lie wholly past n: nothing of theirs may be stored (an
    // argmax partial there would land in the next row's first slot). Uniform per warp.
    if (n0 + c - lane >= e.n) continue;
    float v = reduce_buffer[r * kStride + c];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) v = __fadd_rn(v, reduce_buffer[(w * MT * 16 + r) * kStride + c]);
    epilogue_warp_loaded(e, m0 + r, n0 + c - lane, v, in[j]);
  }
}

}  // namespace gemm_tiles
}  // namespace dflash
