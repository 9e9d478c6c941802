// The weight-only tensor-core GEMM (GemmKernel::kMma) for the drafter's small and medium m.
//
// Work split. A CTA of 8 warps owns NT·8 output columns (NT n-tiles of 8: 32 or 64, at m > 16
// gemm_mma_columns_m64, at m <= 16 gemm_mma_columns) and MT·16 rows (MT = 1 for
// m <= 16, 4 above). The column count changes which CTA computes an element, never the order of
// its sum. The warps split K: warp w
// reduces the 64-column k-tiles w, w + 8, w + 16, ... in that order (interleaved, so that the 8
// warps of a CTA read 512 contiguous bytes of each weight row at a time), and the 8 partial sums
// are added in shared memory in warp order. The split depends on K only and every accumulator sees
// its k-tiles and mma steps in the same order for every MT, NT and kernel, so each output element
// is reduced in the same order whatever m is (batch invariance, bit for bit).
//
// Streaming. m > 16 (gemm_mma_kernel): each warp runs its own cp.async ring of S stages in shared
// memory, one k-tile of its weight rows and of the 64 activation rows per stage, so S-1 k-tiles
// are in flight while it computes one. m <= 16 (gemm_mma_deep_kernel): only the weights go through
// the ring, which then holds 3-8 stages (the "solo" layout, more stages, where the grid has at most
// one CTA per SM; and a partial last wave of 64-column CTAs split off to a launch of 32-column
// ones), and each thread loads its activation fragments for the next k-tile straight into
// registers. The deep kernel's weight copies ask L2 for 256-byte segments (cp_async_16_stream); its
// solo layout keeps to 186 KB (an attention CTA fits beside it), it loads its epilogue's inputs
// early, and it lets the next kernel of a PDL chain be scheduled once its last weight copy is
// issued.
//
// Fragments. mma.sync m16n8k16 (bf16 in, fp32 accumulate). A dot product does not care which
// physical k feeds which fragment slot as long as A and B agree, so thread (g = lane/4, t = lane%4)
// reads 16 contiguous weight bytes (E4M3) or 32 (bf16) of weight row g of each n-tile per k-tile
// and the matching 16 activations of its rows g and g+8; in mma step j (0..3) the fragment's
// logical k {2t, 2t+1, 2t+8, 2t+9} is physical k 16t + 4j + {0, 1, 2, 3}.
//
// E4M3 → bf16 exactly (e4m3x2_to_bf16x2): the code's 7 magnitude bits are placed at bf16 bit 4
// (sign at 15), which is the value times 2^-120 (subnormal codes become bf16 subnormals), then one
// bf16 multiply by 2^120 restores it exactly. The per-row scale is applied in the epilogue.
#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <mutex>
#include <string>

#include "core/error.h"
#include "cuda/runtime/cuda_check.h"
#include "cuda/kernels/gemm/gemm.h"
#include "cuda/kernels/gemm/gemm_epilogue.cuh"
#include "cuda/kernels/gemm/gemm_tiles.cuh"
#include "cuda/runtime/launch.cuh"
#include "testing/fault_points.cuh"

