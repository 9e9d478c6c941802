// The layer chain kernel (layer_chain.h): GEMM and RMSNorm steps of the block forward in one
// persistent kernel, one CTA of 8 warps per SM, a grid-wide barrier between steps.
//
// GEMM steps. Output columns are cut into units of 32 (NT = 4 n-tiles of 8); unit u of GEMM g runs
// on CTA (u + rotation_g) mod ctas, rotation_g being the units of the GEMMs before g, so the
// CTAs take the units of the whole chain round-robin. Within a unit everything is the deep mma
// kernel's (gemm_mma.cu): warp w reduces k-tiles w, w + 8, ... in order with mma_k_tile, its
// activation fragments loaded straight into registers one k-tile ahead, the 8 partial sums added
// in warp order by reduce_warps_and_store, then the same epilogue.
//
// The weight ring. Each warp owns kStages slots of one 32-row × 64-byte E4M3 k-tile and copies
// its tiles (cp.async, 256-byte L2 fetches) in the order it will consume them: its k-tiles of its
// first unit of the first GEMM, then its next unit, ..., then the next GEMM's; always kStages - 1
// ahead of the tile it computes, across unit and step boundaries. One commit group per consumed
// tile (empty once nothing is left), so "all but the newest kStages - 2 groups complete" means
// "the tile to compute has landed", as in the deep kernel. The first kStages - 1 tiles are issued
// before the PDL wait (weights depend on no kernel), the activations after it.
//
// Reduction buffers. Two, alternating by unit: a unit's __syncthreads in reduce_warps_and_store
// also orders every warp's reads of the buffer two units back before its next writes, so one
// barrier per unit suffices and the ring never has to drain into the reduction buffer.
//
// RMSNorm steps: CTA c normalizes rows c, c + ctas, ... with 256 threads playing the tuned
// kernel's 512 (rmsnorm_row.cuh).
//
// Visibility. Data that other CTAs of this kernel wrote (h, the activations of y, act, x) is read
// with ld.global.cg (L2), never through L1, which is not coherent across SMs within a kernel.
// The barriers are grid_barrier.cuh's.
#include "cuda/layer_chain.h"

#include <cuda_bf16.h>

#include <mutex>
#include <string>

#include "core/error.h"
#include "cuda/cuda_check.h"
#include "cuda/gemm_epilogue.cuh"
#include "cuda/gemm_tiles.cuh"
#include "cuda/grid_barrier.cuh"
#include "cuda/launch.cuh"
#include "cuda/rmsnorm_row.cuh"

namespace dflash {
namespace {

using namespace gemm_tiles;  // the mma building blocks (gemm_tiles.cuh)

// Activations that other CTAs of the chain wrote: loaded through L2 (load_activation_fragments).
constexpr bool kFromOtherCtas = true;

constexpr int kNT = 4;                              // n-tiles of 8 per unit: 32 columns
constexpr int kUnitColumns = kNT * 8;
constexpr int kSlotBytes = kNT * 8 * kKTile;        // one warp's E4M3 k-tile of a unit: 2 KB
constexpr size_t kReduceBytes = reduce_smem_bytes(1, kNT);  // 16.5 KB

// The shared-memory layout: each warp's ring of kStages slots (8 tiles in flight per warp, 128 KB
// per SM), then two reduction buffers (the RMSNorm steps borrow the first for their 16 warp
// sums): 177 KB, so a 36 KB attention CTA still fits beside it (it can start its page lookups and
// window copies before its PDL wait). (Two CTAs per SM with 5 slots each were measured slower on
// an H200: docs/benchmarks.md.)
constexpr int kStages = 9;
constexpr size_t kRingBytes = static_cast<size_t>(kWarps) * kStages * kSlotBytes;
constexpr size_t kSmemBytes = kRingBytes + 2 * kReduceBytes;
static_assert(kSmemBytes + 1024 + 36 * 1024 <= 228 * 1024, "an attention CTA must fit beside the chain's");
constexpr int kNormCopies = rmsnorm_row::kVirtualThreads / kThreads;  // 2 virtual norm threads each
static_assert(kNormCopies * kThreads == rmsnorm_row::kVirtualThreads, "the norm order needs 512 / 256 copies");

struct GemmStep {
  const uint16_t* a;
  int64_t lda;
  const uint8_t* w;  // E4M3 codes [n, ldw]
  int64_t ldw;
  int k_tiles;
  int units;     // ceil(n / 32)
  int rotation;  // unit u runs on CTA (u + rotation) % ctas
  EpilogueArgs e;
};

struct ChainParams {
  GemmStep gemm[kLayerChainMaxGemms];
  RmsNormArgs norm[kLayerChainMaxNorms];
  int8_t step_is_norm[kLayerChainMaxSteps];
  int8_t step_index[kLayerChainMaxSteps];  // into gemm[] or norm[]
  int steps, gemms;
  int ctas;
  unsigned long long* barrier;
};

__device__ __forceinline__ int first_unit(const GemmStep& g, int cta, int ctas) {
  const int u = (cta - g.rotation) % ctas;
  return u < 0 ? u + ctas : u;
}

// One warp's position in its weight stream: GEMM `gemm`, column unit `unit`, its tile `tile` of
// that unit (k-tile warp + 8·tile). gemm == p.gemms: nothing left.
struct TileCursor {
  int gemm, unit, tile;

