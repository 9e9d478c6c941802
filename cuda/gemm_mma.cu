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

#include <algorithm>
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
  // Split-K only (kPartials): split blockIdx.z reduces k-tiles [z·split_tiles, (z+1)·split_tiles)
  // and stores its sums to partials[z][m][n] (row stride n = epilogue.n) instead of the epilogue.
  int split_tiles;
  float* partials;
};

// kPartials = false is the kMma kernel: the whole K per CTA, epilogue in place. kPartials = true is
// the split-K variant; everything but the k-tile range and the final store is the same code.
template <bool kFp8, int MT, bool kPartials>
__global__ void __launch_bounds__(kThreads, MT == 1 ? 2 : 1) gemm_mma_kernel(MmaParams p) {
  using L = Stages<kFp8, MT>;
  constexpr int kTileBytes = kFp8 ? kKTile : 2 * kKTile;  // bytes of one weight row per k-tile
  constexpr int kPieces = kTileBytes / 16;               // 16-byte pieces of it
  extern __shared__ __align__(16) uint8_t smem[];

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * MT * 16;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kColumns;
  // Split-K: this CTA's k-tiles are [z·split_tiles, z·split_tiles + k_tiles) of the whole K; the
  // weight and activation bases move to the first of them, so k-tile kt below is relative to it
  // (for kMma: kt_first = 0, the whole K).
  int k_tiles = p.k_tiles;
  const uint8_t* w_base = p.w;
  const uint16_t* a_base = p.a;
  if constexpr (kPartials) {
    const int kt_first = static_cast<int>(blockIdx.z) * p.split_tiles;
    k_tiles = min(p.split_tiles, p.k_tiles - kt_first);
    w_base += static_cast<int64_t>(kt_first) * kTileBytes;
    a_base += static_cast<int64_t>(kt_first) * kKTile;
  }
  // This warp's k-tiles: warp, warp + kWarps, ... below k_tiles (none when k_tiles <= warp).
  const int tiles = warp < k_tiles ? (k_tiles - warp + kWarps - 1) / kWarps : 0;
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
      const uint8_t* src = w_base + (valid ? n : 0) * p.ldw_bytes + static_cast<int64_t>(kt) * kTileBytes + piece * 16;
      cp_async_16(st + row * L::kWeightRowBytes + piece * 16, src, valid);
    }
    uint8_t* act = st + L::kWeightBytes;
#pragma unroll
    for (int i = 0; i < MT * 16 * 8 / 32; ++i) {
      const int c = lane + 32 * i;
      const int row = c / 8, piece = c % 8;
      const int64_t m = m0 + row;
      const bool valid = m < p.m;
      const uint16_t* src = a_base + (valid ? m : 0) * p.lda + static_cast<int64_t>(kt) * kKTile + piece * 8;
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
    if constexpr (kPartials) {
      const int64_t row = m0 + r, col = n0 + lane;
      if (row < p.m && col < p.epilogue.n) {
        p.partials[(static_cast<int64_t>(blockIdx.z) * p.m + row) * p.epilogue.n + col] = v;
      }
    } else {
      epilogue_warp(p.epilogue, m0 + r, n0, v);
    }
  }
}

// Split-K second pass: one warp per (row, 32-column block) adds the splits' partials in split
// order 0..S-1 and runs the same epilogue as the mma kernel (same 32-column warp layout, so the
// SwiGLU pairs and argmax blocks line up identically).
__global__ void __launch_bounds__(kThreads) gemm_splitk_reduce_kernel(const float* partials, int splits,
                                                                     EpilogueArgs e) {
  const int64_t col_blocks = (e.n + kColumns - 1) / kColumns;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (item >= e.m * col_blocks) return;  // uniform per warp: the epilogue's shuffles see full warps
  const int64_t row = item / col_blocks;
  const int64_t col_block = (item % col_blocks) * kColumns;
  const int64_t col = col_block + (threadIdx.x & 31);
  float v = 0.0f;
  if (col < e.n) {
    const float* p = partials + row * e.n + col;
    const int64_t split_stride = e.m * e.n;
    v = p[0];
    for (int s = 1; s < splits; ++s) v = __fadd_rn(v, p[s * split_stride]);
  }
  epilogue_warp(e, row, col_block, v);
}

// Once per instantiation and process, before its first launch (never inside a graph capture when
// prepare_gemm_kernels() ran at construction).
template <bool kFp8, int MT, bool kPartials = false>
void prepare() {
  static std::once_flag once;
  std::call_once(once, [] {
    DFLASH_CUDA_CHECK(cudaFuncSetAttribute(gemm_mma_kernel<kFp8, MT, kPartials>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(Stages<kFp8, MT>::kTotalSmem)));
  });
}

