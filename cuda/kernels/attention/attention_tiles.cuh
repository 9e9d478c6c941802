// The building blocks of the attention kernels (attention.cu): where a sequence's keys live, and
// the tensor-core work of one 64-key chunk for one m-tile of 16 query rows (S = Q·Kᵀ, the masked
// softmax statistics, the P·V passes) and the fold of a chunk into the running results. The
// split-KV kernel stores each chunk's results as partials for the combine; the whole-window kernel
// folds them in chunk order as the combine does (fold_in). Both run these pieces, so both give the
// same bits.
//
// Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"), lane = 4g + t:
//   A (16x16): reg0 = (row g, cols 2t, 2t+1), reg1 = (row g+8, cols 2t, 2t+1),
//              reg2 = (row g, cols 2t+8, 2t+9), reg3 = (row g+8, cols 2t+8, 2t+9); low half = lower col.
//   B (16x8, .col): reg0 = (rows k 2t, 2t+1; col n g), reg1 = (rows k 2t+8, 2t+9; col n g).
//   C (16x8 fp32): c0, c1 = (row g, cols 2t, 2t+1), c2, c3 = (row g+8, cols 2t, 2t+1).
// S: A = Q rows (loaded straight from global memory), B(k = dim, n = key) = K[key][dim]: K row-major
// in shared memory is the .col operand; ldmatrix.x4 (no .trans) of keys n0..n0+15 × dims
// 16kk..16kk+15 gives the B registers of two n-tiles (matrix 0/1: keys n0..+7, dims +0/+8; matrix
// 2/3: keys n0+8..+15). P·V: the C fragments of S n-tiles 2kk and 2kk+1 are the A fragment of k-step
// kk (keys 16kk..16kk+15); B(k = key, n = dim) = V[key][dim] comes from ldmatrix.x4.trans (matrix
// 0/1: keys 16kk..+7 / +8..+15 of dims n0..n0+7, matrix 2/3: the same keys of dims n0+8..+15).
// Staged K and V rows are padded by 16 bytes so that the 8 row addresses of every ldmatrix phase
// hit distinct banks.
//
// Precision: scores are fp32 (bf16 products are exact) times the scale with __fmul_rn; p = expf(s -
// m) in fp32. p is split into two bf16 parts hi = bf16_rn(p), mid = bf16_rn(p - hi) (the difference
// exact in fp32), so hi + mid is p within 2^-16 relative: the dropped remainder is at most 2^-8 of
// p - hi, itself at most 2^-8 of p. hi·V goes to one accumulator, mid·V to a second one (at most
// 2^-8 of the first, so its rounding errors are negligible); the two are added once, in fp32, at
// the end of the chunk. (A third part made hi + mid + lo exact at a third mma per V tile: 75 µs
// of the fp8 batch-32 propose's 3310, against an error 2^-8 below the bf16 store of the output.) Every
// reduction has a fixed order (mma k-steps in order, per-thread trees, xor shuffles), no atomics.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/kernels/attention/attention.h"
#include "cuda/runtime/cp_async.cuh"  // cp_async_commit, cp_async_wait