namespace dflash {
namespace {

using namespace gemm_tiles;  // the building blocks of every kernel below (gemm_tiles.cuh)

// Shared-memory layout of one warp's pipeline, per weight format, MT and NT.
template <bool kFp8, int MT, int NT>
struct Stages {
  static constexpr int kWeightRowBytes = kFp8 ? kKTile : kKTile * 2 + 16;  // bf16 rows padded
  static constexpr int kWeightBytes = NT * 8 * kWeightRowBytes;
  static constexpr int kActivationBytes = MT * 16 * kARowBytes;
  static constexpr int kStageBytes = kWeightBytes + kActivationBytes;
  static constexpr int kCount = 2;  // S
  static constexpr size_t kSmem = static_cast<size_t>(kWarps) * kCount * kStageBytes;
  static constexpr size_t kReduceSmem = reduce_smem_bytes(MT, NT);
  static constexpr size_t kTotalSmem = kSmem > kReduceSmem ? kSmem : kReduceSmem;
  // Two CTAs per SM while their shared memory fits.
  static constexpr int kMinBlocks = 2 * (kTotalSmem + 1024) <= 228 * 1024 ? 2 : 1;
};

struct MmaParams {
  const uint16_t* a;
  int64_t lda, m;
  const uint8_t* w;      // bytes
  int64_t ldw_bytes;     // bytes per weight row
  int k_tiles;
  EpilogueArgs epilogue;
  // The deep kernel only: its CTAs start at column n_begin (the tail launch of a wave split).
  int64_t n_begin = 0;
};

// The whole K per CTA, epilogue in place.
template <bool kFp8, int MT, int NT>
__global__ void __launch_bounds__(kThreads, (Stages<kFp8, MT, NT>::kMinBlocks)) gemm_mma_kernel(MmaParams p) {
  using L = Stages<kFp8, MT, NT>;
  extern __shared__ __align__(16) uint8_t smem[];

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * MT * 16;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * NT * 8;
  const uint8_t* w_base = p.w;
  const uint16_t* a_base = p.a;
  // This warp's k-tiles: warp, warp + kWarps, ... below k_tiles (none when k_tiles <= warp).
  const int tiles = warp_tiles(p.k_tiles, warp);
  uint8_t* ring = smem + static_cast<size_t>(warp) * L::kCount * L::kStageBytes;

  // Copies k-tile kt of the weights / the activations into stage `stage` of this warp's ring (rows
  // past n or m are zero-filled).
  auto issue_weights = [&](int kt, int stage) {
    issue_weight_tile<kFp8, NT>(ring + stage * L::kStageBytes, L::kWeightRowBytes, w_base, p.ldw_bytes, n0, p.epilogue.n,
                                kt, lane);
  };
  auto issue_activations = [&](int kt, int stage) {
    uint8_t* act = ring + stage * L::kStageBytes + L::kWeightBytes;
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

  float acc[MT][NT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;

  // The weights do not depend on earlier kernels: the first stages' weights stream in before the
  // PDL wait (launch.cuh), overlapping the previous kernel's tail; the activations after it. Group
  // 0 then holds every prologue weight tile and stage 0's activations, group s stage s's
  // activations, so "group i complete" still implies "stage i complete".
#pragma unroll
  for (int s = 0; s < L::kCount - 1; ++s) {
    if (s < tiles) issue_weights(warp + kWarps * s, s);
  }
  pdl_wait();
#pragma unroll
  for (int s = 0; s < L::kCount - 1; ++s) {
    if (s < tiles) issue_activations(warp + kWarps * s, s);
    cp_async_commit();
  }
  for (int i = 0; i < tiles; ++i) {
    cp_async_wait<L::kCount - 2>();  // stage i has landed
    __syncwarp();                    // ... for every lane, and stage i-1 is no longer read
    if (i + L::kCount - 1 < tiles) {
      issue_weights(warp + kWarps * (i + L::kCount - 1), (i + L::kCount - 1) % L::kCount);
      issue_activations(warp + kWarps * (i + L::kCount - 1), (i + L::kCount - 1) % L::kCount);
    }
    cp_async_commit();
    const uint8_t* st = ring + (i % L::kCount) * L::kStageBytes;

#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      uint4 a[2][2];  // [row g / g+8][k 0-7 / 8-15 of the thread's 16]
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint8_t* row = st + L::kWeightBytes + (mt * 16 + g + 8 * h) * kARowBytes + 32 * t;
        a[h][0] = *reinterpret_cast<const uint4*>(row);
        a[h][1] = *reinterpret_cast<const uint4*>(row + 16);
      }
      mma_k_tile<kFp8, NT>(acc[mt], a, st, L::kWeightRowBytes, g, t);
    }
  }
  // The next kernel may be scheduled from here on: triggered at the start, it would take SM slots
  // as this kernel's CTAs drain, wherever they free first, and skew its own CTAs across the SMs.
  pdl_launch_dependents();
  cp_async_wait<0>();
  __syncthreads();  // the rings become the reduction buffer
  EpilogueInputs inputs[WarpItems<MT, NT>::kCount];
  reduce_warps_and_store<MT, NT, false>(acc, smem, p.epilogue, m0, n0, inputs);
}

// The "deep" pipeline for m <= 16: the same work split, k-tile
// order and reduction as gemm_mma_kernel<kFp8, 1, NT> (so the same bits), but only the weights go
// through shared memory, in a ring of DeepStages::kCount stages per warp, and each thread loads its
// activation fragments for the next k-tile straight into registers (L2 hits). With no activation
// tiles in the ring, the same shared memory holds two to three times the weight bytes in flight.
// kSolo: the layout for a grid of at most one CTA per SM (launch_deep picks it), which then takes
// the whole shared memory for its ring instead of half.
// The ring's stage count: what fits in the CTA's share of shared memory, 2 to 8. The solo layout
// keeps to 186 KB, so that an attention CTA fits beside it on the SM (and can start its work before
// the PDL wait while this kernel still streams).
constexpr int deep_cta_stage_bytes(bool fp8, int nt) { return kWarps * nt * 8 * (fp8 ? kKTile : kKTile * 2 + 16); }
// Two CTAs per SM when each can still keep >= 3 stages (2 in flight), else one with more.
constexpr int deep_min_blocks(bool fp8, int nt, bool solo) {
  return !solo && (110 * 1024) / deep_cta_stage_bytes(fp8, nt) >= 3 ? 2 : 1;
}
constexpr int deep_stage_count(bool fp8, int nt, bool solo) {
  const int budget = deep_min_blocks(fp8, nt, solo) == 2 ? 110 * 1024 : (solo ? 186 * 1024 : 220 * 1024);
  const int fit = budget / deep_cta_stage_bytes(fp8, nt);
  return fit > 8 ? 8 : (fit < 2 ? 2 : fit);
}

template <bool kFp8, int NT, bool kSolo = false>
struct DeepStages {
  static constexpr int kWeightRowBytes = kFp8 ? kKTile : kKTile * 2 + 16;  // bf16 rows padded
  static constexpr int kStageBytes = NT * 8 * kWeightRowBytes;
  static constexpr int kCtaStage = kWarps * kStageBytes;
  static constexpr int kMinBlocks = deep_min_blocks(kFp8, NT, kSolo);
  static constexpr int kCount = deep_stage_count(kFp8, NT, kSolo);
  static constexpr size_t kSmem = static_cast<size_t>(kCtaStage) * kCount;
  static constexpr size_t kReduceSmem = reduce_smem_bytes(1, NT);
  static constexpr size_t kTotalSmem = kSmem > kReduceSmem ? kSmem : kReduceSmem;
};

template <bool kFp8, int NT, bool kSolo>
__global__ void __launch_bounds__(kThreads, (DeepStages<kFp8, NT, kSolo>::kMinBlocks)) gemm_mma_deep_kernel(MmaParams p) {
  using L = DeepStages<kFp8, NT, kSolo>;
  constexpr int S = L::kCount;
  extern __shared__ __align__(16) uint8_t smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * 16;
  const int64_t n0 = p.n_begin + static_cast<int64_t>(blockIdx.y) * NT * 8;
  DFLASH_DEVICE_MUTATE(kGemmKTail, if (p.m == 7 && p.k_tiles > 1) p.k_tiles -= 1);
  const int tiles = warp_tiles(p.k_tiles, warp);
  uint8_t* ring = smem + static_cast<size_t>(warp) * S * L::kStageBytes;
  // The next kernel of a PDL chain may be scheduled at the iteration after this warp's last weight
  // copy (its main loop's start when it has no more than S - 1 k-tiles); the first call of any
  // thread signals for the whole CTA, later calls change nothing.
  const int last_issue = max(tiles - (S - 1), 0);
  const uint16_t* rows[2];
  activation_rows(rows, p.a, p.lda, m0, p.m, g, t);
  auto load_activations = [&](uint4 (&a)[2][2], int kt) { load_activation_fragments(a, rows, kt); };
  auto issue_weights = [&](int i) {  // this warp's i-th k-tile into stage i % S
    issue_weight_tile<kFp8, NT, true>(ring + (i % S) * L::kStageBytes, L::kWeightRowBytes, p.w, p.ldw_bytes, n0,
                                      p.epilogue.n, warp + kWarps * i, lane);
  };

  float acc[1][NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[0][nt][e] = 0.0f;

  // Weights first (they depend on no earlier kernel: before the PDL wait), one commit group per
  // stage, so "all but the newest S-2 groups complete" means "stage i complete". The epilogue's
  // scale and bias are weights too; the residual was written by earlier kernels (after the wait).
  // Loaded now, their latency hides behind the main loop instead of following the reduction.
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < tiles) issue_weights(s);
    cp_async_commit();
  }
  EpilogueInputs inputs[WarpItems<1, NT>::kCount];
  load_item_inputs<1, NT, true, false>(inputs, p.epilogue, m0, n0);
  pdl_wait();
  load_item_inputs<1, NT, false, true>(inputs, p.epilogue, m0, n0);
  // The next k-tile's activations are loaded at the top of each iteration and land while this
  // one waits for its weights and computes (loading further ahead lost: docs/benchmarks.md).
  uint4 a_now[2][2], a_next[2][2];
  if (tiles > 0) load_activations(a_now, warp);
  for (int i = 0; i < tiles; ++i) {
    if (i + 1 < tiles) load_activations(a_next, warp + kWarps * (i + 1));
    cp_async_wait<S - 2>();  // stage i has landed
    __syncwarp();            // ... for every lane, and stage i-1 is no longer read
    if (i + S - 1 < tiles) issue_weights(i + S - 1);
    cp_async_commit();
    if (i == last_issue) pdl_launch_dependents();
    mma_k_tile<kFp8, NT>(acc[0], a_now, ring + (i % S) * L::kStageBytes, L::kWeightRowBytes, g, t);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      a_now[h][0] = a_next[h][0];
      a_now[h][1] = a_next[h][1];
    }
  }
  // For a warp without k-tiles; a no-op where the trigger above ran.
  pdl_launch_dependents();
  cp_async_wait<0>();
  __syncthreads();  // the rings become the reduction buffer
  reduce_warps_and_store<1, NT, true>(acc, smem, p.epilogue, m0, n0, inputs);
}

