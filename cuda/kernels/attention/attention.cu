#include "cuda/kernels/attention/attention.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <mutex>
#include <string>

#include "core/error.h"
#include "cuda/runtime/cuda_check.h"
#include "cuda/kernels/attention/attention_tiles.cuh"
#include "cuda/runtime/launch.cuh"
#include "testing/fault_points.cuh"

namespace dflash {
namespace {

using namespace attention_tiles;  // the building blocks of the kernels below (attention_tiles.cuh)

constexpr int kPartialWarps = 4;
constexpr int kPartialThreads = kPartialWarps * 32;
// Query rows (block row x head of the GQA group) one CTA serves: larger blocks and groups spread
// over more CTAs, so no warp runs a long serial chain of rows.
constexpr int kQueryRowsPerCta = 16;
constexpr int kSimpleThreads = 128;

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

size_t partial_smem_bytes(int d) {
  return static_cast<size_t>(kAttentionChunk) * (d + 2) * 2   // keys, rows padded by one word
         + static_cast<size_t>(kAttentionChunk) * d * 2       // values
         + static_cast<size_t>(kPartialWarps) * d * 4         // one query row per warp
         + static_cast<size_t>(kPartialWarps) * kAttentionChunk * 4;  // one probability row per warp
}

// The generic kernel (CUDA cores): one CTA per (chunk of 64 keys, kv head, group of 16 query rows,
// sequence). D > 0: compiled head_dim; D == 0: runtime (only D == 0 is launched).
template <int D>
__global__ void __launch_bounds__(kPartialThreads) attention_partial_kernel(AttentionArgs a) {
  pdl_launch_dependents();
  pdl_wait();
  const int d = D > 0 ? D : a.head_dim;
  const int group = a.num_heads / a.num_kv_heads;
  const int query_rows = a.block_width * group;  // (block row, head of the group) pairs of this kv head
  const int query_groups = (query_rows + kQueryRowsPerCta - 1) / kQueryRowsPerCta;
  const int b = blockIdx.z, kv_head = blockIdx.y / query_groups, chunk = blockIdx.x;
  const int first_query = (blockIdx.y % query_groups) * kQueryRowsPerCta;
  const int last_query = min(first_query + kQueryRowsPerCta, query_rows);
  const SequenceWindow w = sequence_window(a, b);
  const int window_length = w.length;
  const int64_t total_keys = static_cast<int64_t>(window_length) + a.block_width;
  const int64_t first_key = static_cast<int64_t>(chunk) * kAttentionChunk;
  if (first_key >= total_keys) return;  // this sequence's window is shorter than the grid
  const int keys = chunk_keys(total_keys, first_key);
  const int half = d / 2;
  const int key_stride_words = half + 1;
  // Keys before the first one block row 0 sees are seen by no row: staged as zeros, never read.
  const int64_t first_read = first_visible_key(a, window_length, 0);

  extern __shared__ float smem[];
  uint32_t* k_words = reinterpret_cast<uint32_t*>(smem);                    // [64][half + 1]
  __nv_bfloat16* v_tile = reinterpret_cast<__nv_bfloat16*>(k_words + kAttentionChunk * key_stride_words);  // [64][d]
  float* q_rows = reinterpret_cast<float*>(v_tile + kAttentionChunk * d);  // [warps][d]
  float* p_rows = q_rows + kPartialWarps * d;                               // [warps][64]
  __shared__ const __nv_bfloat16* k_src[kAttentionChunk];
  __shared__ const __nv_bfloat16* v_src[kAttentionChunk];

  // Where each key of the chunk lives (one page-table lookup per key), then the copy.
  int kv_read = kv_head;
  DFLASH_DEVICE_MUTATE(kTpWrongShardKvHeads, kv_read = (kv_head + a.num_kv_heads / 2) % a.num_kv_heads);
  for (int jj = threadIdx.x; jj < keys; jj += kPartialThreads) {
    const KeyRows rows = key_rows(a, w, b, first_key + jj, kv_read);
    k_src[jj] = rows.k;
    v_src[jj] = rows.v;
  }
  __syncthreads();
  if (d % 8 == 0) {  // 16-byte pieces (every tuned head_dim)
    const int pieces = d / 8;
    for (int idx = threadIdx.x; idx < keys * pieces; idx += kPartialThreads) {
      const int jj = idx / pieces, piece = idx % pieces;
      const bool read = first_key + jj >= first_read;
      const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
      const uint4 kv = read ? *reinterpret_cast<const uint4*>(k_src[jj] + piece * 8) : zero;
      const uint4 vv = read ? *reinterpret_cast<const uint4*>(v_src[jj] + piece * 8) : zero;
      uint32_t* kd = k_words + jj * key_stride_words + piece * 4;  // rows padded by one word: 4-byte stores
      kd[0] = kv.x;
      kd[1] = kv.y;
      kd[2] = kv.z;
      kd[3] = kv.w;
      *reinterpret_cast<uint4*>(v_tile + jj * d + piece * 8) = vv;
    }
  } else {  // 4-byte pieces (d is even)
    for (int idx = threadIdx.x; idx < keys * half; idx += kPartialThreads) {
      const int jj = idx / half, w = idx % half;
      const bool read = first_key + jj >= first_read;
      k_words[jj * key_stride_words + w] = read ? reinterpret_cast<const uint32_t*>(k_src[jj])[w] : 0u;
      reinterpret_cast<uint32_t*>(v_tile + jj * d)[w] = read ? reinterpret_cast<const uint32_t*>(v_src[jj])[w] : 0u;
    }
  }
  __syncthreads();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t q_dim = static_cast<int64_t>(a.num_heads) * d;
  float* q_row = q_rows + warp * d;
  float* p_row = p_rows + warp * kAttentionChunk;
  for (int qi = first_query + warp; qi < last_query; qi += kPartialWarps) {
    const int i = qi / group;
    const int head = kv_head * group + qi % group;
    const int64_t row = static_cast<int64_t>(b) * a.block_width + i;
    const __nv_bfloat16* q = reinterpret_cast<const __nv_bfloat16*>(a.q) + row * q_dim + static_cast<int64_t>(head) * d;
    for (int e = lane; e < d; e += 32) q_row[e] = __bfloat162float(q[e]);
    __syncwarp();
    const int64_t first_seen = first_visible_key(a, window_length, i);

    float score[2];
    bool seen[2];
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const int jj = lane + 32 * s;
      score[s] = -INFINITY;
      seen[s] = jj < keys && first_key + jj >= first_seen;
      if (seen[s]) {
        const uint32_t* kr = k_words + jj * key_stride_words;
        // Four fixed partial sums (element index mod 4) shorten the dependency chain.
        float dot[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        int w = 0;
        for (; w + 1 < half; w += 2) {
          const __nv_bfloat162 k0 = *reinterpret_cast<const __nv_bfloat162*>(kr + w);
          const __nv_bfloat162 k1 = *reinterpret_cast<const __nv_bfloat162*>(kr + w + 1);
          dot[0] = fmaf(q_row[2 * w], __low2float(k0), dot[0]);
          dot[1] = fmaf(q_row[2 * w + 1], __high2float(k0), dot[1]);
          dot[2] = fmaf(q_row[2 * w + 2], __low2float(k1), dot[2]);
          dot[3] = fmaf(q_row[2 * w + 3], __high2float(k1), dot[3]);
        }
        if (w < half) {
          const __nv_bfloat162 k0 = *reinterpret_cast<const __nv_bfloat162*>(kr + w);
          dot[0] = fmaf(q_row[2 * w], __low2float(k0), dot[0]);
          dot[1] = fmaf(q_row[2 * w + 1], __high2float(k0), dot[1]);
        }
        score[s] = __fmul_rn(__fadd_rn(__fadd_rn(dot[0], dot[1]), __fadd_rn(dot[2], dot[3])), a.scale);
      }
    }
    const float m = warp_max(fmaxf(score[0], score[1]));
    float p_sum = 0.0f;
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const int jj = lane + 32 * s;
      // A row that sees no key of this chunk has m = -inf and p = 0 everywhere (the combine gives
      // the chunk weight 0).
      const float p = seen[s] ? expf(score[s] - m) : 0.0f;
      p_row[jj] = p;
      p_sum = __fadd_rn(p_sum, p);
    }
    const float l = warp_sum(p_sum);
    __syncwarp();

    const int64_t pidx = ((static_cast<int64_t>(b) * a.num_heads + head) * a.max_block_width + i) * a.max_chunks + chunk;
    float* out = a.partial_out + pidx * d;
    for (int e = lane; e < d; e += 32) {
      float o = 0.0f;
      for (int jj = 0; jj < keys; ++jj) o = fmaf(p_row[jj], __bfloat162float(v_tile[jj * d + e]), o);
      out[e] = o;
    }
    if (lane == 0) {
      a.partial_max_sum[pidx * 2] = m;
      a.partial_max_sum[pidx * 2 + 1] = l;
    }
    __syncwarp();  // q_row and p_row are rewritten by the next query row
  }
}

// ---------------------------------------------------------------------------------------------
// Tuned kernels: tensor cores, built from attention_tiles.cuh (fragments and precision there). The
// query rows of a (sequence, kv head) are the (block row i, head of the GQA group) pairs, row
// r = i·group + (head - kv_head·group), in m-tiles of 16 rows; rows past the last are zero and
// never stored.

// Which rows of a chunk one staging call copies: the cached window's rows (and the zero-filled
// ones: past the chunk's keys, or seen by no block row) may be copied before the PDL wait, the
// block rows (qk_norm_rope's output) only after it.
enum class StagedRows { kWindow, kBlock, kAll };

// Stages the K rows of keys [first_key, first_key + 64) and the V columns of the P·V
// passes pass_group, pass_group + pass_ctas, ... (only those are read: the whole-window kernel's
// split; the split-KV kernels read every pass, 0 of 1) into tiles of row_stride<D>() elements per
// row. row_of(jj) gives the KeyRows of key first_key + jj.
template <int D, typename RowOf>
__device__ __forceinline__ void stage_chunk(const RowOf& row_of, const AttentionArgs& a, int64_t first_key, int keys,
                                            int window_length, int64_t first_read, uint32_t k_tile, uint32_t v_tile,
                                            int pass_group, int pass_ctas, StagedRows which) {
  constexpr int kPieces = D / 8;  // 16-byte pieces per row
  for (int idx = threadIdx.x; idx < kAttentionChunk * kPieces; idx += blockDim.x) {
    const int jj = idx / kPieces, piece = idx % kPieces;
    const bool valid = jj < keys && first_key + jj >= first_read;
    if (which != StagedRows::kAll) {
      const bool window_pass = which == StagedRows::kWindow;
      if (valid ? (first_key + jj < window_length) != window_pass : !window_pass) continue;
    }
    const uint32_t offset = static_cast<uint32_t>((jj * row_stride<D>() + piece * 8) * 2);
    const bool v_read = (piece * 8 / kPassColumns) % pass_ctas == pass_group;
    if (!valid) {
      cp_async_16(k_tile + offset, a.k_block, 0);
      if (v_read) cp_async_16(v_tile + offset, a.v_block, 0);
      continue;
    }
    const KeyRows rows = row_of(jj);
    cp_async_16(k_tile + offset, rows.k + piece * 8, 16);
    if (v_read) cp_async_16(v_tile + offset, rows.v + piece * 8, 16);
  }
}

// One m-tile's partials of one staged chunk: S, the chunk's m and l and every 64-column P·V pass
// of its unnormalized O, into the partial buffers. Both split-KV kernels call it, so both give the
// same bits.
template <int D>
__device__ __forceinline__ void chunk_partials(const AttentionArgs& a, const QueryRows& rows, int window_length, int chunk,
                                               int keys, int tile, const uint32_t (&qf)[D / 16][4], uint32_t k_address,
                                               uint32_t v_address, int lane) {
  const int g = lane >> 2, t = lane & 3;
  const int group = rows.group;
  const int64_t first_key = static_cast<int64_t>(chunk) * kAttentionChunk;
  float s[8][4];
  chunk_scores<D>(s, qf, k_address);
  const ChunkRows seen = chunk_rows(a, window_length, first_key, keys, group, tile, g);
  float m0, m1, l0, l1;
  chunk_scale_max(s, a.scale, seen, t, m0, m1);
  chunk_exp_sum(s, seen, t, m0, m1, l0, l1);

  // Where rows g and g + 8 go (-1: a padding row, never stored).
  const int r0 = tile * 16 + g, r1 = r0 + 8;
  auto partial_index = [&](int r) {
    const int head = rows.kv_head * group + r % group;
    return ((static_cast<int64_t>(rows.b) * a.num_heads + head) * a.max_block_width + r / group) * a.max_chunks + chunk;
  };
  const int64_t p0 = r0 < rows.count ? partial_index(r0) : -1;
  const int64_t p1 = r1 < rows.count ? partial_index(r1) : -1;
  if (t == 0) {
    if (p0 >= 0) *reinterpret_cast<float2*>(a.partial_max_sum + p0 * 2) = make_float2(m0, l0);
    if (p1 >= 0) *reinterpret_cast<float2*>(a.partial_max_sum + p1 * 2) = make_float2(m1, l1);
  }
  // O = P·V in passes of 64 output columns.
#pragma unroll 1
  for (int pass = 0; pass < D / kPassColumns; ++pass) {
    float hi[8][4], lo[8][4];
    chunk_pv_pass<D>(hi, lo, s, v_address, pass);
    // Unnormalized partial O (fp32): row g from elements 0, 1, row g + 8 from 2, 3.
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      const int column = pass * kPassColumns + n * 8 + 2 * t;
      if (p0 >= 0) {
        *reinterpret_cast<float2*>(a.partial_out + p0 * D + column) =
            make_float2(__fadd_rn(hi[n][0], lo[n][0]), __fadd_rn(hi[n][1], lo[n][1]));
      }
      if (p1 >= 0) {
        *reinterpret_cast<float2*>(a.partial_out + p1 * D + column) =
            make_float2(__fadd_rn(hi[n][2], lo[n][2]), __fadd_rn(hi[n][3], lo[n][3]));
      }
    }
  }
}