namespace dflash {
namespace attention_tiles {

constexpr int kPassColumns = 64;  // output columns per P·V pass: accumulators stay at 2 x 32 floats

// bf16 elements per staged K / V row: D plus 16 bytes.
template <int D>
constexpr int row_stride() {
  static_assert(D % kPassColumns == 0 && D <= kAttentionMaxHeadDim, "head_dim must be a multiple of 64");
  return D + 8;
}

// Keys of the chunk starting at first_key (< total_keys): 64, or the window's remainder.
__device__ __forceinline__ int chunk_keys(int64_t total_keys, int64_t first_key) {
  return static_cast<int>(total_keys - first_key < kAttentionChunk ? total_keys - first_key : kAttentionChunk);
}

// One sequence's window, read once per kernel: key j is context position begin + j in the paged
// pools while j < length, else block row j - length in the scratch.
struct SequenceWindow {
  int64_t begin = 0;       // first position attended to
  int64_t first_page = 0;  // logical page of the table's first entry
  int length = 0;          // context positions attended to
  const int32_t* table = nullptr;
};

__device__ __forceinline__ SequenceWindow sequence_window(const AttentionArgs& a, int b) {
  SequenceWindow w;
  w.begin = a.window_begin[b];
  w.first_page = a.first_logical_page[b];
  w.length = a.window_length[b];
  w.table = a.block_tables + static_cast<int64_t>(b) * a.max_pages_per_seq;
  return w;
}

// Where key j of sequence b lives, for kv head `kv_head`: its K and V rows.
struct KeyRows {
  const __nv_bfloat16* k = nullptr;
  const __nv_bfloat16* v = nullptr;
};

__device__ __forceinline__ KeyRows key_rows(const AttentionArgs& a, const SequenceWindow& w, int b, int64_t j,
                                            int kv_head) {
  const int64_t kv_dim = static_cast<int64_t>(a.num_kv_heads) * a.head_dim;
  int64_t row;
  const uint16_t *k, *v;
  if (j < w.length) {
    const int64_t position = w.begin + j;
    const int64_t page = w.table[position / a.page_size - w.first_page];
    row = page * a.page_size + position % a.page_size;
    k = a.k_pool;
    v = a.v_pool;
  } else {
    row = static_cast<int64_t>(b) * a.block_width + (j - w.length);
    k = a.k_block;
    v = a.v_block;
  }
  const int64_t offset = row * kv_dim + static_cast<int64_t>(kv_head) * a.head_dim;
  return {reinterpret_cast<const __nv_bfloat16*>(k + offset), reinterpret_cast<const __nv_bfloat16*>(v + offset)};
}

// The first key (index into window then block) that block row i sees: 0 in a full layer; in a
// sliding layer the context position s + i - (W - 1), i.e. window_length - (W - 1) + i, clamped to
// the window (block keys, at window_length and on, are always seen since B <= W).
__device__ __forceinline__ int64_t first_visible_key(const AttentionArgs& a, int window_length, int64_t i) {
  if (a.window_left < 0) return 0;
  const int64_t first = static_cast<int64_t>(window_length) - a.window_left + i;
  return first < 0 ? 0 : (first > window_length ? window_length : first);
}

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared; src_bytes 0 fills the destination with zeros (reads nothing).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address)
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address)
               : "memory");
}

// c += a · b for one 16x8x16 tile (bf16 inputs, fp32 accumulators).
__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t bf16x2_bits(__nv_bfloat162 v) {
  return (static_cast<uint32_t>(__bfloat16_as_ushort(v.y)) << 16) | __bfloat16_as_ushort(v.x);
}

// (x0, x1) ~ hi + mid, each part a bf16 pair (x0 in the low half), within 2^-16 relative.
__device__ __forceinline__ void split_bf16x2(float x0, float x1, uint32_t& hi, uint32_t& mid) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
  hi = bf16x2_bits(h);
  mid = bf16x2_bits(__floats2bfloat162_rn(__fsub_rn(x0, __low2float(h)), __fsub_rn(x1, __high2float(h))));
}

// A CTA's query rows for one kv head: row r = (block row r / group, head kv_head·group + r % group),
// split into m-tiles of 16 rows.
struct QueryRows {
  int b = 0, kv_head = 0, group = 0, count = 0;
};

// A fragments of the 16 query rows of m-tile `tile` for every k-step (zero past the last row).
template <int D>
__device__ __forceinline__ void load_query_fragments(uint32_t (&qf)[D / 16][4], const AttentionArgs& a,
                                                     const QueryRows& q, int tile, int lane) {
  const int g = lane >> 2, t = lane & 3;
  auto row_words = [&](int r) -> const uint32_t* {
    if (r >= q.count) return nullptr;
    const int64_t row = static_cast<int64_t>(q.b) * a.block_width + r / q.group;
    const int head = q.kv_head * q.group + r % q.group;
    return reinterpret_cast<const uint32_t*>(a.q + (row * a.num_heads + head) * D);
  };
  const uint32_t* row0 = row_words(tile * 16 + g);
  const uint32_t* row1 = row_words(tile * 16 + g + 8);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {  // word w holds columns 2w, 2w + 1
    qf[kk][0] = row0 != nullptr ? row0[kk * 8 + t] : 0u;
    qf[kk][1] = row1 != nullptr ? row1[kk * 8 + t] : 0u;
    qf[kk][2] = row0 != nullptr ? row0[kk * 8 + 4 + t] : 0u;
    qf[kk][3] = row1 != nullptr ? row1[kk * 8 + 4 + t] : 0u;
  }
}