// Once per instantiation and process, before its first launch (never inside a graph capture when
// prepare_gemm_kernels() ran at construction).
template <bool kFp8, int MT, int NT>
void prepare() {
  static std::once_flag once;
  std::call_once(once, [] {
    DFLASH_CUDA_CHECK(cudaFuncSetAttribute(gemm_mma_kernel<kFp8, MT, NT>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(Stages<kFp8, MT, NT>::kTotalSmem)));
  });
}

// The 64-row-tile launch (m > 16).
template <bool kFp8, int MT, int NT>
void launch(cudaStream_t stream, bool pdl, const MmaParams& params, int64_t m, int64_t n) {
  prepare<kFp8, MT, NT>();
  const int64_t m_blocks = (m + MT * 16 - 1) / (MT * 16);
  const int64_t n_blocks = (n + NT * 8 - 1) / (NT * 8);
  if (m_blocks > 0x7fffffff || n_blocks > 65535) {
    throw internal_error("gemm mma: grid too large (m " + std::to_string(m) + ", n " + std::to_string(n) + ")");
  }
  // m-blocks vary fastest, so the CTAs that read the same weights run together (L2 reuse).
  const dim3 grid(static_cast<unsigned>(m_blocks), static_cast<unsigned>(n_blocks), 1);
  launch_kernel(DFLASH_KERNEL_SITE("gemm_mma_kernel"), gemm_mma_kernel<kFp8, MT, NT>, grid, dim3(kThreads), Stages<kFp8, MT, NT>::kTotalSmem,
                stream, pdl, params);
}