// Split-KV: one CTA per (64-key chunk, kv head, sequence), warp w taking m-tiles w, w + 4, ...; each
// chunk's m, l and unnormalized O go to the partial buffers and the combine kernel merges them.
constexpr int kMmaWarps = 4;
constexpr int kMmaThreads = kMmaWarps * 32;

template <int D>
constexpr size_t mma_smem_bytes() {  // one K and one V tile
  return static_cast<size_t>(2) * kAttentionChunk * row_stride<D>() * sizeof(uint16_t);
}

template <int D>
__global__ void __launch_bounds__(kMmaThreads) attention_mma_kernel(AttentionArgs a) {
  pdl_launch_dependents();
  // Up to the PDL wait below this kernel reads only what no kernel of the block forward writes:
  // the window's K/V rows in the paged pools (written when the context arrived, before the block
  // forward's first kernel, which is launched without PDL), the page tables and window lengths
  // (uploaded before it too). So the page lookups and the window rows' copies overlap the kernels
  // before this one; q and the block rows' K/V (the previous kernel's outputs) come after the wait.
  // Chunks vary slowest, so the CTAs that have keys (the low chunks of every head and sequence)
  // are dispatched first and share the first wave; the empty tail of the grid exits at once.
  const int kv_head = blockIdx.x, b = blockIdx.y, chunk = blockIdx.z;
  const SequenceWindow w = sequence_window(a, b);
  const int64_t total_keys = static_cast<int64_t>(w.length) + a.block_width;
  const int64_t first_key = static_cast<int64_t>(chunk) * kAttentionChunk;
  // This sequence's window is shorter than the grid: exit without waiting. Chunk 0 always has keys
  // (the block rows) and waits, so the grid still ends after the previous kernel.
  if (first_key >= total_keys) return;
  const int keys = chunk_keys(total_keys, first_key);
  const int group = a.num_heads / a.num_kv_heads;
  const QueryRows rows{b, kv_head, group, a.block_width * group};
  const int m_tiles = (rows.count + 15) / 16;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  extern __shared__ __align__(16) unsigned char attention_mma_smem[];
  const uint32_t k_tile = smem_address(attention_mma_smem);
  const uint32_t v_tile = k_tile + static_cast<uint32_t>(kAttentionChunk * row_stride<D>() * 2);
  __shared__ KeyRows sources[kAttentionChunk];

  // Where each key of the chunk lives (one page-table lookup per key), then the copy.
  for (int jj = threadIdx.x; jj < keys; jj += kMmaThreads) sources[jj] = key_rows(a, w, b, first_key + jj, kv_head);
  __syncthreads();
  const int64_t first_read = first_visible_key(a, w.length, 0);
  const auto row_of = [&](int jj) { return sources[jj]; };
  stage_chunk<D>(row_of, a, first_key, keys, w.length, first_read, k_tile, v_tile, 0, 1, StagedRows::kWindow);
  pdl_wait();
  stage_chunk<D>(row_of, a, first_key, keys, w.length, first_read, k_tile, v_tile, 0, 1, StagedRows::kBlock);
  cp_async_commit();
  // This warp's first m-tile of queries: the loads overlap the block rows' copy.
  uint32_t qf[D / 16][4];
  if (warp < m_tiles) load_query_fragments<D>(qf, a, rows, warp, lane);
  cp_async_wait<0>();
  __syncthreads();

  const uint32_t k_address = k_tile + k_lane_offset<D>(lane), v_address = v_tile + v_lane_offset<D>(lane);
  for (int tile = warp; tile < m_tiles; tile += kMmaWarps) {
    if (tile != warp) load_query_fragments<D>(qf, a, rows, tile, lane);
    chunk_partials<D>(a, rows, w.length, chunk, keys, tile, qf, k_address, v_address, lane);
  }
}