  __device__ __forceinline__ void start(const ChainParams& p, int cta, int warp) {
    gemm = 0;
    unit = p.gemms > 0 ? first_unit(p.gemm[0], cta, p.ctas) : 0;
    tile = 0;
    settle(p, cta, warp);
  }
  // Moves forward to the first position that holds a tile (or the end).
  __device__ __forceinline__ void settle(const ChainParams& p, int cta, int warp) {
    while (gemm < p.gemms) {
      const GemmStep& g = p.gemm[gemm];
      const int tiles = warp_tiles(g.k_tiles, warp);
      if (tiles > 0 && unit < g.units) {
        if (tile < tiles) return;
        unit += p.ctas;
        tile = 0;
        continue;
      }
      if (++gemm < p.gemms) {
        unit = first_unit(p.gemm[gemm], cta, p.ctas);
        tile = 0;
      }
    }
  }
};

// RMSNorm rows cta, cta + ctas, ... of `a` (rmsnorm_row.cuh's order, 2 virtual threads each).
__device__ __forceinline__ void norm_rows(const RmsNormArgs& a, int cta, int ctas, float* scratch) {
  const int vecs = static_cast<int>(a.cols / 4);
  for (int64_t row = cta; row < a.rows; row += ctas) {
    const float4* in = reinterpret_cast<const float4*>(a.in + row * a.ld_in);
    float4 x[kNormCopies][rmsnorm_row::kMaxVecs];
#pragma unroll
    for (int j = 0; j < kNormCopies; ++j)
#pragma unroll
      for (int i = 0; i < rmsnorm_row::kMaxVecs; ++i) {
        const int v = i * rmsnorm_row::kVirtualThreads + rmsnorm_row::virtual_thread<kNormCopies>(j);
        if (v < vecs) x[j][i] = __ldcg(in + v);
      }
    const float r = rmsnorm_row::row_inverse_rms<kNormCopies>(x, vecs, a.cols, a.eps, scratch);
    rmsnorm_row::store_row<kNormCopies>(a, row, x, vecs, r);
  }
}

// One warp's weight ring: S slots, and where its next copy comes from. Tile j of the warp's stream
// lives in slot j % S. The per-tile path is a handful of instructions (the chain is issue-bound:
// ncu showed ~2 warps per scheduler issuing every ~5.6 cycles): within a unit the lane's four
// source pointers advance by one k-tile of this warp (8 · 64 bytes) per copy, and the stream
// position (TileCursor) is only walked when a unit ends. The bytes copied, and where they land,
// are issue_weight_tile's.
template <int S>
struct WeightRing {
  uint8_t* slots;
  TileCursor next;  // the unit being copied (next.tile: its first tile not yet copied)
  const uint8_t* src[4];  // this lane's pieces of the next tile: rows lane/4 + 8·i, bytes 16·(lane % 4)
  uint32_t valid;         // bit i: row i lies below n (else its 16 bytes are zero-filled)
  int left = 0;           // tiles of the current unit still to copy; 0 and next.gemm == gemms: done
  int slot_in = 0, slot_out = 0;

