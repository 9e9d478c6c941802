#include "cuda/attention.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <mutex>
#include <string>

#include "core/error.h"
#include "cuda/cuda_check.h"
#include "cuda/launch.cuh"
#include "cuda/mutations.cuh"

namespace dflash {
namespace {

constexpr int kPartialWarps = 4;
constexpr int kPartialThreads = kPartialWarps * 32;
// Query rows (block row x head of the GQA group) one CTA serves: larger blocks and groups spread
// over more CTAs, so no warp runs a long serial chain of rows.
constexpr int kQueryRowsPerCta = 16;
constexpr int kSimpleThreads = 128;

// Where key j of sequence b lives: context position window_begin + j in the paged pool while
// j < window_length, else block row j - window_length in the scratch.
__device__ __forceinline__ const __nv_bfloat16* key_row(const AttentionArgs& a, const uint16_t* pool,
                                                        const uint16_t* block, int b, int64_t j, int window_length,
                                                        int kv_head) {
  const int64_t kv_dim = static_cast<int64_t>(a.num_kv_heads) * a.head_dim;
  const uint16_t* row;
  if (j < window_length) {
    const int64_t position = a.window_begin[b] + j;
    const int64_t logical = position / a.page_size - a.first_logical_page[b];
    const int64_t page = a.block_tables[static_cast<int64_t>(b) * a.max_pages_per_seq + logical];
    row = pool + (page * a.page_size + position % a.page_size) * kv_dim;
  } else {
    row = block + (static_cast<int64_t>(b) * a.block_width + (j - window_length)) * kv_dim;
  }
  return reinterpret_cast<const __nv_bfloat16*>(row) + static_cast<int64_t>(kv_head) * a.head_dim;
}

// The first key (index into window then block) that block row i sees: 0 in a full layer; in a
// sliding layer the context position s + i - (W - 1), i.e. window_length - (W - 1) + i, clamped to
// the window (block keys, at window_length and on, are always seen since B <= W).
__device__ __forceinline__ int64_t first_visible_key(const AttentionArgs& a, int window_length, int64_t i) {
  if (a.window_left < 0) return 0;
  const int64_t first = static_cast<int64_t>(window_length) - a.window_left + i;
  return first < 0 ? 0 : (first > window_length ? window_length : first);
}

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
  const int window_length = a.window_length[b];
  const int64_t total_keys = static_cast<int64_t>(window_length) + a.block_width;
  const int64_t first_key = static_cast<int64_t>(chunk) * kAttentionChunk;
  if (first_key >= total_keys) return;  // this sequence's window is shorter than the grid
  const int keys = static_cast<int>(total_keys - first_key < kAttentionChunk ? total_keys - first_key : kAttentionChunk);
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
  for (int jj = threadIdx.x; jj < keys; jj += kPartialThreads) {
    k_src[jj] = key_row(a, a.k_pool, a.k_block, b, first_key + jj, window_length, kv_head);
    v_src[jj] = key_row(a, a.v_pool, a.v_block, b, first_key + jj, window_length, kv_head);
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
// Tuned kernel: tensor cores (mma.sync.m16n8k16 bf16 -> fp32) for S = Q·Kᵀ and P·V.
//
// One CTA per (64-key chunk, kv head, sequence). Its query rows are the (block row i, head of the
// GQA group) pairs, row r = i·group + (head - kv_head·group), split into m-tiles of 16 rows; warp w
// takes m-tiles w, w + 4, ... Rows past query_rows are zero and never stored. The chunk's K and V
// rows are staged in shared memory with cp.async (16-byte pieces; rows of keys past `keys` are
// zero-filled), each row padded by 16 bytes so that the 8 row addresses of every ldmatrix phase hit
// distinct banks.
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
//
// Precision: scores are fp32 (bf16 products are exact) times the scale with __fmul_rn; p = expf(s -
// m) in fp32, exactly as the CUDA-core kernel. p is never rounded to bf16: it is split exactly into
// three bf16 parts p = hi + mid + lo (hi = bf16_rn(p), mid = bf16_rn(p - hi), lo = p - hi - mid,
// each difference exact in fp32 and lo exactly representable: 24 = 3 x 8 significant bits), and
// hi·V goes to one accumulator while mid·V and lo·V go to a second one (at most 2^-8 of the first,
// so its rounding errors are negligible); the two are added once, in fp32, at the end of the chunk.
// Every reduction has a fixed order (mma k-steps in order, per-thread trees, xor shuffles), no
// atomics: same inputs -> same bits, independent of the other sequences.

constexpr int kMmaWarps = 4;
constexpr int kMmaThreads = kMmaWarps * 32;
constexpr int kPassColumns = 64;  // output columns per P·V pass: accumulators stay at 2 x 32 floats

template <int D>
constexpr int mma_row_stride() {  // bf16 elements per staged K / V row: D plus 16 bytes
  return D + 8;
}
template <int D>
constexpr size_t mma_smem_bytes() {
  return static_cast<size_t>(2) * kAttentionChunk * mma_row_stride<D>() * sizeof(uint16_t);
}

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared; src_bytes 0 fills the destination with zeros (reads nothing).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
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

// (x0, x1) = hi + mid + lo exactly, each part a bf16 pair (x0 in the low half).
__device__ __forceinline__ void split_bf16x3(float x0, float x1, uint32_t& hi, uint32_t& mid, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
  const float r0 = __fsub_rn(x0, __low2float(h)), r1 = __fsub_rn(x1, __high2float(h));
  const __nv_bfloat162 m = __floats2bfloat162_rn(r0, r1);
  const __nv_bfloat162 l = __floats2bfloat162_rn(__fsub_rn(r0, __low2float(m)), __fsub_rn(r1, __high2float(m)));
  hi = bf16x2_bits(h);
  mid = bf16x2_bits(m);
  lo = bf16x2_bits(l);
}

// Query row r of this CTA: block row r / group, head kv_head·group + r % group; null past query_rows.
template <int D>
__device__ __forceinline__ const uint32_t* query_words(const AttentionArgs& a, int b, int kv_head, int group,
                                                       int query_rows, int r) {
  if (r >= query_rows) return nullptr;
  const int64_t row = static_cast<int64_t>(b) * a.block_width + r / group;
  const int head = kv_head * group + r % group;
  return reinterpret_cast<const uint32_t*>(a.q + (row * a.num_heads + head) * D);
}

// A fragments of the 16 query rows of m-tile `tile` for every k-step (zero past query_rows).
template <int D>
__device__ __forceinline__ void load_query_fragments(uint32_t (&qf)[D / 16][4], const AttentionArgs& a, int b,
                                                     int kv_head, int group, int query_rows, int tile, int lane) {
  const int g = lane >> 2, t = lane & 3;
  const uint32_t* row0 = query_words<D>(a, b, kv_head, group, query_rows, tile * 16 + g);
  const uint32_t* row1 = query_words<D>(a, b, kv_head, group, query_rows, tile * 16 + g + 8);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {  // word w holds columns 2w, 2w + 1
    qf[kk][0] = row0 != nullptr ? row0[kk * 8 + t] : 0u;
    qf[kk][1] = row1 != nullptr ? row1[kk * 8 + t] : 0u;
    qf[kk][2] = row0 != nullptr ? row0[kk * 8 + 4 + t] : 0u;
    qf[kk][3] = row1 != nullptr ? row1[kk * 8 + 4 + t] : 0u;
  }
}

template <int D>
__global__ void __launch_bounds__(kMmaThreads) attention_mma_kernel(AttentionArgs a, int pass_ctas) {
  pdl_launch_dependents();
  // Up to the PDL wait below this kernel reads only what no kernel of the block forward writes:
  // the window's K/V rows in the paged pools (written when the context arrived, before the block
  // forward's first kernel, which is launched without PDL), the page tables and window lengths
  // (uploaded before it too). So the page lookups and the window rows' copies overlap the kernels
  // before this one; q and the block rows' K/V (the previous kernel's outputs) come after the wait.
  static_assert(D % kPassColumns == 0 && D <= kAttentionMaxHeadDim, "head_dim must be a multiple of 64");
  constexpr int kStride = mma_row_stride<D>();
  constexpr int kPieces = D / 8;  // 16-byte pieces per row
  // Chunks vary slowest, so the CTAs that have keys (the low chunks of every head and sequence)
  // are dispatched first and share the first wave; the empty tail of the grid exits at once.
  // pass_ctas > 1: that many CTAs share the chunk, each computing S and the softmax statistics
  // (identically) and the P·V passes pass_group, pass_group + pass_ctas, ...: a shorter chain per
  // CTA, the same instructions for every output element (same bits). Only group 0 stores m and l.
  const int kv_head = blockIdx.x / pass_ctas, pass_group = blockIdx.x % pass_ctas, b = blockIdx.y, chunk = blockIdx.z;
  const int window_length = a.window_length[b];
  const int64_t total_keys = static_cast<int64_t>(window_length) + a.block_width;
  const int64_t first_key = static_cast<int64_t>(chunk) * kAttentionChunk;
  // This sequence's window is shorter than the grid: exit without waiting. Chunk 0 always has keys
  // (the block rows) and waits, so the grid still ends after the previous kernel.
  if (first_key >= total_keys) return;
  const int keys = static_cast<int>(total_keys - first_key < kAttentionChunk ? total_keys - first_key : kAttentionChunk);
  const int group = a.num_heads / a.num_kv_heads;
  const int query_rows = a.block_width * group;
  const int m_tiles = (query_rows + 15) / 16;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;

  extern __shared__ __align__(16) unsigned char attention_mma_smem[];
  __nv_bfloat16* k_tile = reinterpret_cast<__nv_bfloat16*>(attention_mma_smem);  // [64][kStride]
  __nv_bfloat16* v_tile = k_tile + kAttentionChunk * kStride;                     // [64][kStride]
  __shared__ const __nv_bfloat16* k_src[kAttentionChunk];
  __shared__ const __nv_bfloat16* v_src[kAttentionChunk];

  // Where each key of the chunk lives (one page-table lookup per key), then the copy.
  for (int jj = threadIdx.x; jj < 2 * kAttentionChunk; jj += kMmaThreads) {
    const int key = jj % kAttentionChunk;
    if (key >= keys) continue;
    if (jj < kAttentionChunk) {
      k_src[key] = key_row(a, a.k_pool, a.k_block, b, first_key + key, window_length, kv_head);
    } else {
      v_src[key] = key_row(a, a.v_pool, a.v_block, b, first_key + key, window_length, kv_head);
    }
  }
  __syncthreads();
  // Copies the rows of keys [0, keys) whose `in_window` matches (rows past `keys`, and window rows
  // that no block row sees, are zero-filled with the window's pass: no garbage reaches 0·v).
  const int64_t first_read = first_visible_key(a, window_length, 0);
  auto copy_rows = [&](bool window_pass) {
    for (int idx = threadIdx.x; idx < kAttentionChunk * kPieces; idx += kMmaThreads) {
      const int jj = idx / kPieces, piece = idx % kPieces;
      const bool valid = jj < keys && first_key + jj >= first_read;
      const bool in_window = first_key + jj < window_length;
      if (valid ? in_window != window_pass : !window_pass) continue;
      const __nv_bfloat16* ks = valid ? k_src[jj] + piece * 8 : reinterpret_cast<const __nv_bfloat16*>(a.k_block);
      const __nv_bfloat16* vs = valid ? v_src[jj] + piece * 8 : reinterpret_cast<const __nv_bfloat16*>(a.v_block);
      cp_async_16(smem_address(k_tile + jj * kStride + piece * 8), ks, valid ? 16 : 0);
      // V: only the columns of this CTA's passes are ever read.
      if ((piece * 8 / kPassColumns) % pass_ctas != pass_group) continue;
      cp_async_16(smem_address(v_tile + jj * kStride + piece * 8), vs, valid ? 16 : 0);
    }
  };
  copy_rows(true);
  pdl_wait();
  copy_rows(false);  // the block rows: qk_norm_rope's output
  // This warp's first m-tile of queries: the loads overlap the block rows' copy.
  uint32_t qf[D / 16][4];
  if (warp < m_tiles) load_query_fragments<D>(qf, a, b, kv_head, group, query_rows, warp, lane);
  cp_async_wait_all();
  __syncthreads();

  const uint32_t k_base = smem_address(k_tile), v_base = smem_address(v_tile);
  // ldmatrix row addresses of this lane (lane = 8·matrix + row), in bytes from the tile bases:
  //   K: key (lane & 7) + 8·(lane >> 4), dim 8·((lane >> 3) & 1) (+ n-tile pair and k-step offsets)
  //   V: key (lane & 7) + 8·((lane >> 3) & 1), dim 8·(lane >> 4)     (+ k-step and column offsets)
  const uint32_t k_lane = static_cast<uint32_t>((((lane & 7) + ((lane >> 4) << 3)) * kStride + (((lane >> 3) & 1) << 3)) * 2);
  const uint32_t v_lane = static_cast<uint32_t>((((lane & 7) + (((lane >> 3) & 1) << 3)) * kStride + ((lane >> 4) << 3)) * 2);

  for (int tile = warp; tile < m_tiles; tile += kMmaWarps) {
    if (tile != warp) load_query_fragments<D>(qf, a, b, kv_head, group, query_rows, tile, lane);

    // S = Q·Kᵀ for 16 rows × 64 keys: n-tile j holds keys 8j..8j+7.
    float s[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t kb[4];
        ldmatrix_x4(kb, k_base + k_lane + static_cast<uint32_t>((np * 16 * kStride + kk * 16) * 2));
        mma_bf16_16816(s[2 * np], qf[kk], kb[0], kb[1]);
        mma_bf16_16816(s[2 * np + 1], qf[kk], kb[2], kb[3]);
      }
    }

    // Softmax statistics of rows g (elements 0, 1) and g + 8 (elements 2, 3) over the keys each
    // row sees (a sliding layer's left edge moves with the block row r / group). A row that sees
    // no key of this chunk keeps m = -inf, l = 0 and a zero partial: the combine weighs it 0.
    const int64_t seen0 = first_visible_key(a, window_length, (tile * 16 + g) / group) - first_key;
    const int64_t seen1 = first_visible_key(a, window_length, (tile * 16 + g + 8) / group) - first_key;
    float m0 = -INFINITY, m1 = -INFINITY;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int key = j * 8 + 2 * t + c;
        const bool valid0 = key < keys && key >= seen0, valid1 = key < keys && key >= seen1;
        s[j][c] = valid0 ? __fmul_rn(s[j][c], a.scale) : -INFINITY;
        s[j][c + 2] = valid1 ? __fmul_rn(s[j][c + 2], a.scale) : -INFINITY;
        m0 = fmaxf(m0, s[j][c]);
        m1 = fmaxf(m1, s[j][c + 2]);
      }
    }
    m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, 1));
    m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, 2));
    m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, 1));
    m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, 2));
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int key = j * 8 + 2 * t + c;
        const bool valid0 = key < keys && key >= seen0, valid1 = key < keys && key >= seen1;
        s[j][c] = valid0 ? expf(s[j][c] - m0) : 0.0f;
        s[j][c + 2] = valid1 ? expf(s[j][c + 2] - m1) : 0.0f;
      }
    }
    // l: a fixed tree over the thread's 16 values of each row, then the quad's xor shuffles.
    float l0, l1;
    {
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

    // Where rows g and g + 8 go (null: a padding row, never stored).
    const int r0 = tile * 16 + g, r1 = r0 + 8;
    auto partial_index = [&](int r) {
      const int head = kv_head * group + r % group;
      return ((static_cast<int64_t>(b) * a.num_heads + head) * a.max_block_width + r / group) * a.max_chunks + chunk;
    };
    const int64_t p0 = r0 < query_rows ? partial_index(r0) : -1;
    const int64_t p1 = r1 < query_rows ? partial_index(r1) : -1;
    if (t == 0 && pass_group == 0) {
      if (p0 >= 0) *reinterpret_cast<float2*>(a.partial_max_sum + p0 * 2) = make_float2(m0, l0);
      if (p1 >= 0) *reinterpret_cast<float2*>(a.partial_max_sum + p1 * 2) = make_float2(m1, l1);
    }

    // O = P·V in passes of 64 output columns (8 n-tiles of 8 dims): this CTA's share of them.
#pragma unroll 1
    for (int pass = pass_group; pass < D / kPassColumns; pass += pass_ctas) {
      float hi_acc[8][4], lo_acc[8][4];
#pragma unroll
      for (int n = 0; n < 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) hi_acc[n][e] = lo_acc[n][e] = 0.0f;
      }
#pragma unroll
      for (int kk = 0; kk < kAttentionChunk / 16; ++kk) {
        // A fragment of keys 16kk..16kk+15 from S n-tiles 2kk (cols 2t, 2t+1) and 2kk+1 (cols 2t+8, 2t+9).
        uint32_t ph[4], pm[4], pl[4];
        split_bf16x3(s[2 * kk][0], s[2 * kk][1], ph[0], pm[0], pl[0]);          // row g
        split_bf16x3(s[2 * kk][2], s[2 * kk][3], ph[1], pm[1], pl[1]);          // row g + 8
        split_bf16x3(s[2 * kk + 1][0], s[2 * kk + 1][1], ph[2], pm[2], pl[2]);  // row g
        split_bf16x3(s[2 * kk + 1][2], s[2 * kk + 1][3], ph[3], pm[3], pl[3]);  // row g + 8
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          uint32_t vb[4];
          ldmatrix_x4_trans(vb, v_base + v_lane +
                                    static_cast<uint32_t>((kk * 16 * kStride + pass * kPassColumns + np * 16) * 2));
          mma_bf16_16816(hi_acc[2 * np], ph, vb[0], vb[1]);
          mma_bf16_16816(lo_acc[2 * np], pm, vb[0], vb[1]);
          mma_bf16_16816(lo_acc[2 * np], pl, vb[0], vb[1]);
          mma_bf16_16816(hi_acc[2 * np + 1], ph, vb[2], vb[3]);
          mma_bf16_16816(lo_acc[2 * np + 1], pm, vb[2], vb[3]);
          mma_bf16_16816(lo_acc[2 * np + 1], pl, vb[2], vb[3]);
        }
      }
      // Unnormalized partial O (fp32): row g from elements 0, 1, row g + 8 from 2, 3.
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        const int column = pass * kPassColumns + n * 8 + 2 * t;
        if (p0 >= 0) {
          *reinterpret_cast<float2*>(a.partial_out + p0 * D + column) =
              make_float2(__fadd_rn(hi_acc[n][0], lo_acc[n][0]), __fadd_rn(hi_acc[n][1], lo_acc[n][1]));
        }
        if (p1 >= 0) {
          *reinterpret_cast<float2*>(a.partial_out + p1 * D + column) =
              make_float2(__fadd_rn(hi_acc[n][2], lo_acc[n][2]), __fadd_rn(hi_acc[n][3], lo_acc[n][3]));
        }
      }
    }
  }
}