// The two-buffer pipeline of the kernels that walk chunks (walking split-KV, whole-window): step s's
// copies were issued during step s - 1 (the first step's before the loop), its page lookups two
// steps ahead. stage(s, which) issues step s's copies, look_up(s) its lookups, math(s) its work.
template <typename Stage, typename LookUp, typename Math>
__device__ __forceinline__ void walk_steps(int steps, const Stage& stage, const LookUp& look_up, const Math& math) {
#pragma unroll 1
  for (int step = 0; step < steps; ++step) {
    cp_async_wait<0>();
    // The step's rows have landed for every thread and every warp is past the previous step: its
    // buffer takes the next step's copies (they overlap this step's math), and the sources of
    // this step, whose copies are all issued, give way to those of step + 2.
    __syncthreads();
    if (step + 1 < steps) {
      stage(step + 1, StagedRows::kAll);
      cp_async_commit();
    }
    math(step);
    if (step + 2 < steps) look_up(step + 2);
  }
}

// Split-KV, walking: gridDim.z CTAs per (kv head, sequence) share the sequence's chunks in balanced
// runs of consecutive chunks, split by the window of this propose (so a graph captured for the
// drafter's longest window still spreads a short one over every CTA). Each computes its chunks'
// partials exactly as attention_mma_kernel does (chunk_partials), the chunks streaming through two
// shared-memory buffers so that a chunk's page lookups and copies overlap the previous chunk's math.
// Where one CTA per chunk would need more than one wave of CTAs, each CTA's fixed costs (the first
// copies' latency, the query loads) then come once per run. Same bits.
template <int D>
constexpr size_t walk_smem_bytes() {  // two buffers of one K and one V tile
  return 2 * mma_smem_bytes<D>();
}