// splits = 1 and kPartials = false: the kMma launch.
template <bool kFp8, int MT, bool kPartials = false>
void launch(cudaStream_t stream, const MmaParams& params, int64_t m, int64_t n, int splits = 1) {
  prepare<kFp8, MT, kPartials>();
  const int64_t m_blocks = (m + MT * 16 - 1) / (MT * 16);
  const int64_t n_blocks = (n + kColumns - 1) / kColumns;
  if (m_blocks > 0x7fffffff || n_blocks > 65535 || splits < 1 || splits > 65535) {
    throw internal_error("gemm mma: grid too large (m " + std::to_string(m) + ", n " + std::to_string(n) +
                         ", splits " + std::to_string(splits) + ")");
  }
  // m-blocks vary fastest, so the CTAs that read the same weights run together (L2 reuse).
  gemm_mma_kernel<kFp8, MT, kPartials>
      <<<dim3(static_cast<unsigned>(m_blocks), static_cast<unsigned>(n_blocks), static_cast<unsigned>(splits)),
         kThreads, Stages<kFp8, MT>::kTotalSmem, stream>>>(params);
  if constexpr (kPartials) {
    DFLASH_CUDA_CHECK_LAUNCH("gemm_mma_kernel (split-K partials)");
  } else {
    DFLASH_CUDA_CHECK_LAUNCH("gemm_mma_kernel");
  }
}

void check_mma_operands(const char* who, const uint16_t* a, int64_t lda, const DeviceMatrixView& w) {
  if (w.k_pad % kKTile != 0 || lda % 8 != 0 || lda < w.k_pad || (reinterpret_cast<uintptr_t>(a) & 15) != 0 ||
      (reinterpret_cast<uintptr_t>(w.data) & 15) != 0) {
    throw internal_error(std::string(who) + ": operands not padded/aligned (k_pad " + std::to_string(w.k_pad) +
                         ", lda " + std::to_string(lda) + ")");
  }
}

}  // namespace

// Enough CTAs for a batch-1 GEMM (one 16-row block) to give each of ~132 SMs about 4 (two waves
// of the two co-resident MT = 1 CTAs per SM): the weights stream at full bandwidth only with many
// k-tiles in flight on every SM at once. The drafter's narrow GEMMs reach this target long before
// their splits get short (q|k|v, o, down, fc: 4 splits of 16-48 k-tiles; context k|v: 8 of 8).
constexpr int64_t kSplitTargetCtas = 512;
constexpr int kMaxSplits = 8;  // bounds the partials' extra traffic (rows · n · splits · 8 bytes)

static int64_t split_tiles_of(int64_t k_tiles, int splits) { return (k_tiles + splits - 1) / splits; }

int gemm_split_count(int64_t n, int64_t k_pad) {
  if (n < 1 || k_pad < kKTile || k_pad % kKTile != 0) return 1;
  const int64_t n_blocks = (n + kColumns - 1) / kColumns;
  const int64_t k_tiles = k_pad / kKTile;
  // The smallest power of two that reaches the CTA target, at most kMaxSplits and k_tiles.
  int splits = 1;
  while (n_blocks * splits < kSplitTargetCtas && splits * 2 <= kMaxSplits && splits * 2 <= k_tiles) splits *= 2;
  // Splits of ceil(k_tiles / splits) tiles; drop the empty ones at the end (e.g. 10 tiles in 8
  // splits of 2 is 5 splits). Recomputing the tile count from the result gives the same ceil.
  return static_cast<int>((k_tiles + split_tiles_of(k_tiles, splits) - 1) / split_tiles_of(k_tiles, splits));
}

void prepare_gemm_kernels() {
  prepare<true, 1>();
  prepare<true, 4>();
  prepare<false, 1>();
  prepare<false, 4>();
  prepare<true, 1, true>();
  prepare<true, 4, true>();
  prepare<false, 1, true>();
  prepare<false, 4, true>();
}