// ldmatrix row addresses of a lane (lane = 8·matrix + row), in bytes from the staged tiles' bases:
//   K: key (lane & 7) + 8·(lane >> 4), dim 8·((lane >> 3) & 1) (+ n-tile pair and k-step offsets)
//   V: key (lane & 7) + 8·((lane >> 3) & 1), dim 8·(lane >> 4)     (+ k-step and column offsets)
template <int D>
__device__ __forceinline__ uint32_t k_lane_offset(int lane) {
  return static_cast<uint32_t>((((lane & 7) + ((lane >> 4) << 3)) * row_stride<D>() + (((lane >> 3) & 1) << 3)) * 2);
}
template <int D>
__device__ __forceinline__ uint32_t v_lane_offset(int lane) {
  return static_cast<uint32_t>((((lane & 7) + (((lane >> 3) & 1) << 3)) * row_stride<D>() + ((lane >> 4) << 3)) * 2);
}

// S = Q·Kᵀ for the tile's 16 rows × the chunk's 64 staged keys: n-tile j holds keys 8j..8j+7.
template <int D>
__device__ __forceinline__ void chunk_scores(float (&s)[8][4], const uint32_t (&qf)[D / 16][4], uint32_t k_address) {
  constexpr int kStride = row_stride<D>();
#pragma unroll
  for (int j = 0; j < 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      uint32_t kb[4];
      ldmatrix_x4(kb, k_address + static_cast<uint32_t>((np * 16 * kStride + kk * 16) * 2));
      mma_bf16_16816(s[2 * np], qf[kk], kb[0], kb[1]);
      mma_bf16_16816(s[2 * np + 1], qf[kk], kb[2], kb[3]);
    }
  }
}

// Which keys of a chunk the lane's rows g and g + 8 see: key k (0..63) with k < keys and
// k >= seen (a sliding layer's left edge moves with the block row).
struct ChunkRows {
  int keys = 0;
  int64_t seen0 = 0, seen1 = 0;
  bool all_seen = false;  // every row of the warp sees all 64 keys: no mask to apply (same bits)
};

__device__ __forceinline__ ChunkRows chunk_rows(const AttentionArgs& a, int window_length, int64_t first_key, int keys,
                                                int group, int tile, int g) {
  ChunkRows r;
  r.keys = keys;
  r.seen0 = first_visible_key(a, window_length, (tile * 16 + g) / group) - first_key;
  r.seen1 = first_visible_key(a, window_length, (tile * 16 + g + 8) / group) - first_key;
  r.all_seen = __all_sync(0xffffffffu, keys == kAttentionChunk && r.seen0 <= 0 && r.seen1 <= 0);
  return r;
}

// Scales the scores of the keys each row sees (-inf elsewhere) and returns the rows' maxima. A row
// that sees no key of the chunk gets m = -inf.
__device__ __forceinline__ void chunk_scale_max(float (&s)[8][4], float scale, const ChunkRows& r, int t, float& m0,
                                                float& m1) {
  m0 = -INFINITY;
  m1 = -INFINITY;
  if (r.all_seen) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        s[j][c] = __fmul_rn(s[j][c], scale);
        s[j][c + 2] = __fmul_rn(s[j][c + 2], scale);
        m0 = fmaxf(m0, s[j][c]);
        m1 = fmaxf(m1, s[j][c + 2]);
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int key = j * 8 + 2 * t + c;
        const bool valid0 = key < r.keys && key >= r.seen0, valid1 = key < r.keys && key >= r.seen1;
        s[j][c] = valid0 ? __fmul_rn(s[j][c], scale) : -INFINITY;
        s[j][c + 2] = valid1 ? __fmul_rn(s[j][c + 2], scale) : -INFINITY;
        m0 = fmaxf(m0, s[j][c]);
        m1 = fmaxf(m1, s[j][c + 2]);
      }
    }
  }
  m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, 1));
  m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, 2));
  m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, 1));
  m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, 2));
}