template <bool kFp8, int NT, bool kSolo>
void prepare_deep() {
  static std::once_flag once;
  std::call_once(once, [] {
    DFLASH_CUDA_CHECK(cudaFuncSetAttribute(gemm_mma_deep_kernel<kFp8, NT, kSolo>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(DeepStages<kFp8, NT, kSolo>::kTotalSmem)));
  });
}
// Whether NT has a distinct solo layout (widths that fit two CTAs per SM; wider ones are solo anyway).
template <bool kFp8, int NT>
constexpr bool kHasSolo = deep_min_blocks(kFp8, NT, false) == 2;

// The solo layout when allowed and the grid has at most one CTA per SM (sm_count known), else the
// shared one.
template <bool kFp8, int NT>
void launch_deep(cudaStream_t stream, bool pdl, bool solo, int sm_count, const MmaParams& params, int64_t n) {
  const int64_t n_blocks = (n - params.n_begin + NT * 8 - 1) / (NT * 8);
  if (n_blocks > 65535) throw internal_error("gemm mma: grid too large (n " + std::to_string(n) + ")");
  const dim3 grid(1, static_cast<unsigned>(n_blocks), 1);
  if constexpr (kHasSolo<kFp8, NT>) {
    if (solo && sm_count > 0 && n_blocks <= sm_count) {
      prepare_deep<kFp8, NT, true>();
      launch_kernel(DFLASH_KERNEL_SITE("gemm_mma_deep_kernel (solo)"), gemm_mma_deep_kernel<kFp8, NT, true>, grid, dim3(kThreads),
                    DeepStages<kFp8, NT, true>::kTotalSmem, stream, pdl, params);
      return;
    }
  }
  prepare_deep<kFp8, NT, false>();
  launch_kernel(DFLASH_KERNEL_SITE("gemm_mma_deep_kernel"), gemm_mma_deep_kernel<kFp8, NT, false>, grid, dim3(kThreads),
                DeepStages<kFp8, NT, false>::kTotalSmem, stream, pdl, params);
}