  // Points the copies at tile next.tile of unit next.unit (or marks the stream done).
  __device__ __forceinline__ void begin_unit(const ChainParams& p, int warp, int lane) {
    if (next.gemm >= p.gemms) {
      left = 0;
      return;
    }
    const GemmStep& s = p.gemm[next.gemm];
    const int64_t n0 = static_cast<int64_t>(next.unit) * kUnitColumns;
    const int kt = warp + kWarps * next.tile;
    valid = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t row = n0 + (lane >> 2) + 8 * i;
      const bool in = row < s.e.n;
      valid |= in ? 1u << i : 0u;
      src[i] = s.w + (in ? row : 0) * s.ldw + static_cast<int64_t>(kt) * kKTile + (lane & 3) * 16;
    }
    left = warp_tiles(s.k_tiles, warp) - next.tile;
  }

  __device__ __forceinline__ void start(const ChainParams& p, uint8_t* ring, int cta, int warp, int lane) {
    slots = ring;
    next.start(p, cta, warp);
    begin_unit(p, warp, lane);
  }

  // Copies the next tile of the stream (if any is left) and closes a commit group.
  __device__ __forceinline__ void issue(const ChainParams& p, int cta, int warp, int lane) {
    if (left > 0) {
      uint8_t* dst = slots + slot_in * kSlotBytes + lane * 16;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        cp_async_16_stream(dst + i * 512, src[i], (valid >> i) & 1u);
        src[i] += kWarps * kKTile;  // this warp's next k-tile of the same rows
      }
      if (++slot_in == S) slot_in = 0;
      if (--left == 0) {
        next.tile = warp_tiles(p.gemm[next.gemm].k_tiles, warp);
        next.settle(p, cta, warp);
        begin_unit(p, warp, lane);
        // Its last weight copy is issued: the next kernel may be scheduled (its own PDL wait
        // still waits for this kernel to finish).
        if (left == 0) pdl_launch_dependents();
      }
    }
    cp_async_commit();
  }
  // The oldest uncomputed tile, once it has landed; the next copy goes into the slot computed last.
  __device__ __forceinline__ const uint8_t* wait_next(const ChainParams& p, int cta, int warp, int lane) {
    cp_async_wait<S - 2>();  // the tile in slot_out has landed
    __syncwarp();            // ... for every lane, and the slot computed last is no longer read
    issue(p, cta, warp, lane);
    const uint8_t* tile = slots + slot_out * kSlotBytes;
    if (++slot_out == S) slot_out = 0;
    return tile;
  }
};

