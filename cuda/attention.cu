#include "cuda/attention.h"

#include <cuda_bf16.h>

#include <mutex>
#include <string>

#include "core/error.h"
#include "cuda/cuda_check.h"

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

// One CTA per (chunk of 64 keys, kv head, sequence). D > 0: compiled head_dim; D == 0: runtime.
template <int D>
__global__ void __launch_bounds__(kPartialThreads) attention_partial_kernel(AttentionArgs a) {
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
      const uint4 kv = *reinterpret_cast<const uint4*>(k_src[jj] + piece * 8);
      const uint4 vv = *reinterpret_cast<const uint4*>(v_src[jj] + piece * 8);
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
      k_words[jj * key_stride_words + w] = reinterpret_cast<const uint32_t*>(k_src[jj])[w];
      reinterpret_cast<uint32_t*>(v_tile + jj * d)[w] = reinterpret_cast<const uint32_t*>(v_src[jj])[w];
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

    float score[2];
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const int jj = lane + 32 * s;
      score[s] = -INFINITY;
      if (jj < keys) {
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
      const float p = jj < keys ? expf(score[s] - m) : 0.0f;
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

// One CTA per (block row, query head): merges the chunks in chunk order.
__global__ void attention_combine_kernel(AttentionArgs a) {
  const int64_t row = blockIdx.x;
  const int head = blockIdx.y;
  const int b = static_cast<int>(row / a.block_width), i = static_cast<int>(row % a.block_width);
  const int d = a.head_dim;
  const int64_t total_keys = static_cast<int64_t>(a.window_length[b]) + a.block_width;
  const int chunks = static_cast<int>((total_keys + kAttentionChunk - 1) / kAttentionChunk);
  const int64_t base = ((static_cast<int64_t>(b) * a.num_heads + head) * a.max_block_width + i) * a.max_chunks;
  float m = -INFINITY;
  for (int c = 0; c < chunks; ++c) m = fmaxf(m, a.partial_max_sum[(base + c) * 2]);
  float l = 0.0f;
  for (int c = 0; c < chunks; ++c) {
    l = __fadd_rn(l, __fmul_rn(expf(a.partial_max_sum[(base + c) * 2] - m), a.partial_max_sum[(base + c) * 2 + 1]));
  }
  __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(a.out) + row * a.ld_out + static_cast<int64_t>(head) * d;
  for (int e = threadIdx.x; e < d; e += blockDim.x) {
    float o = 0.0f;
    for (int c = 0; c < chunks; ++c) {
      const float w = expf(a.partial_max_sum[(base + c) * 2] - m);
      o = __fadd_rn(o, __fmul_rn(w, a.partial_out[(base + c) * d + e]));
    }
    out[e] = __float2bfloat16_rn(__fdiv_rn(o, l));
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

  float local_max = -INFINITY;
  for (int64_t j = threadIdx.x; j < total_keys; j += blockDim.x) {
    const __nv_bfloat16* k = key_row(a, a.k_pool, a.k_block, b, j, window_length, kv_head);
    float dot = 0.0f;
    for (int e = 0; e < d; ++e) dot = __fadd_rn(dot, __fmul_rn(__bfloat162float(q[e]), __bfloat162float(k[e])));
    scores[j] = __fmul_rn(dot, a.scale);
    local_max = fmaxf(local_max, scores[j]);
  }
  const float m = block_reduce(local_max, true, scratch);
  float local_sum = 0.0f;
  for (int64_t j = threadIdx.x; j < total_keys; j += blockDim.x) {
    scores[j] = expf(scores[j] - m);
    local_sum = __fadd_rn(local_sum, scores[j]);
  }
  const float l = block_reduce(local_sum, false, scratch);  // its barriers also publish scores[]
  __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(a.out) + row * a.ld_out + static_cast<int64_t>(head) * d;
  for (int e = threadIdx.x; e < d; e += blockDim.x) {
    float o = 0.0f;
    for (int64_t j = 0; j < total_keys; ++j) {
      const __nv_bfloat16* v = key_row(a, a.v_pool, a.v_block, b, j, window_length, kv_head);
      o = __fadd_rn(o, __fmul_rn(scores[j], __bfloat162float(v[e])));
    }
    out[e] = __float2bfloat16_rn(__fdiv_rn(o, l));
  }
}

template <int D>
void prepare_partial() {
  static std::once_flag once;
  std::call_once(once, [] {
    const size_t smem = partial_smem_bytes(D > 0 ? D : kAttentionMaxHeadDim);
    DFLASH_CUDA_CHECK(cudaFuncSetAttribute(attention_partial_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem)));
  });
}

template <int D>
void launch_partial(const AttentionArgs& a, cudaStream_t stream) {
  prepare_partial<D>();
  const int query_rows = a.block_width * (a.num_heads / a.num_kv_heads);
  const int query_groups = (query_rows + kQueryRowsPerCta - 1) / kQueryRowsPerCta;
  const dim3 grid(static_cast<unsigned>(a.max_chunks), static_cast<unsigned>(a.num_kv_heads * query_groups),
                  static_cast<unsigned>(a.batch));
  attention_partial_kernel<D><<<grid, kPartialThreads, partial_smem_bytes(a.head_dim), stream>>>(a);
  DFLASH_CUDA_CHECK_LAUNCH("attention_partial_kernel");
}

}  // namespace

std::string AttentionChoice::name() const {
  switch (kernel) {
    case AttentionKernel::kTuned: return "tuned-d" + std::to_string(compiled_head_dim);
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
  prepare_partial<0>();
  prepare_partial<64>();
  prepare_partial<128>();
  prepare_partial<256>();
  cudaFuncAttributes attributes;
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&attributes, attention_combine_kernel));
  DFLASH_CUDA_CHECK(cudaFuncSetAttribute(attention_simple_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(attention_simple_max_smem_bytes())));
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&attributes, attention_simple_kernel));
}

void launch_attention(const AttentionChoice& choice, const AttentionArgs& a, cudaStream_t stream) {
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
    attention_simple_kernel<<<grid, kSimpleThreads, smem, stream>>>(a);
    DFLASH_CUDA_CHECK_LAUNCH("attention_simple_kernel");
    return;
  }
  if (choice.kernel == AttentionKernel::kTuned) {
    switch (choice.compiled_head_dim) {
      case 64: launch_partial<64>(a, stream); break;
      case 128: launch_partial<128>(a, stream); break;
      case 256: launch_partial<256>(a, stream); break;
      default: throw internal_error("attention: no tuned kernel for head_dim " + std::to_string(choice.compiled_head_dim));
    }
  } else {
    launch_partial<0>(a, stream);
  }
  const dim3 grid(static_cast<unsigned>(a.batch * a.block_width), static_cast<unsigned>(a.num_heads));
  attention_combine_kernel<<<grid, 128, 0, stream>>>(a);
  DFLASH_CUDA_CHECK_LAUNCH("attention_combine_kernel");
}

}  // namespace dflash