template <int D>
__global__ void __launch_bounds__(kMmaThreads, 3) attention_walk_kernel(AttentionArgs a) {
  pdl_launch_dependents();
  constexpr uint32_t kTileBytes = kAttentionChunk * row_stride<D>() * 2;
  const int kv_head = blockIdx.x, b = blockIdx.y;
  const SequenceWindow w = sequence_window(a, b);
  const int64_t total_keys = static_cast<int64_t>(w.length) + a.block_width;
  const int64_t chunks = (total_keys + kAttentionChunk - 1) / kAttentionChunk;
  const int first_chunk = static_cast<int>(blockIdx.z * chunks / gridDim.z);
  const int steps = static_cast<int>((blockIdx.z + 1) * chunks / gridDim.z) - first_chunk;
  // An empty run (more CTAs than chunks): exit without waiting. The run of chunk 0 always waits,
  // so the grid still ends after the previous kernel.
  if (steps <= 0) return;
  const int group = a.num_heads / a.num_kv_heads;
  const QueryRows rows{b, kv_head, group, a.block_width * group};
  const int m_tiles = (rows.count + 15) / 16;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t first_read = first_visible_key(a, w.length, 0);

  extern __shared__ __align__(16) unsigned char attention_walk_smem[];
  const uint32_t buffers = smem_address(attention_walk_smem);
  // The keys of the next two steps (one page-table lookup per key), read when their copies are issued.
  __shared__ KeyRows sources[2][kAttentionChunk];
  auto keys_of = [&](int step) {
    return chunk_keys(total_keys, static_cast<int64_t>(first_chunk + step) * kAttentionChunk);
  };
  auto look_up = [&](int step) {
    const int64_t first_key = static_cast<int64_t>(first_chunk + step) * kAttentionChunk;
    for (int jj = threadIdx.x; jj < keys_of(step); jj += kMmaThreads) {
      sources[step & 1][jj] = key_rows(a, w, b, first_key + jj, kv_head);
    }
  };
  auto stage = [&](int step, StagedRows which) {
    const int64_t first_key = static_cast<int64_t>(first_chunk + step) * kAttentionChunk;
    const uint32_t k_tile = buffers + static_cast<uint32_t>(step & 1) * 2 * kTileBytes;
    const auto row_of = [&](int jj) { return sources[step & 1][jj]; };
    stage_chunk<D>(row_of, a, first_key, keys_of(step), w.length, first_read, k_tile, k_tile + kTileBytes, 0, 1,
                   which);
  };
  look_up(0);
  if (steps > 1) look_up(1);
  __syncthreads();
  // The first chunk's window rows before the PDL wait (as attention_mma_kernel), its block rows after.
  stage(0, StagedRows::kWindow);
  pdl_wait();
  stage(0, StagedRows::kBlock);
  cp_async_commit();
  uint32_t qf[D / 16][4];
  if (warp < m_tiles) load_query_fragments<D>(qf, a, rows, warp, lane);
  const uint32_t k_lane = k_lane_offset<D>(lane), v_lane = v_lane_offset<D>(lane);
  walk_steps(steps, stage, look_up, [&](int step) {
    const uint32_t k_tile = buffers + static_cast<uint32_t>(step & 1) * 2 * kTileBytes;
    for (int tile = warp; tile < m_tiles; tile += kMmaWarps) {
      if (tile != warp || (step > 0 && m_tiles > kMmaWarps)) load_query_fragments<D>(qf, a, rows, tile, lane);
      chunk_partials<D>(a, rows, w.length, first_chunk + step, keys_of(step), tile, qf, k_tile + k_lane,
                        k_tile + kTileBytes + v_lane, lane);
    }
  });
}

// Whole-window: one CTA per (kv head, sequence) walks every chunk of the window once, computes each
// chunk's m_c, l_c and O_c exactly as the split-KV kernel does and folds them in chunk order with
// the combine's operations (fold_in: a running maximum, the results so far rescaled when it grows).
// The same operations in the same order give the split-KV path's bits, so the choice between the
// two may follow the batch size without breaking batch invariance, and no partial reaches memory.
// The chunks stream through two buffers (a chunk's copies overlap the previous chunk's math). The
// work splits over more CTAs without a bit changing: pass_ctas CTAs take every pass_ctas-th
// 64-column P·V pass (each computes S and the statistics), and the m-tiles go in groups of
// tiles_per_cta to CTAs of one warp per m-tile.
constexpr int kWholeWindowMaxWarps = 4;
constexpr int kWholeWindowMaxOwnPasses = 2;  // per-thread accumulators: 2 passes × 32 floats

template <int D>
constexpr size_t whole_window_smem_bytes() {  // two buffers of one K and one V tile
  return 2 * mma_smem_bytes<D>();
}