// One GEMM step for this CTA: its units of the step, in order. Each warp keeps the activation
// fragments of D k-tiles in registers, D - 1 ahead of the one it computes (D = 2 as the deep
// kernel; 1 where the warp's tile count is odd), and the look-ahead runs on into the next unit
// (every unit of a step reads the same activation tiles). (Measured on an H200: 4 tiles in
// registers changed nothing, docs/benchmarks.md.)
template <int D, int S>
__device__ __forceinline__ void gemm_units(const ChainParams& p, const GemmStep& gs, int tiles, WeightRing<S>& ring,
                                           uint8_t* reduce, int& parity, int cta, int warp, int lane) {
  const int g = lane >> 2, t = lane & 3;
  const uint16_t* rows[2];
  activation_rows(rows, gs.a, gs.lda, 0, gs.e.m, g, t);
  uint4 a[D][2][2];
  const int first = first_unit(gs, cta, p.ctas);
  if (first < gs.units) {
#pragma unroll
    for (int d = 0; d + 1 < D; ++d) {
      if (d < tiles) load_activation_fragments<kFromOtherCtas>(a[d], rows, warp + kWarps * d);
    }
  }
  for (int unit = first; unit < gs.units; unit += p.ctas) {
    const int64_t n0 = static_cast<int64_t>(unit) * kUnitColumns;
    const bool another = unit + p.ctas < gs.units;
    // Epilogue inputs now; their latency hides behind the unit's k-tiles.
    EpilogueInputs inputs[WarpItems<1, kNT>::kCount];
    load_item_inputs<1, kNT, true, true, true>(inputs, gs.e, 0, n0);  // the residual through L2
    float acc[1][kNT][4];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[0][nt][e] = 0.0f;
    for (int i0 = 0; i0 < tiles; i0 += D) {
#pragma unroll
      for (int d = 0; d < D; ++d) {
        // Tile i + D - 1 (of this unit, or of the next one) into the slot of tile i - 1.
        const int ahead = i0 + d + D - 1;
        if (ahead < tiles) {
          load_activation_fragments<kFromOtherCtas>(a[(d + D - 1) % D], rows, warp + kWarps * ahead);
        } else if (another) {
          load_activation_fragments<kFromOtherCtas>(a[(d + D - 1) % D], rows, warp + kWarps * (ahead - tiles));
        }
        const uint8_t* weights = ring.wait_next(p, cta, warp, lane);
        mma_k_tile<true, kNT>(acc[0], a[d], weights, kKTile, g, t);
      }
    }
    reduce_warps_and_store<1, kNT, false, true>(acc, reduce + parity * kReduceBytes, gs.e, nullptr, 0, n0, inputs);
    parity ^= 1;
  }
}

__global__ void __launch_bounds__(kThreads, 1) layer_chain_kernel(const __grid_constant__ ChainParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int cta = static_cast<int>(blockIdx.x);
  uint8_t* reduce = smem + kRingBytes;
  float* norm_scratch = reinterpret_cast<float*>(reduce);  // free during RMSNorm steps (between barriers)

  WeightRing<kStages> ring;
  ring.start(p, smem + static_cast<size_t>(warp) * kStages * kSlotBytes, cta, warp, lane);
  for (int s = 0; s < kStages - 1; ++s) ring.issue(p, cta, warp, lane);
  pdl_wait();

  // This launch's barriers are the next (steps - 1) · ctas arrivals on the counter (grid_barrier.cuh).
  const unsigned long long per_launch = static_cast<unsigned long long>(p.steps - 1) * p.ctas;
  unsigned long long base = 0;
  if (threadIdx.x == 0) base = launch_base(p.barrier, per_launch);

  int parity = 0;
  for (int s = 0; s < p.steps; ++s) {
    if (s > 0) grid_barrier(p.barrier, base + static_cast<unsigned long long>(s) * p.ctas, s, kLayerChainBarrierTimeoutNs);
    if (s == p.steps - 1) pdl_launch_dependents();
    const int index = p.step_index[s];
    if (p.step_is_norm[s]) {
      norm_rows(p.norm[index], cta, p.ctas, norm_scratch);
      continue;
    }
    const GemmStep& gs = p.gemm[index];
    const int tiles = warp_tiles(gs.k_tiles, warp);
    if (tiles % 2 == 0) {
      gemm_units<2>(p, gs, tiles, ring, reduce, parity, cta, warp, lane);
    } else {
      gemm_units<1>(p, gs, tiles, ring, reduce, parity, cta, warp, lane);
    }
  }
}

void prepare_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    DFLASH_CUDA_CHECK(cudaFuncSetAttribute(layer_chain_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(kSmemBytes)));
  });
}

}  // namespace