// p = expf(s - m) for the keys each row sees (0 elsewhere, so a row without keys has p = 0 and
// l = 0), and the rows' sums l: a fixed tree over the thread's 16 values, then the quad's shuffles.
__device__ __forceinline__ void chunk_exp_sum(float (&s)[8][4], const ChunkRows& r, int t, float m0, float m1, float& l0,
                                              float& l1) {
  // expf everywhere, then the mask as a select: no branch around each expf. Masked keys give
  // expf(-inf - m) = 0, or NaN where m = -inf; the select makes both 0.
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int key = j * 8 + 2 * t + c;
      const float p0 = expf(s[j][c] - m0), p1 = expf(s[j][c + 2] - m1);
      const bool valid0 = r.all_seen || (key < r.keys && key >= r.seen0);
      const bool valid1 = r.all_seen || (key < r.keys && key >= r.seen1);
      s[j][c] = valid0 ? p0 : 0.0f;
      s[j][c + 2] = valid1 ? p1 : 0.0f;
    }
  }
  float sum0[8], sum1[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    sum0[j] = __fadd_rn(s[j][0], s[j][1]);
    sum1[j] = __fadd_rn(s[j][2], s[j][3]);
  }
#pragma unroll
  for (int width = 4; width > 0; width >>= 1) {
#pragma unroll
    for (int j = 0; j < width; ++j) {
      sum0[j] = __fadd_rn(sum0[2 * j], sum0[2 * j + 1]);
      sum1[j] = __fadd_rn(sum1[2 * j], sum1[2 * j + 1]);
    }
  }
  l0 = __fadd_rn(sum0[0], __shfl_xor_sync(0xffffffffu, sum0[0], 1));
  l0 = __fadd_rn(l0, __shfl_xor_sync(0xffffffffu, l0, 2));
  l1 = __fadd_rn(sum1[0], __shfl_xor_sync(0xffffffffu, sum1[0], 1));
  l1 = __fadd_rn(l1, __shfl_xor_sync(0xffffffffu, l1, 2));
}

// The fold of chunk c into the running results, in chunk order, shared by the whole-window kernel
// and the combine: M_c = max(M_{c-1}, m_c), acc_c = acc_{c-1}·exp(M_{c-1} - M_c) + exp(m_c - M_c)·x_c
// for x = l and each element of O. A weight from -inf (no key seen yet, or none in the chunk) is 0,
// not the NaN of exp(-inf - -inf); an unchanged maximum gives exp(0) = 1 exactly.
__device__ __forceinline__ float fold_weight(float from, float to) {
  return from == -INFINITY ? 0.0f : expf(from - to);
}
__device__ __forceinline__ float fold_in(float acc, float acc_weight, float chunk_weight, float chunk_value) {
  return __fadd_rn(__fmul_rn(acc, acc_weight), __fmul_rn(chunk_weight, chunk_value));
}

// One 64-column P·V pass over the chunk: columns pass·64 .. pass·64 + 63 of the unnormalized O,
// element (n, e) = hi[n][e] + lo[n][e] (rows g: e = 0, 1; g + 8: e = 2, 3; column n·8 + 2t + e % 2).
template <int D>
__device__ __forceinline__ void chunk_pv_pass(float (&hi)[8][4], float (&lo)[8][4], const float (&p)[8][4],
                                              uint32_t v_address, int pass) {
  constexpr int kStride = row_stride<D>();
#pragma unroll
  for (int n = 0; n < 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) hi[n][e] = lo[n][e] = 0.0f;
  }
#pragma unroll
  for (int kk = 0; kk < kAttentionChunk / 16; ++kk) {
    // A fragment of keys 16kk..16kk+15 from S n-tiles 2kk (cols 2t, 2t+1) and 2kk+1 (cols 2t+8, 2t+9).
    uint32_t ph[4], pm[4];
    split_bf16x2(p[2 * kk][0], p[2 * kk][1], ph[0], pm[0]);          // row g
    split_bf16x2(p[2 * kk][2], p[2 * kk][3], ph[1], pm[1]);          // row g + 8
    split_bf16x2(p[2 * kk + 1][0], p[2 * kk + 1][1], ph[2], pm[2]);  // row g
    split_bf16x2(p[2 * kk + 1][2], p[2 * kk + 1][3], ph[3], pm[3]);  // row g + 8
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      uint32_t vb[4];
      ldmatrix_x4_trans(vb, v_address + static_cast<uint32_t>((kk * 16 * kStride + pass * kPassColumns + np * 16) * 2));
      mma_bf16_16816(hi[2 * np], ph, vb[0], vb[1]);
      mma_bf16_16816(lo[2 * np], pm, vb[0], vb[1]);
      mma_bf16_16816(hi[2 * np + 1], ph, vb[2], vb[3]);
      mma_bf16_16816(lo[2 * np + 1], pm, vb[2], vb[3]);
    }
  }
}

}  // namespace attention_tiles
}  // namespace dflash