template <int D>
__global__ void __launch_bounds__(kWholeWindowMaxWarps * 32)
    attention_whole_window_kernel(AttentionArgs a, int pass_ctas, int tiles_per_cta) {
  pdl_launch_dependents();
  constexpr int kPasses = D / kPassColumns;
  constexpr uint32_t kTileBytes = kAttentionChunk * row_stride<D>() * 2;
  const int kv_head = blockIdx.x / pass_ctas, pass_group = blockIdx.x % pass_ctas, b = blockIdx.y;
  const int group = a.num_heads / a.num_kv_heads;
  const QueryRows rows{b, kv_head, group, a.block_width * group};
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int tile = static_cast<int>(blockIdx.z) * tiles_per_cta + warp;
  const bool has_tile = tile * 16 < rows.count;
  const SequenceWindow w = sequence_window(a, b);
  const int64_t total_keys = static_cast<int64_t>(w.length) + a.block_width;
  const int chunks = static_cast<int>((total_keys + kAttentionChunk - 1) / kAttentionChunk);
  const int64_t first_read = first_visible_key(a, w.length, 0);

  extern __shared__ __align__(16) unsigned char attention_whole_window_smem[];
  const uint32_t buffers = smem_address(attention_whole_window_smem);
  // The keys of the next two chunks (one page-table lookup per key), read when their copies are issued.
  __shared__ KeyRows sources[2][kAttentionChunk];
  auto look_up = [&](int chunk) {
    const int64_t first_key = static_cast<int64_t>(chunk) * kAttentionChunk;
    const int keys = chunk_keys(total_keys, first_key);
    for (int jj = threadIdx.x; jj < keys; jj += blockDim.x) sources[chunk & 1][jj] = key_rows(a, w, b, first_key + jj, kv_head);
  };
  auto stage = [&](int chunk, StagedRows which) {
    const int64_t first_key = static_cast<int64_t>(chunk) * kAttentionChunk;
    const uint32_t k_tile = buffers + static_cast<uint32_t>(chunk & 1) * 2 * kTileBytes;
    const auto row_of = [&](int jj) { return sources[chunk & 1][jj]; };
    stage_chunk<D>(row_of, a, first_key, chunk_keys(total_keys, first_key), w.length, first_read, k_tile, k_tile + kTileBytes,
                   pass_group, pass_ctas, which);
  };
  look_up(0);
  if (chunks > 1) look_up(1);
  __syncthreads();
  // The first chunk's window rows before the PDL wait (as the split-KV kernel), its block rows after.
  stage(0, StagedRows::kWindow);
  pdl_wait();
  stage(0, StagedRows::kBlock);
  cp_async_commit();
  uint32_t qf[D / 16][4];
  if (has_tile) load_query_fragments<D>(qf, a, rows, tile, lane);

  float m0 = -INFINITY, m1 = -INFINITY;  // rows g and g + 8: maxima over the chunks so far
  float l0 = 0.0f, l1 = 0.0f;            // the folded l_c
  float acc[kWholeWindowMaxOwnPasses][8][4];  // the folded O_c of this CTA's passes
#pragma unroll
  for (int p = 0; p < kWholeWindowMaxOwnPasses; ++p) {
#pragma unroll
    for (int n = 0; n < 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[p][n][e] = 0.0f;
    }
  }
  const uint32_t k_lane = k_lane_offset<D>(lane), v_lane = v_lane_offset<D>(lane);
  // One chunk's math for this warp's m-tile: its partials, folded in.
  auto math = [&](int chunk) {
    const int64_t first_key = static_cast<int64_t>(chunk) * kAttentionChunk;
    const uint32_t k_tile = buffers + static_cast<uint32_t>(chunk & 1) * 2 * kTileBytes;
    float s[8][4];
    chunk_scores<D>(s, qf, k_tile + k_lane);
    const ChunkRows seen = chunk_rows(a, w.length, first_key, chunk_keys(total_keys, first_key), group, tile, g);
    float chunk_m0, chunk_m1, chunk_l0, chunk_l1;
    chunk_scale_max(s, a.scale, seen, t, chunk_m0, chunk_m1);
    chunk_exp_sum(s, seen, t, chunk_m0, chunk_m1, chunk_l0, chunk_l1);
    const float new_m0 = fmaxf(m0, chunk_m0), new_m1 = fmaxf(m1, chunk_m1);
    const float acc_w0 = fold_weight(m0, new_m0), acc_w1 = fold_weight(m1, new_m1);
    const float chunk_w0 = fold_weight(chunk_m0, new_m0), chunk_w1 = fold_weight(chunk_m1, new_m1);
    m0 = new_m0;
    m1 = new_m1;
    l0 = fold_in(l0, acc_w0, chunk_w0, chunk_l0);
    l1 = fold_in(l1, acc_w1, chunk_w1, chunk_l1);
#pragma unroll
    for (int p = 0; p < kWholeWindowMaxOwnPasses; ++p) {
      const int pass = pass_group + p * pass_ctas;
      if (pass >= kPasses) break;
      float hi[8][4], lo[8][4];
      chunk_pv_pass<D>(hi, lo, s, k_tile + kTileBytes + v_lane, pass);
#pragma unroll
      for (int n = 0; n < 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          acc[p][n][e] = fold_in(acc[p][n][e], e < 2 ? acc_w0 : acc_w1, e < 2 ? chunk_w0 : chunk_w1,
                                 __fadd_rn(hi[n][e], lo[n][e]));
        }
      }
    }
  };
  walk_steps(chunks, stage, look_up, [&](int chunk) {
    if (has_tile) math(chunk);
  });
  if (!has_tile) return;
  // out = bf16(o / l): row g from elements 0, 1, row g + 8 from 2, 3.
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = tile * 16 + g + 8 * half;
    if (r >= rows.count) continue;
    int head = kv_head * group + r % group;
    DFLASH_DEVICE_MUTATE(kAttentionWrongHead, head = (head + 1) % a.num_heads);
    const float l = half == 0 ? l0 : l1;
    __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(a.out) +
                         (static_cast<int64_t>(b) * a.block_width + r / group) * a.ld_out + static_cast<int64_t>(head) * D;
#pragma unroll
    for (int p = 0; p < kWholeWindowMaxOwnPasses; ++p) {
      const int pass = pass_group + p * pass_ctas;
      if (pass >= kPasses) break;
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        const int column = pass * kPassColumns + n * 8 + 2 * t;
        out[column] = __float2bfloat16_rn(__fdiv_rn(acc[p][n][2 * half], l));
        out[column + 1] = __float2bfloat16_rn(__fdiv_rn(acc[p][n][2 * half + 1], l));
      }
    }
  }
}

// One warp per (block row, query head): merges the chunks in chunk order. Lane l takes columns
// l, l + 32, ... (kColumns of them: head_dim <= 32·kColumns) and loads them for kLoads chunks at a
// time, so the chunks' partials are in flight together. Lane c of each tile of 32 chunks finds the
// running maximum M_c (a prefix max over the lanes, exact in any order) and chunk c's two fold
// weights once; shuffles give them to every lane in chunk order, which folds l and o with fold_in,
// the whole-window kernel's operations. out = bf16(o / l).
constexpr int kCombineWarps = 4;

template <int kColumns>
__global__ void __launch_bounds__(kCombineWarps * 32) attention_combine_kernel(AttentionArgs a) {
  pdl_launch_dependents();
  pdl_wait();
  constexpr int kLoads = kColumns >= 8 ? 8 : 16;
  const int lane = threadIdx.x & 31;
  const int64_t pair = static_cast<int64_t>(blockIdx.x) * kCombineWarps + threadIdx.x / 32;
  if (pair >= static_cast<int64_t>(a.batch) * a.block_width * a.num_heads) return;
  const int64_t row = pair / a.num_heads;
  const int head = static_cast<int>(pair % a.num_heads);
  const int b = static_cast<int>(row / a.block_width), i = static_cast<int>(row % a.block_width);
  const int d = a.head_dim;
  const int64_t total_keys = static_cast<int64_t>(a.window_length[b]) + a.block_width;
  const int chunks = static_cast<int>((total_keys + kAttentionChunk - 1) / kAttentionChunk);
  int64_t base = ((static_cast<int64_t>(b) * a.num_heads + head) * a.max_block_width + i) * a.max_chunks;
  DFLASH_DEVICE_MUTATE(kAttentionWrongHead,
                       base = ((static_cast<int64_t>(b) * a.num_heads + (head + 1) % a.num_heads) * a.max_block_width + i) *
                              a.max_chunks);
  const float* max_sum = a.partial_max_sum + base * 2;
  const float* partial = a.partial_out + base * d;

  float m = -INFINITY;  // the running maximum before the current tile of 32 chunks
  float l = 0.0f, o[kColumns];
#pragma unroll
  for (int k = 0; k < kColumns; ++k) o[k] = 0.0f;
  for (int c0 = 0; c0 < chunks; c0 += 32) {
    float chunk_m = -INFINITY, chunk_l = 0.0f;  // of chunk c0 + lane
    if (c0 + lane < chunks) {
      const float2 ms = *reinterpret_cast<const float2*>(max_sum + (c0 + lane) * 2);
      chunk_m = ms.x;
      chunk_l = ms.y;
    }
    float running = chunk_m;  // M of chunk c0 + lane: the prefix max
    for (int offset = 1; offset < 32; offset <<= 1) {
      const float other = __shfl_up_sync(0xffffffffu, running, offset);
      if (lane >= offset) running = fmaxf(running, other);
    }
    running = fmaxf(running, m);
    float before = __shfl_up_sync(0xffffffffu, running, 1);
    if (lane == 0) before = m;
    const float acc_weight = fold_weight(before, running), chunk_weight = fold_weight(chunk_m, running);
    m = __shfl_sync(0xffffffffu, running, 31);
    const int count = min(32, chunks - c0);
    for (int j0 = 0; j0 < count; j0 += kLoads) {
      float x[kLoads][kColumns];
#pragma unroll
      for (int j = 0; j < kLoads; ++j) {
#pragma unroll
        for (int k = 0; k < kColumns; ++k) {
          const int e = lane + 32 * k;
          x[j][k] = j0 + j < count && e < d ? partial[static_cast<int64_t>(c0 + j0 + j) * d + e] : 0.0f;
        }
      }
#pragma unroll
      for (int j = 0; j < kLoads; ++j) {
        if (j0 + j >= count) break;  // the whole warp leaves together
        const float aw = __shfl_sync(0xffffffffu, acc_weight, j0 + j);
        const float cw = __shfl_sync(0xffffffffu, chunk_weight, j0 + j);
        l = fold_in(l, aw, cw, __shfl_sync(0xffffffffu, chunk_l, j0 + j));
#pragma unroll
        for (int k = 0; k < kColumns; ++k) o[k] = fold_in(o[k], aw, cw, x[j][k]);
      }
    }
  }
  __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(a.out) + row * a.ld_out + static_cast<int64_t>(head) * d;
#pragma unroll
  for (int k = 0; k < kColumns; ++k) {
    const int e = lane + 32 * k;
    if (e < d) out[e] = __float2bfloat16_rn(__fdiv_rn(o[k], l));
  }
}