void launch_gemm_mma(cudaStream_t stream, const uint16_t* a, int64_t lda, int64_t m, const DeviceMatrixView& w,
                     const GemmEpilogue& epilogue) {
  check_mma_operands("gemm mma", a, lda, w);
  MmaParams p;
  p.a = a;
  p.lda = lda;
  p.m = m;
  p.w = static_cast<const uint8_t*>(w.data);
  const bool fp8 = w.format == WeightFormat::kE4M3;
  p.ldw_bytes = w.k_pad * (fp8 ? 1 : 2);
  p.k_tiles = static_cast<int>(w.k_pad / kKTile);
  p.epilogue = make_epilogue_args(w, m, epilogue);
  p.split_tiles = p.k_tiles;
  p.partials = nullptr;
  if (fp8) {
    if (m <= 16) launch<true, 1>(stream, p, m, w.n); else launch<true, 4>(stream, p, m, w.n);
  } else {
    if (m <= 16) launch<false, 1>(stream, p, m, w.n); else launch<false, 4>(stream, p, m, w.n);
  }
}

// Rows [row0, row0 + rows) of the epilogue's outputs: every output pointer moves by row0 rows.
static GemmEpilogue epilogue_rows(const GemmEpilogue& ep, int64_t row0) {
  GemmEpilogue r = ep;
  if (r.out != nullptr) r.out += row0 * r.ld_out;
  if (r.residual != nullptr) r.residual += row0 * r.ld_residual;
  if (r.swiglu_out != nullptr) r.swiglu_out += row0 * r.ld_swiglu;
  if (r.argmax_value != nullptr) r.argmax_value += row0 * r.ld_argmax;
  if (r.argmax_index != nullptr) r.argmax_index += row0 * r.ld_argmax;
  return r;
}

void launch_gemm_mma_splitk(cudaStream_t stream, const uint16_t* a, int64_t lda, int64_t m, const DeviceMatrixView& w,
                            const GemmEpilogue& epilogue, float* partials, size_t capacity) {
  check_mma_operands("gemm mma-splitk", a, lda, w);
  const int splits = gemm_split_count(w.n, w.k_pad);
  const int k_tiles = static_cast<int>(w.k_pad / kKTile);
  // Every split non-empty (gemm_split_count drops empty ones), checked so that a future rule cannot
  // break it silently: a split past k would leave its partials unwritten.
  const int split_tiles = static_cast<int>(split_tiles_of(k_tiles, splits));
  if (splits < 2 || static_cast<int64_t>(split_tiles) * (splits - 1) >= k_tiles) {
    throw internal_error("gemm mma-splitk: " + std::to_string(splits) + " splits of " + std::to_string(split_tiles) +
                         " k-tiles do not cover " + std::to_string(k_tiles) + " k-tiles");
  }
  // Rows per pass: all m when the scratch holds them, else the most it holds (a multiple of 64,
  // the MT = 4 row block, when that is at least 64). Rows are independent, so chunking changes
  // which rows share a launch, never any element's reduction order.
  const int64_t row_floats = w.n * splits;
  int64_t chunk = static_cast<int64_t>(capacity) / row_floats;
  if (chunk < 1) {
    throw internal_error("gemm mma-splitk: scratch of " + std::to_string(capacity) + " floats is short of one row (" +
                         std::to_string(w.n) + " columns x " + std::to_string(splits) + " splits)");
  }
  if (chunk < m && chunk >= 64) chunk = chunk / 64 * 64;
  const bool fp8 = w.format == WeightFormat::kE4M3;
  const int64_t col_blocks = (w.n + kColumns - 1) / kColumns;
  for (int64_t row0 = 0; row0 < m; row0 += chunk) {
    const int64_t rows = std::min(chunk, m - row0);
    MmaParams p;
    p.a = a + row0 * lda;
    p.lda = lda;
    p.m = rows;
    p.w = static_cast<const uint8_t*>(w.data);
    p.ldw_bytes = w.k_pad * (fp8 ? 1 : 2);
    p.k_tiles = k_tiles;
    p.epilogue = make_epilogue_args(w, rows, epilogue_rows(epilogue, row0));
    p.split_tiles = split_tiles;
    p.partials = partials;
    if (fp8) {
      if (rows <= 16) launch<true, 1, true>(stream, p, rows, w.n, splits); else launch<true, 4, true>(stream, p, rows, w.n, splits);
    } else {
      if (rows <= 16) launch<false, 1, true>(stream, p, rows, w.n, splits); else launch<false, 4, true>(stream, p, rows, w.n, splits);
    }
    const int64_t warps = rows * col_blocks;
    const int64_t blocks = (warps + kWarps - 1) / kWarps;
    if (blocks > 0x7fffffff) throw internal_error("gemm mma-splitk: reduce grid too large (m " + std::to_string(m) + ")");
    gemm_splitk_reduce_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(partials, splits, p.epilogue);
    DFLASH_CUDA_CHECK_LAUNCH("gemm_splitk_reduce_kernel");
  }
}

}  // namespace dflash