// The m <= 16 launch with the CTA width of `columns` (32 or 64).
template <bool kFp8>
void launch_small_m(int columns, cudaStream_t stream, bool pdl, int sm_count, const MmaParams& params, int64_t n) {
  if (columns == 64) {
    if (sm_count > 0 && deep_min_blocks(kFp8, 8, false) == 2) {
      // Wave split: 64-column CTAs run two per SM; when their count leaves a last wave of at most
      // one CTA per SM (gate|up on 132 SMs: 384 = 264 + 120), that wave would stream with half
      // the bytes in flight. Its columns go to a second launch of 32-column CTAs instead, two per
      // SM. The width never changes an element's sum, so the bits are those of one launch.
      const int64_t blocks = (n + 63) / 64, wave = 2 * static_cast<int64_t>(sm_count);
      const int64_t full = blocks / wave * wave;
      if (blocks > sm_count && full > 0 && full < blocks && blocks - full <= sm_count) {
        launch_deep<kFp8, 8>(stream, pdl, false, sm_count, params, full * 64);
        MmaParams tail = params;
        tail.n_begin = full * 64;
        launch_deep<kFp8, 4>(stream, pdl, false, sm_count, tail, n);
        return;
      }
    }
    launch_deep<kFp8, 8>(stream, pdl, true, sm_count, params, n);
  } else {
    launch_deep<kFp8, 4>(stream, pdl, true, sm_count, params, n);
  }
}

// The m > 16 launch (64-row tiles) with the CTA width of gemm_mma_columns_m64.
template <bool kFp8>
void launch_large_m(int columns, cudaStream_t stream, bool pdl, const MmaParams& params, int64_t m, int64_t n) {
  if constexpr (kFp8) {
    if (columns == 64) {
      launch<kFp8, 4, 8>(stream, pdl, params, m, n);
      return;
    }
  }
  launch<kFp8, 4, 4>(stream, pdl, params, m, n);
}