// Block-wide reductions in a fixed tree: per-thread values, then xor shuffles, then warps in order.
__device__ float block_reduce(float v, bool is_max, float* scratch) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, v, offset);
    v = is_max ? fmaxf(v, other) : __fadd_rn(v, other);
  }
  const int warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __syncthreads();
  if ((threadIdx.x & 31) == 0) scratch[warp] = v;
  __syncthreads();
  float r = scratch[0];
  for (int w = 1; w < warps; ++w) r = is_max ? fmaxf(r, scratch[w]) : __fadd_rn(r, scratch[w]);
  return r;
}

// One CTA per (block row, query head): all scores in shared memory, plain loops.
__global__ void attention_simple_kernel(AttentionArgs a) {
  pdl_launch_dependents();
  pdl_wait();
  extern __shared__ float scores[];  // [total keys] then [warps] reduction scratch
  const int64_t row = blockIdx.x;
  const int head = blockIdx.y;
  const int b = static_cast<int>(row / a.block_width);
  const int d = a.head_dim;
  const int group = a.num_heads / a.num_kv_heads;
  const int kv_head = head / group;
  const SequenceWindow w = sequence_window(a, b);
  const int window_length = w.length;
  const int64_t total_keys = static_cast<int64_t>(window_length) + a.block_width;
  float* scratch = scores + total_keys;
  const __nv_bfloat16* q = reinterpret_cast<const __nv_bfloat16*>(a.q) + row * a.num_heads * d + static_cast<int64_t>(head) * d;
  const int64_t first = first_visible_key(a, window_length, row % a.block_width);  // keys before it: never read

  float local_max = -INFINITY;
  for (int64_t j = first + threadIdx.x; j < total_keys; j += blockDim.x) {
    const __nv_bfloat16* k = key_rows(a, w, b, j, kv_head).k;
    float dot = 0.0f;
    for (int e = 0; e < d; ++e) dot = __fadd_rn(dot, __fmul_rn(__bfloat162float(q[e]), __bfloat162float(k[e])));
    scores[j] = __fmul_rn(dot, a.scale);
    local_max = fmaxf(local_max, scores[j]);
  }
  const float m = block_reduce(local_max, true, scratch);
  float local_sum = 0.0f;
  for (int64_t j = first + threadIdx.x; j < total_keys; j += blockDim.x) {
    scores[j] = expf(scores[j] - m);
    local_sum = __fadd_rn(local_sum, scores[j]);
  }
  const float l = block_reduce(local_sum, false, scratch);  // its barriers also publish scores[]
  __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(a.out) + row * a.ld_out + static_cast<int64_t>(head) * d;
  for (int e = threadIdx.x; e < d; e += blockDim.x) {
    float o = 0.0f;
    for (int64_t j = first; j < total_keys; ++j) {
      const __nv_bfloat16* v = key_rows(a, w, b, j, kv_head).v;
      o = __fadd_rn(o, __fmul_rn(scores[j], __bfloat162float(v[e])));
    }
    out[e] = __float2bfloat16_rn(__fdiv_rn(o, l));
  }
}

// Raises a kernel's dynamic shared-memory limit, once per kernel and process (prepare_attention_kernels
// runs every one before any graph capture).
template <auto kKernel>
void allow_smem(size_t bytes) {
  static std::once_flag once;
  std::call_once(once, [bytes] {
    DFLASH_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  });
}

// The CUDA-core kernel, for any head_dim (generic).
void prepare_generic() { allow_smem<attention_partial_kernel<0>>(partial_smem_bytes(kAttentionMaxHeadDim)); }

void launch_generic(const AttentionArgs& a, cudaStream_t stream, bool pdl) {
  prepare_generic();
  const int query_rows = a.block_width * (a.num_heads / a.num_kv_heads);
  const int query_groups = (query_rows + kQueryRowsPerCta - 1) / kQueryRowsPerCta;
  const dim3 grid(static_cast<unsigned>(a.max_chunks), static_cast<unsigned>(a.num_kv_heads * query_groups),
                  static_cast<unsigned>(a.batch));
  launch_kernel(DFLASH_KERNEL_SITE("attention_partial_kernel"), attention_partial_kernel<0>, grid, dim3(kPartialThreads),
                partial_smem_bytes(a.head_dim), stream, pdl, a);
}

// The tensor-core kernel, head_dim D.
template <int D>
void prepare_mma() {
  allow_smem<attention_mma_kernel<D>>(mma_smem_bytes<D>());
}

// The walking kernel, head_dim D: its CTAs resident per SM, found once (before any capture).
template <int D>
int prepare_walk() {
  static const int resident = [] {
    allow_smem<attention_walk_kernel<D>>(walk_smem_bytes<D>());
    int ctas = 0;
    DFLASH_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, attention_walk_kernel<D>, kMmaThreads,
                                                                    walk_smem_bytes<D>()));
    return std::max(ctas, 1);
  }();
  return resident;
}

// CTAs per (kv head, sequence) of the walking split-KV kernel, or 0 for one CTA per chunk: the
// choice's count (> 0: the kernel tests' walks; -1: off), else 0 where one CTA per chunk (over the
// grid's max_chunks) fits in one wave, else as many as one wave holds (at least 1).
template <int D>
int split_walk_ctas(const AttentionChoice& choice, const AttentionArgs& a) {
  const int resident = prepare_walk<D>();  // also opts the kernel into its shared memory
  if (choice.walk_ctas != 0) return std::max(choice.walk_ctas, 0);
  if (a.sm_count < 1) return 0;
  const int64_t pairs = static_cast<int64_t>(a.num_kv_heads) * a.batch;
  const int64_t wave = static_cast<int64_t>(a.sm_count) * resident;
  if (pairs * a.max_chunks <= wave) return 0;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(wave / pairs, a.max_chunks)));
}