// One CTA per (block row, query head): merges the chunks in chunk order. Each chunk's weight
// exp(m_c - m) and weighted sum exp(m_c - m)·l_c are computed once per CTA (a tile of chunks at a
// time, in shared memory); every thread then adds its columns over the chunks in chunk order. The
// arithmetic, and so every bit, is that of the one-thread-per-column loop: m = max_c m_c,
// l = Σ_c exp(m_c - m)·l_c and o = Σ_c exp(m_c - m)·O_c in chunk order, out = bf16(o / l).
constexpr int kCombineThreads = 128;
constexpr int kCombineTile = 256;  // chunks whose weights sit in shared memory at once

__global__ void __launch_bounds__(kCombineThreads) attention_combine_kernel(AttentionArgs a) {
  pdl_launch_dependents();
  pdl_wait();
  __shared__ float weight[kCombineTile];
  __shared__ float weighted_sum[kCombineTile];
  __shared__ float warp_maxima[kCombineThreads / 32];
  const int64_t row = blockIdx.x;
  const int head = blockIdx.y;
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

  // m: the max is exact, so the threads may take the chunks in any grouping.
  float m = -INFINITY;
  for (int c = threadIdx.x; c < chunks; c += kCombineThreads) m = fmaxf(m, max_sum[c * 2]);
  for (int offset = 16; offset > 0; offset >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
  if ((threadIdx.x & 31) == 0) warp_maxima[threadIdx.x >> 5] = m;
  __syncthreads();
  m = warp_maxima[0];
  for (int w = 1; w < kCombineThreads / 32; ++w) m = fmaxf(m, warp_maxima[w]);

  float l = 0.0f;
  constexpr int kColumns = kAttentionMaxHeadDim / kCombineThreads;  // columns threadIdx.x + k·kCombineThreads
  float o[kColumns];
#pragma unroll
  for (int k = 0; k < kColumns; ++k) o[k] = 0.0f;
  for (int c0 = 0; c0 < chunks; c0 += kCombineTile) {
    const int count = min(kCombineTile, chunks - c0);
    __syncthreads();  // the previous tile's weights are no longer read
    for (int c = threadIdx.x; c < count; c += kCombineThreads) {
      const float w = expf(max_sum[(c0 + c) * 2] - m);
      weight[c] = w;
      weighted_sum[c] = __fmul_rn(w, max_sum[(c0 + c) * 2 + 1]);
    }
    __syncthreads();
    for (int c = 0; c < count; ++c) l = __fadd_rn(l, weighted_sum[c]);
#pragma unroll
    for (int k = 0; k < kColumns; ++k) {
      const int e = threadIdx.x + k * kCombineThreads;
      if (e < d) {
        const float* column = partial + static_cast<int64_t>(c0) * d + e;
        float acc = o[k];
#pragma unroll 4
        for (int c = 0; c < count; ++c) acc = __fadd_rn(acc, __fmul_rn(weight[c], column[static_cast<int64_t>(c) * d]));
        o[k] = acc;
      }
    }
  }
  __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(a.out) + row * a.ld_out + static_cast<int64_t>(head) * d;
#pragma unroll
  for (int k = 0; k < kColumns; ++k) {
    const int e = threadIdx.x + k * kCombineThreads;
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
  const int window_length = a.window_length[b];
  const int64_t total_keys = static_cast<int64_t>(window_length) + a.block_width;
  float* scratch = scores + total_keys;
  const __nv_bfloat16* q = reinterpret_cast<const __nv_bfloat16*>(a.q) + row * a.num_heads * d + static_cast<int64_t>(head) * d;
  const int64_t first = first_visible_key(a, window_length, row % a.block_width);  // keys before it: never read

  float local_max = -INFINITY;
  for (int64_t j = first + threadIdx.x; j < total_keys; j += blockDim.x) {
    const __nv_bfloat16* k = key_row(a, a.k_pool, a.k_block, b, j, window_length, kv_head);
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
      const __nv_bfloat16* v = key_row(a, a.v_pool, a.v_block, b, j, window_length, kv_head);
      o = __fadd_rn(o, __fmul_rn(scores[j], __bfloat162float(v[e])));
    }
    out[e] = __float2bfloat16_rn(__fdiv_rn(o, l));
  }
}

// The CUDA-core kernel, for any head_dim (generic).
void prepare_generic() {
  static std::once_flag once;
  std::call_once(once, [] {
    DFLASH_CUDA_CHECK(cudaFuncSetAttribute(attention_partial_kernel<0>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(partial_smem_bytes(kAttentionMaxHeadDim))));
  });
}

void launch_generic(const AttentionArgs& a, cudaStream_t stream, bool pdl) {
  prepare_generic();
  const int query_rows = a.block_width * (a.num_heads / a.num_kv_heads);
  const int query_groups = (query_rows + kQueryRowsPerCta - 1) / kQueryRowsPerCta;
  const dim3 grid(static_cast<unsigned>(a.max_chunks), static_cast<unsigned>(a.num_kv_heads * query_groups),
                  static_cast<unsigned>(a.batch));
  launch_kernel("attention_partial_kernel", attention_partial_kernel<0>, grid, dim3(kPartialThreads),
                partial_smem_bytes(a.head_dim), stream, pdl, a);
}

// The tensor-core kernel, head_dim D.
template <int D>
void prepare_mma() {
  static std::once_flag once;
  std::call_once(once, [] {
    DFLASH_CUDA_CHECK(cudaFuncSetAttribute(attention_mma_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(mma_smem_bytes<D>())));
  });
}

template <int D>
void launch_mma(const AttentionArgs& a, int pass_ctas, cudaStream_t stream, bool pdl) {
  prepare_mma<D>();
  if (a.max_chunks > 65535 || a.batch > 65535) {
    throw internal_error("attention: grid too large (" + std::to_string(a.max_chunks) + " chunks, batch " +
                         std::to_string(a.batch) + ")");
  }
  const int ctas = attention_pass_ctas(pass_ctas, D);
  const dim3 grid(static_cast<unsigned>(a.num_kv_heads * ctas), static_cast<unsigned>(a.batch),
                  static_cast<unsigned>(a.max_chunks));
  launch_kernel("attention_mma_kernel", attention_mma_kernel<D>, grid, dim3(kMmaThreads), mma_smem_bytes<D>(), stream, pdl, a,
                ctas);
}

}  // namespace