std::string layer_chain_refusal(const std::vector<LayerChainStep>& steps) {
  if (steps.empty()) return "no steps";
  if (steps.size() > static_cast<size_t>(kLayerChainMaxSteps)) {
    return std::to_string(steps.size()) + " steps (at most " + std::to_string(kLayerChainMaxSteps) + ")";
  }
  int gemms = 0, norms = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    const LayerChainStep& s = steps[i];
    // Built only for a refusal: launch_layer_chain checks every launch's steps.
    auto where = [i] { return "step " + std::to_string(i) + ": "; };
    if (s.kind == LayerChainStep::Kind::kRmsNorm) {
      ++norms;
      if (s.norm.rows < 1 || s.norm.rows > kLayerChainMaxRows) {
        return where() + "RMSNorm of " + std::to_string(s.norm.rows) + " rows (1 to " + std::to_string(kLayerChainMaxRows) + ")";
      }
      if (!rmsnorm_vec_fits(s.norm, nullptr)) {
        return where() + "an RMSNorm of " + std::to_string(s.norm.cols) +
               " columns that the vectorized kernel does not serve (whole float4s, aligned rows, at most 16384 columns)";
      }
      continue;
    }
    ++gemms;
    if (s.w.format != WeightFormat::kE4M3) return where() + "bf16 weights (the chain streams E4M3 weights)";
    if (s.m < 1 || s.m > kLayerChainMaxRows) {
      return where() + "GEMM of " + std::to_string(s.m) + " rows (1 to " + std::to_string(kLayerChainMaxRows) + ")";
    }
    if (!gemm_mma_operands_fit(s.a, s.lda, s.w)) {
      return where() + "GEMM operands not padded/aligned (k_pad " + std::to_string(s.w.k_pad) + ", lda " +
             std::to_string(s.lda) + ")";
    }
    if ((s.w.n + kUnitColumns - 1) / kUnitColumns > INT32_MAX) return where() + "too many columns";
  }
  if (gemms > kLayerChainMaxGemms || norms > kLayerChainMaxNorms) {
    return std::to_string(gemms) + " GEMMs and " + std::to_string(norms) + " RMSNorms (at most " +
           std::to_string(kLayerChainMaxGemms) + " and " + std::to_string(kLayerChainMaxNorms) + ")";
  }
  return "";
}

void launch_layer_chain(const std::vector<LayerChainStep>& steps, int ctas, unsigned long long* barrier,
                        cudaStream_t stream, bool pdl) {
  const std::string refusal = layer_chain_refusal(steps);
  if (!refusal.empty()) throw internal_error("layer chain: " + refusal);
  if (ctas < 1 || barrier == nullptr) throw internal_error("layer chain: no CTAs or no barrier counter");
  prepare_once();
  ChainParams p = {};
  p.steps = static_cast<int>(steps.size());
  p.ctas = ctas;
  p.barrier = barrier;
  int64_t units_before = 0;
  int norms = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    const LayerChainStep& s = steps[i];
    if (s.kind == LayerChainStep::Kind::kRmsNorm) {
      p.step_is_norm[i] = 1;
      p.step_index[i] = static_cast<int8_t>(norms);
      p.norm[norms++] = s.norm;
      continue;
    }
    GemmStep& g = p.gemm[p.gemms];
    g.a = s.a;
    g.lda = s.lda;
    g.w = static_cast<const uint8_t*>(s.w.data);
    g.ldw = s.w.k_pad;
    g.k_tiles = static_cast<int>(s.w.k_pad / kKTile);
    g.units = static_cast<int>((s.w.n + kUnitColumns - 1) / kUnitColumns);
    g.rotation = static_cast<int>(units_before % ctas);
    g.e = make_epilogue_args(s.w, s.m, s.epilogue);
    units_before += g.units;
    p.step_is_norm[i] = 0;
    p.step_index[i] = static_cast<int8_t>(p.gemms++);
  }
  launch_kernel("layer_chain_kernel", layer_chain_kernel, dim3(static_cast<unsigned>(ctas)), dim3(kThreads), kSmemBytes,
                stream, pdl, p);
}

size_t layer_chain_smem_bytes() { return kSmemBytes; }

int layer_chain_ctas_per_sm() {
  prepare_once();
  int blocks = 0;
  DFLASH_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, layer_chain_kernel, kThreads, kSmemBytes));
  return blocks;
}

}  // namespace dflash