// The split-KV form: one CTA per chunk (walk_ctas 0) or the walking kernel.
template <int D>
void launch_mma(int walk_ctas, const AttentionArgs& a, cudaStream_t stream, bool pdl) {
  prepare_mma<D>();
  if (a.max_chunks > 65535 || a.batch > 65535) {
    throw internal_error("attention: grid too large (" + std::to_string(a.max_chunks) + " chunks, batch " +
                         std::to_string(a.batch) + ")");
  }
  if (walk_ctas > 0) {
    const dim3 grid(static_cast<unsigned>(a.num_kv_heads), static_cast<unsigned>(a.batch), static_cast<unsigned>(walk_ctas));
    launch_kernel(DFLASH_KERNEL_SITE("attention_walk_kernel"), attention_walk_kernel<D>, grid, dim3(kMmaThreads), walk_smem_bytes<D>(), stream,
                  pdl, a);
    return;
  }
  const dim3 grid(static_cast<unsigned>(a.num_kv_heads), static_cast<unsigned>(a.batch),
                  static_cast<unsigned>(a.max_chunks));
  launch_kernel(DFLASH_KERNEL_SITE("attention_mma_kernel"), attention_mma_kernel<D>, grid, dim3(kMmaThreads), mma_smem_bytes<D>(), stream, pdl, a);
}

// The whole-window kernel, head_dim D.
template <int D>
void prepare_whole_window() {
  allow_smem<attention_whole_window_kernel<D>>(whole_window_smem_bytes<D>());
}

// One warp per m-tile, at most kWholeWindowMaxWarps per CTA; the P·V passes split over as many CTAs
// as the accumulators need, and more (up to one pass each) while the grid has fewer CTAs than SMs.
// None of it changes a bit.
template <int D>
void launch_whole_window(const AttentionArgs& a, cudaStream_t stream, bool pdl) {
  prepare_whole_window<D>();
  if (a.batch > 65535) throw internal_error("attention: grid too large (batch " + std::to_string(a.batch) + ")");
  if (a.sm_count < 1) throw internal_error("attention: the device's SM count was not given");
  constexpr int kPasses = D / kPassColumns;
  const int m_tiles = (a.block_width * (a.num_heads / a.num_kv_heads) + 15) / 16;
  const int tiles_per_cta = std::min(m_tiles, kWholeWindowMaxWarps);
  const int tile_ctas = (m_tiles + tiles_per_cta - 1) / tiles_per_cta;
  int pass_ctas = (kPasses + kWholeWindowMaxOwnPasses - 1) / kWholeWindowMaxOwnPasses;
  while (2 * pass_ctas <= kPasses &&
         static_cast<int64_t>(a.batch) * a.num_kv_heads * tile_ctas * pass_ctas < a.sm_count) {
    pass_ctas *= 2;
  }
  const dim3 grid(static_cast<unsigned>(a.num_kv_heads * pass_ctas), static_cast<unsigned>(a.batch),
                  static_cast<unsigned>(tile_ctas));
  launch_kernel(DFLASH_KERNEL_SITE("attention_whole_window_kernel"), attention_whole_window_kernel<D>, grid, dim3(32 * tiles_per_cta),
                whole_window_smem_bytes<D>(), stream, pdl, a, pass_ctas, tiles_per_cta);
}

}  // namespace

std::string AttentionChoice::name() const {
  switch (kernel) {
    case AttentionKernel::kTuned: {
      std::string split = "split-KV";
      if (walk_ctas > 0) {
        split += ", runs of chunks over " + std::to_string(walk_ctas) + (walk_ctas == 1 ? " CTA" : " CTAs") +
                 " per kv head and sequence";
      } else if (walk_ctas == 0) {
        split += ", runs of chunks per CTA past one wave";
      }
      const std::string form = whole_window == WholeWindow::kOn    ? "whole-window"
                               : whole_window == WholeWindow::kOff ? split
                                                                   : split + "; whole-window from " +
                                                                         std::to_string(kAttentionWholeWindowMinWarps) + " warps";
      return "tuned-d" + std::to_string(compiled_head_dim) + " (" + form + ")";
    }
    case AttentionKernel::kGeneric: return "generic";
    case AttentionKernel::kSimple: return "simple";
  }
  return "?";
}

AttentionChoice choose_attention_kernel(const std::string& requested, int head_dim) {
  if (head_dim < 2 || head_dim % 2 != 0 || head_dim > kAttentionMaxHeadDim) {
    throw bad_input("attention: head_dim " + std::to_string(head_dim) +
                    " is not supported by the CUDA drafter (even values up to 256)");
  }
  const bool has_tuned = head_dim == 64 || head_dim == 128 || head_dim == 256;
  AttentionChoice choice;
  if (requested == "auto" || requested == "tuned") {
    if (has_tuned) {
      choice.kernel = AttentionKernel::kTuned;
      choice.compiled_head_dim = head_dim;
    } else if (requested == "tuned") {
      throw bad_input("attention: no tuned kernel is built for head_dim " + std::to_string(head_dim) +
                      " (built: 64, 128, 256); use attention=generic or auto");
    }
  } else if (requested == "generic") {
    choice.kernel = AttentionKernel::kGeneric;
  } else if (requested == "simple") {
    choice.kernel = AttentionKernel::kSimple;
  } else {
    throw bad_input("attention: unknown kernel '" + requested + "' (auto, tuned, generic, simple)");
  }
  return choice;
}

bool attention_runs_whole_window(const AttentionChoice& choice, int batch, int block_width, int num_heads,
                                 int num_kv_heads) {
  if (choice.kernel != AttentionKernel::kTuned) return false;
  switch (choice.whole_window) {
    case WholeWindow::kOn: return true;
    case WholeWindow::kOff: return false;
    case WholeWindow::kAuto: {
      const int64_t m_tiles = (static_cast<int64_t>(block_width) * (num_heads / num_kv_heads) + 15) / 16;
      return static_cast<int64_t>(batch) * num_kv_heads * m_tiles >= kAttentionWholeWindowMinWarps;
    }
  }
  return false;
}

int64_t attention_partial_floats(int max_batch, int num_heads, int max_block_width, int max_chunks, int head_dim) {
  return static_cast<int64_t>(max_batch) * num_heads * max_block_width * max_chunks * head_dim;
}