std::string AttentionChoice::name() const {
  switch (kernel) {
    case AttentionKernel::kTuned: {
      const int ctas = attention_pass_ctas(pass_ctas, compiled_head_dim);
      return "tuned-d" + std::to_string(compiled_head_dim) +
             (ctas > 1 ? " (P·V passes over " + std::to_string(ctas) + " CTAs)" : "");
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

int attention_pass_ctas(int requested, int head_dim) {
  const int passes = head_dim / kPassColumns;
  return std::max(1, std::min(requested, passes));
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
  cudaFuncAttributes attributes;
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&attributes, attention_combine_kernel));
  DFLASH_CUDA_CHECK(cudaFuncSetAttribute(attention_simple_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(attention_simple_max_smem_bytes())));
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&attributes, attention_simple_kernel));
}

void launch_attention_chunks(const AttentionChoice& choice, const AttentionArgs& a, cudaStream_t stream, bool pdl) {
  if (choice.kernel == AttentionKernel::kTuned && choice.compiled_head_dim != a.head_dim) {
    throw internal_error("attention: kernel built for head_dim " + std::to_string(choice.compiled_head_dim) +
                         " asked to run head_dim " + std::to_string(a.head_dim));
  }
  if (choice.kernel == AttentionKernel::kSimple) {
    const int64_t max_keys = static_cast<int64_t>(a.max_chunks) * kAttentionChunk;
    const size_t smem = attention_simple_smem_bytes(max_keys);
    if (smem > attention_simple_max_smem_bytes()) {
      throw unsupported("attention simple: " + std::to_string(max_keys) + " keys do not fit in shared memory");
    }
    const dim3 grid(static_cast<unsigned>(a.batch * a.block_width), static_cast<unsigned>(a.num_heads));
    launch_kernel("attention_simple_kernel", attention_simple_kernel, grid, dim3(kSimpleThreads), smem, stream, pdl, a);
  } else if (choice.kernel == AttentionKernel::kTuned) {
    switch (choice.compiled_head_dim) {
      case 64: launch_mma<64>(a, choice.pass_ctas, stream, pdl); break;
      case 128: launch_mma<128>(a, choice.pass_ctas, stream, pdl); break;
      case 256: launch_mma<256>(a, choice.pass_ctas, stream, pdl); break;
      default: throw internal_error("attention: no tuned kernel for head_dim " + std::to_string(choice.compiled_head_dim));
    }
  } else {
    launch_generic(a, stream, pdl);
  }
}

void launch_attention_combine(const AttentionChoice& choice, const AttentionArgs& a, cudaStream_t stream, bool pdl) {
  if (choice.kernel == AttentionKernel::kSimple) return;  // no partials to combine
  const dim3 grid(static_cast<unsigned>(a.batch * a.block_width), static_cast<unsigned>(a.num_heads));
  launch_kernel("attention_combine_kernel", attention_combine_kernel, grid, dim3(kCombineThreads), 0, stream, pdl, a);
}

void launch_attention(const AttentionChoice& choice, const AttentionArgs& a, cudaStream_t stream, bool pdl) {
  launch_attention_chunks(choice, a, stream, pdl);
  launch_attention_combine(choice, a, stream, pdl);
}

DFLASH_DEVICE_MUTATION_SETTER(attention)

}  // namespace dflash