// The operand layout of the kernels above: w.k_pad a multiple of 64, lda a multiple of 8 and >=
// w.k_pad, A and the weights 16-byte aligned.
void check_mma_operands(const char* who, const uint16_t* a, int64_t lda, const DeviceMatrixView& w) {
  if (w.k_pad % kKTile != 0 || lda % 8 != 0 || lda < w.k_pad || (reinterpret_cast<uintptr_t>(a) & 15) != 0 ||
      (reinterpret_cast<uintptr_t>(w.data) & 15) != 0) {
    throw internal_error(std::string(who) + ": operands not padded/aligned (k_pad " + std::to_string(w.k_pad) +
                         ", lda " + std::to_string(lda) + ")");
  }
}

}  // namespace

int gemm_mma_columns_m64(int requested, int64_t m, int64_t n, WeightFormat format, int sm_count) {
  if (format != WeightFormat::kE4M3) return 32;
  if (requested == 32 || requested == 64) return requested;
  // Bytes one CTA stages per k-tile: its 64 activation rows (padded) plus its E4M3 weight rows.
  const int64_t sms = sm_count > 0 ? sm_count : 1, m_blocks = (m + 63) / 64;
  auto busiest = [&](int64_t columns) {
    const int64_t ctas = m_blocks * ((n + columns - 1) / columns);
    return (ctas + sms - 1) / sms * (64 * kARowBytes + columns * kKTile);
  };
  return busiest(64) <= busiest(32) ? 64 : 32;
}

int gemm_mma_columns(int requested, int64_t m, int64_t n, WeightFormat format, int sm_count) {
  if (m > 16) return 32;
  if (requested == 32 || requested == 64) return requested;
  if (requested != 0) throw internal_error("gemm mma: no CTA width of " + std::to_string(requested) + " columns (32, 64)");
  // The SM with the most CTAs sets the time, and it streams (CTAs on it) x (CTA width) weight rows;
  // take the width with the least. On a tie E4M3 weights take the wider one (it fetches the
  // activations from L2 half as often), bf16 weights the narrower one (twice the bytes per row:
  // two CTAs per SM keep more of them in flight).
  const int64_t sms = sm_count > 0 ? sm_count : 1;
  const bool wider_on_tie = format == WeightFormat::kE4M3;
  int best = 32;
  int64_t best_rows = INT64_MAX;
  for (int columns : {32, 64}) {
    const int64_t ctas = (n + columns - 1) / columns;
    const int64_t rows = (ctas + sms - 1) / sms * columns;
    if (rows < best_rows || (rows == best_rows && wider_on_tie)) {
      best = columns;
      best_rows = rows;
    }
  }
  return best;
}

void prepare_gemm_kernels() {
  prepare<true, 4, 4>();
  prepare<true, 4, 8>();
  prepare<false, 4, 4>();
  prepare_deep<true, 4, false>();
  prepare_deep<true, 4, true>();
  prepare_deep<true, 8, false>();
  prepare_deep<true, 8, true>();
  prepare_deep<false, 4, false>();
  prepare_deep<false, 4, true>();
  prepare_deep<false, 8, false>();
}

void launch_gemm_mma(const GemmContext& ctx, const uint16_t* a, int64_t lda, int64_t m, const DeviceMatrixView& w,
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
  const int columns = gemm_mma_columns(ctx.mma_columns, m, w.n, w.format, ctx.sm_count);
  if (fp8) {
    if (m <= 16) {
      launch_small_m<true>(columns, ctx.stream, ctx.pdl, ctx.sm_count, p, w.n);
    } else {
      launch_large_m<true>(gemm_mma_columns_m64(ctx.mma_columns_m64, m, w.n, w.format, ctx.sm_count), ctx.stream, ctx.pdl, p,
                           m, w.n);
    }
  } else {
    if (m <= 16) launch_small_m<false>(columns, ctx.stream, ctx.pdl, ctx.sm_count, p, w.n); else launch<false, 4, 4>(ctx.stream, ctx.pdl, p, m, w.n);
  }
}

DFLASH_DEVICE_MUTATION_SETTER(gemm_mma)

}  // namespace dflash