size_t attention_simple_max_smem_bytes() {
  // Read once (launches inside a graph capture reuse it); the drafters of one process share a device model.
  static const size_t bytes = [] {
    int device = 0, value = 0;
    DFLASH_CUDA_CHECK(cudaGetDevice(&device));
    DFLASH_CUDA_CHECK(cudaDeviceGetAttribute(&value, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    return static_cast<size_t>(value);
  }();
  return bytes;
}

size_t attention_simple_smem_bytes(int64_t max_keys) {
  return static_cast<size_t>(max_keys) * sizeof(float) + (kSimpleThreads / 32) * sizeof(float);
}

void prepare_attention_kernels() {
  prepare_generic();
  prepare_mma<64>();
  prepare_mma<128>();
  prepare_mma<256>();
  prepare_whole_window<64>();
  prepare_whole_window<128>();
  prepare_whole_window<256>();
  prepare_walk<64>();
  prepare_walk<128>();
  prepare_walk<256>();
  cudaFuncAttributes attributes;
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&attributes, attention_combine_kernel<1>));
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&attributes, attention_combine_kernel<2>));
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&attributes, attention_combine_kernel<4>));
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&attributes, attention_combine_kernel<8>));
  DFLASH_CUDA_CHECK(cudaFuncSetAttribute(attention_simple_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(attention_simple_max_smem_bytes())));
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&attributes, attention_simple_kernel));
}

AttentionLaunch attention_launch(const AttentionChoice& choice, const AttentionArgs& a) {
  AttentionLaunch how;
  if (choice.kernel == AttentionKernel::kSimple) {
    how.form = AttentionForm::kSimple;
  } else if (attention_runs_whole_window(choice, a.batch, a.block_width, a.num_heads, a.num_kv_heads)) {
    how.form = AttentionForm::kWholeWindow;
  } else if (choice.kernel == AttentionKernel::kTuned) {
    switch (choice.compiled_head_dim) {
      case 64: how.walk_ctas = split_walk_ctas<64>(choice, a); break;
      case 128: how.walk_ctas = split_walk_ctas<128>(choice, a); break;
      case 256: how.walk_ctas = split_walk_ctas<256>(choice, a); break;
      default: throw internal_error("attention: no tuned kernel for head_dim " + std::to_string(choice.compiled_head_dim));
    }
    how.form = how.walk_ctas > 0 ? AttentionForm::kWalk : AttentionForm::kSplitKv;
  } else {
    how.form = AttentionForm::kGeneric;
  }
  return how;
}

bool AttentionLaunch::combines() const {
  return form == AttentionForm::kGeneric || form == AttentionForm::kSplitKv || form == AttentionForm::kWalk;
}

std::string AttentionLaunch::name() const {
  switch (form) {
    case AttentionForm::kSimple: return "simple";
    case AttentionForm::kGeneric: return "generic split-KV";
    case AttentionForm::kSplitKv: return "tuned split-KV, one CTA per chunk";
    case AttentionForm::kWalk:
      return "tuned split-KV, walking over " + std::to_string(walk_ctas) + (walk_ctas == 1 ? " CTA" : " CTAs") +
             " per kv head and sequence";
    case AttentionForm::kWholeWindow: return "tuned whole-window";
  }
  return "?";
}

void launch_attention_chunks(const AttentionChoice& choice, const AttentionArgs& a, cudaStream_t stream, bool pdl) {
  if (choice.kernel == AttentionKernel::kTuned && choice.compiled_head_dim != a.head_dim) {
    throw internal_error("attention: kernel built for head_dim " + std::to_string(choice.compiled_head_dim) +
                         " asked to run head_dim " + std::to_string(a.head_dim));
  }
  const AttentionLaunch how = attention_launch(choice, a);
  switch (how.form) {
    case AttentionForm::kSimple: {
      const int64_t max_keys = static_cast<int64_t>(a.max_chunks) * kAttentionChunk;
      const size_t smem = attention_simple_smem_bytes(max_keys);
      if (smem > attention_simple_max_smem_bytes()) {
        throw unsupported("attention simple: " + std::to_string(max_keys) + " keys do not fit in shared memory");
      }
      const dim3 grid(static_cast<unsigned>(a.batch * a.block_width), static_cast<unsigned>(a.num_heads));
      launch_kernel(DFLASH_KERNEL_SITE("attention_simple_kernel"), attention_simple_kernel, grid, dim3(kSimpleThreads), smem, stream, pdl, a);
      return;
    }
    case AttentionForm::kWholeWindow:
      switch (choice.compiled_head_dim) {
        case 64: launch_whole_window<64>(a, stream, pdl); return;
        case 128: launch_whole_window<128>(a, stream, pdl); return;
        case 256: launch_whole_window<256>(a, stream, pdl); return;
        default: throw internal_error("attention: no tuned kernel for head_dim " + std::to_string(choice.compiled_head_dim));
      }
    case AttentionForm::kSplitKv:
    case AttentionForm::kWalk:
      switch (choice.compiled_head_dim) {
        case 64: launch_mma<64>(how.walk_ctas, a, stream, pdl); return;
        case 128: launch_mma<128>(how.walk_ctas, a, stream, pdl); return;
        case 256: launch_mma<256>(how.walk_ctas, a, stream, pdl); return;
        default: throw internal_error("attention: no tuned kernel for head_dim " + std::to_string(choice.compiled_head_dim));
      }
    case AttentionForm::kGeneric:
      launch_generic(a, stream, pdl);
      return;
  }
}

void launch_attention_combine(const AttentionChoice& choice, const AttentionArgs& a, cudaStream_t stream, bool pdl) {
  if (!attention_launch(choice, a).combines()) return;  // no partials to combine
  const int64_t pairs = static_cast<int64_t>(a.batch) * a.block_width * a.num_heads;
  const dim3 grid(static_cast<unsigned>((pairs + kCombineWarps - 1) / kCombineWarps));
  const dim3 block(kCombineWarps * 32);
  // The fewest columns per lane that cover head_dim (<= kAttentionMaxHeadDim = 32 x 8).
  if (a.head_dim <= 32) {
    launch_kernel(DFLASH_KERNEL_SITE("attention_combine_kernel"), attention_combine_kernel<1>, grid, block, 0, stream, pdl, a);
  } else if (a.head_dim <= 64) {
    launch_kernel(DFLASH_KERNEL_SITE("attention_combine_kernel"), attention_combine_kernel<2>, grid, block, 0, stream, pdl, a);
  } else if (a.head_dim <= 128) {
    launch_kernel(DFLASH_KERNEL_SITE("attention_combine_kernel"), attention_combine_kernel<4>, grid, block, 0, stream, pdl, a);
  } else {
    launch_kernel(DFLASH_KERNEL_SITE("attention_combine_kernel"), attention_combine_kernel<8>, grid, block, 0, stream, pdl, a);
  }
}

void launch_attention(const AttentionChoice& choice, const AttentionArgs& a, cudaStream_t stream, bool pdl) {
  launch_attention_chunks(choice, a, stream, pdl);
  launch_attention_combine(choice, a, stream, pdl);
}

DFLASH_DEVICE_MUTATION_SETTER(attention)

}  // namespace dflash
