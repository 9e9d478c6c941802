#include "cuda/kernels/elementwise/elementwise.h"

#include <cuda_bf16.h>

#include <climits>
#include <string>

#include "core/error.h"
#include "cuda/runtime/cuda_check.h"
#include "cuda/kernels/gemm/gemm_epilogue.cuh"
#include "cuda/runtime/launch.cuh"
#include "testing/fault_points.cuh"
#include "cuda/kernels/norm_rope/rmsnorm_row.cuh"

namespace dflash {
namespace {

constexpr int kRowThreads = 256;

__device__ __forceinline__ float block_sum(float v, float* scratch) {
  for (int offset = 16; offset > 0; offset >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, offset));
  const int warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __syncthreads();
  if ((threadIdx.x & 31) == 0) scratch[warp] = v;
  __syncthreads();
  float r = scratch[0];
  for (int w = 1; w < warps; ++w) r = __fadd_rn(r, scratch[w]);
  return r;
}

using rmsnorm_row::inverse_rms;

__device__ __forceinline__ void store_normalized(const RmsNormArgs& a, int64_t row, int64_t col, float x, float r) {
  const __nv_bfloat16 y = __float2bfloat16_rn(__fmul_rn(__fmul_rn(x, r), a.weight[col]));
  reinterpret_cast<__nv_bfloat16*>(a.out)[row * a.ld_out + col] = y;
  if (a.draft_out != nullptr) {
    const int64_t i = row % a.block_width;
    if (i >= 1) {
      const int64_t draft_row = row / a.block_width * (a.block_width - 1) + (i - 1);
      reinterpret_cast<__nv_bfloat16*>(a.draft_out)[draft_row * a.ld_out + col] = y;
    }
  }
}

// One CTA per row.
__global__ void rmsnorm_kernel(RmsNormArgs a) {
  pdl_launch_dependents();
  pdl_wait();
  __shared__ float scratch[kRowThreads / 32];
  const int64_t row = blockIdx.x;
  const float* x = a.in + row * a.ld_in;
  float ss = 0.0f;
  for (int64_t c = threadIdx.x; c < a.cols; c += blockDim.x) ss = fmaf(x[c], x[c], ss);
  const float r = inverse_rms(block_sum(ss, scratch), a.cols, a.eps);
  for (int64_t c = threadIdx.x; c < a.cols; c += blockDim.x) store_normalized(a, row, c, x[c], r);
}

// One thread per row, plain loops.
__global__ void rmsnorm_simple_kernel(RmsNormArgs a) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= a.rows) return;
  const float* x = a.in + row * a.ld_in;
  float ss = 0.0f;
  for (int64_t c = 0; c < a.cols; ++c) ss = fmaf(x[c], x[c], ss);
  const float r = inverse_rms(ss, a.cols, a.eps);
  for (int64_t c = 0; c < a.cols; ++c) store_normalized(a, row, c, x[c], r);
}

__device__ __forceinline__ int token_of(const EmbedArgs& e, int64_t row, int block_width) {
  return row % block_width == 0 ? e.anchors[row / block_width] : e.mask_token_id;
}

__global__ void embed_kernel(EmbedArgs e, int64_t cols, int block_width) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t row = blockIdx.x;
  const __nv_bfloat16* src = reinterpret_cast<const __nv_bfloat16*>(e.embed_tokens) +
                             static_cast<int64_t>(token_of(e, row, block_width)) * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) e.h[row * cols + c] = __fmul_rn(__bfloat162float(src[c]), e.scale);
}

// The tuned RMSNorm: one CTA of 512 threads per row, the row held in registers as float4 (one
// round of independent loads, then the sum, then the stores), so a 16-row block costs one memory
// round trip instead of a loop of dependent ones. kEmbed: the row is first gathered from the bf16
// embedding table and also stored to h (layer 0), one launch instead of two. Per row the order of
// the sum is fixed (rmsnorm_row.cuh): batch invariant.
constexpr int kNormThreads = rmsnorm_row::kVirtualThreads;

// kVecs: float4s per thread (rmsnorm_row::kShortRowVecs or kMaxVecs). Rows of up to 4096 columns
// load their weights before the PDL wait (fp8 batch 1: 664.5 -> 654.8 µs); the long-row form reads
// them as it stores, as that many early registers would halve its CTAs per SM.
template <bool kEmbed, int kVecs>
__global__ void __launch_bounds__(kNormThreads) rmsnorm_vec_kernel(RmsNormArgs a, EmbedArgs e) {
  constexpr bool kEarlyWeights = kVecs == rmsnorm_row::kShortRowVecs;
  pdl_launch_dependents();
  const int vecs = static_cast<int>(a.cols / 4);
  float4 weight[1][kVecs];
  if constexpr (kEarlyWeights) rmsnorm_row::load_weights<1, kVecs>(a, vecs, weight);
  pdl_wait();
  __shared__ float scratch[rmsnorm_row::kVirtualWarps];
  const int64_t row = blockIdx.x;
  float4 x[1][kVecs];
  if constexpr (kEmbed) {
    const uint2* src = reinterpret_cast<const uint2*>(e.embed_tokens + static_cast<int64_t>(token_of(e, row, a.block_width)) * a.cols);
    float4* h = reinterpret_cast<float4*>(e.h + row * a.cols);
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const int v = i * kNormThreads + static_cast<int>(threadIdx.x);
      if (v < vecs) {
        const uint2 bits = src[v];
        x[0][i] = make_float4(__fmul_rn(__uint_as_float(bits.x << 16), e.scale),
                              __fmul_rn(__uint_as_float(bits.x & 0xffff0000u), e.scale),
                              __fmul_rn(__uint_as_float(bits.y << 16), e.scale),
                              __fmul_rn(__uint_as_float(bits.y & 0xffff0000u), e.scale));
        h[v] = x[0][i];
      }
    }
  } else {
    const float4* in = reinterpret_cast<const float4*>(a.in + row * a.ld_in);
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const int v = i * kNormThreads + static_cast<int>(threadIdx.x);
      if (v < vecs) x[0][i] = in[v];
    }
  }
  const float r = rmsnorm_row::row_inverse_rms<1, kVecs>(x, vecs, a.cols, a.eps, scratch);
  rmsnorm_row::store_row<1, kVecs, !kEarlyWeights>(a, row, x, weight, vecs, r);
}

}  // namespace

bool rmsnorm_vec_fits(const RmsNormArgs& a, const EmbedArgs* e) {
  auto aligned = [](const void* p, uintptr_t bytes) { return (reinterpret_cast<uintptr_t>(p) % bytes) == 0; };
  bool ok = a.cols % 4 == 0 && a.cols <= static_cast<int64_t>(4) * kNormThreads * rmsnorm_row::kMaxVecs &&
            a.ld_out % 4 == 0 && aligned(a.weight, 16) && aligned(a.out, 8) &&
            (a.draft_out == nullptr || aligned(a.draft_out, 8));
  if (e != nullptr) {
    ok = ok && aligned(e->embed_tokens, 8) && aligned(e->h, 16);
  } else {
    ok = ok && a.ld_in % 4 == 0 && aligned(a.in, 16);
  }
  return ok;
}

namespace {

// Rows that rmsnorm_vec_kernel's kShortRowVecs instantiation covers.
bool short_row(const RmsNormArgs& a) {
  return a.cols <= static_cast<int64_t>(4) * kNormThreads * rmsnorm_row::kShortRowVecs;
}

// --- q/k norm + RoPE -------------------------------------------------------------------------

struct HeadTask {
  int kind;  // 0 query, 1 key, 2 value
  int head;
};

__device__ __forceinline__ HeadTask head_task(const QkNormRopeArgs& a, int slot) {
  const int q_heads = a.q_col >= 0 ? a.num_heads : 0;
  if (slot < q_heads) return {0, slot};
  slot -= q_heads;
  if (slot < a.num_kv_heads) return {1, slot};
  return {2, slot - a.num_kv_heads};
}

__device__ __forceinline__ int total_head_tasks(const QkNormRopeArgs& a) {
  return (a.q_col >= 0 ? a.num_heads : 0) + 2 * a.num_kv_heads;
}

__device__ __forceinline__ __nv_bfloat16* head_destination(const QkNormRopeArgs& a, int64_t row, const HeadTask& task) {
  if (task.kind == 0) {
    return reinterpret_cast<__nv_bfloat16*>(a.q_out) + row * a.ld_q + static_cast<int64_t>(task.head) * a.head_dim;
  }
  const int64_t dst_row = a.slots != nullptr ? a.slots[row] : row;
  uint16_t* base = task.kind == 1 ? a.k_out : a.v_out;
  return reinterpret_cast<__nv_bfloat16*>(base) + dst_row * a.ld_kv + static_cast<int64_t>(task.head) * a.head_dim;
}

__device__ __forceinline__ const float* head_source(const QkNormRopeArgs& a, int64_t row, const HeadTask& task) {
  const int64_t col = task.kind == 0 ? a.q_col : task.kind == 1 ? a.k_col : a.v_col;
  return a.src + row * a.ld_src + col + static_cast<int64_t>(task.head) * a.head_dim;
}

// RoPE's cos and sin of pair j at this position (core/rope.h): one fp32 product for the angle,
// then cos and sin in double rounded once to fp32 (the nearest float unless the exact value lies
// within ~2^-28 ulp of a rounding midpoint), each times the attention scaling.
__device__ __forceinline__ void rope_cos_sin(const QkNormRopeArgs& a, int j, float position, float* c, float* s) {
  const float angle = __fmul_rn(position, a.inv_freq[j]);
  double sin_angle, cos_angle;
  sincos(static_cast<double>(angle), &sin_angle, &cos_angle);
  *c = __fmul_rn(__double2float_rn(cos_angle), a.attention_scaling);
  *s = __fmul_rn(__double2float_rn(sin_angle), a.attention_scaling);
}

// Normalized and rotated pair (j, j + d/2) of one head, given the pair's cos and sin.
__device__ __forceinline__ void rotate_pair(const QkNormRopeArgs& a, const float* norm_weight, float x1, float x2,
                                            float r, int j, float c, float s, float* o1, float* o2) {
  const int half = a.head_dim / 2;
  const float n1 = __fmul_rn(__fmul_rn(x1, r), norm_weight[j]);
  const float n2 = __fmul_rn(__fmul_rn(x2, r), norm_weight[j + half]);
  *o1 = __fsub_rn(__fmul_rn(n1, c), __fmul_rn(n2, s));
  *o2 = __fadd_rn(__fmul_rn(n2, c), __fmul_rn(n1, s));
}

// The elements of q/k pair j of a head: (j, j + d/2), Qwen3's rotate_half layout (the planted
// kRopePairLayout bug reads and writes them as (2j, 2j + 1)).
__device__ __forceinline__ void pair_elements(int j, int half, int* i1, int* i2) {
  *i1 = j;
  *i2 = j + half;
  DFLASH_DEVICE_MUTATE(kRopePairLayout, *i1 = 2 * j; *i2 = 2 * j + 1);
}

constexpr int kHeadWarps = 8;
constexpr int kMaxPairsPerLane = 4;  // head_dim <= 256 (checked at launch)
constexpr int kTaskBatch = 3;        // a warp's heads whose loads are in flight together

// One CTA per (row, group of heads), a warp per head at a time. The CTA computes the row's cos and
// sin once into shared memory (head_dim floats: cos of the pairs, then sin), before the PDL wait:
// the positions are uploaded before the chain's first kernel. Each warp then loads up to
// kTaskBatch heads at once (lane l: pairs l, l + 32, ...) and finishes them in turn; the sums of
// squares and the rotations are the same operations in the same order for any grouping, so the
// group size changes no bit.
__global__ void __launch_bounds__(kHeadWarps * 32, 4) qk_norm_rope_kernel(QkNormRopeArgs a, int tasks_per_cta) {
  extern __shared__ float cos_sin[];
  pdl_launch_dependents();
  const int half = a.head_dim / 2;
  const int64_t row = blockIdx.x;
  const float position = __ll2float_rn(a.positions[row]);
  for (int j = threadIdx.x; j < half; j += blockDim.x) rope_cos_sin(a, j, position, &cos_sin[j], &cos_sin[half + j]);
  __syncthreads();
  pdl_wait();
  const int lane = threadIdx.x & 31;
  const int first = blockIdx.y * tasks_per_cta;
  const int end = min(first + tasks_per_cta, total_head_tasks(a));
  for (int base = first + static_cast<int>(threadIdx.x >> 5); base < end; base += kHeadWarps * kTaskBatch) {
    float x1[kTaskBatch][kMaxPairsPerLane], x2[kTaskBatch][kMaxPairsPerLane];
#pragma unroll
    for (int t = 0; t < kTaskBatch; ++t) {
      const int slot = base + t * kHeadWarps;
      if (slot >= end) break;
      const HeadTask task = head_task(a, slot);
      const float* x = head_source(a, row, task);
#pragma unroll
      for (int i = 0; i < kMaxPairsPerLane; ++i) {
        const int j = lane + 32 * i;
        int i1 = j, i2 = j + half;  // V: the plain halves
        if (task.kind != 2) pair_elements(j, half, &i1, &i2);
        if (j < half) {
          x1[t][i] = x[i1];
          x2[t][i] = x[i2];
        }
      }
    }
#pragma unroll
    for (int t = 0; t < kTaskBatch; ++t) {
      const int slot = base + t * kHeadWarps;
      if (slot >= end) break;
      const HeadTask task = head_task(a, slot);
      __nv_bfloat16* dst = head_destination(a, row, task);
      if (task.kind == 2) {  // V: only rounded to bf16
#pragma unroll
        for (int i = 0; i < kMaxPairsPerLane; ++i) {
          const int j = lane + 32 * i;
          if (j < half) {
            dst[j] = __float2bfloat16_rn(x1[t][i]);
            dst[j + half] = __float2bfloat16_rn(x2[t][i]);
            DFLASH_DEVICE_MUTATE(kTruncatedKvStore, if (a.slots != nullptr) { dst[j] = __float2bfloat16_rz(x1[t][i]); dst[j + half] = __float2bfloat16_rz(x2[t][i]); });
          }
        }
        continue;
      }
      float ss = 0.0f;
#pragma unroll
      for (int i = 0; i < kMaxPairsPerLane; ++i) {
        if (lane + 32 * i < half) ss = fmaf(x2[t][i], x2[t][i], fmaf(x1[t][i], x1[t][i], ss));
      }
      for (int offset = 16; offset > 0; offset >>= 1) ss = __fadd_rn(ss, __shfl_xor_sync(0xffffffffu, ss, offset));
      const float r = inverse_rms(ss, a.head_dim, a.eps);
      const float* w = task.kind == 0 ? a.q_norm : a.k_norm;
#pragma unroll
      for (int i = 0; i < kMaxPairsPerLane; ++i) {
        const int j = lane + 32 * i;
        if (j >= half) continue;
        int i1, i2;
        pair_elements(j, half, &i1, &i2);
        float o1, o2;
        rotate_pair(a, w, x1[t][i], x2[t][i], r, j, cos_sin[j], cos_sin[half + j], &o1, &o2);
        dst[i1] = __float2bfloat16_rn(o1);
        dst[i2] = __float2bfloat16_rn(o2);
        DFLASH_DEVICE_MUTATE(kTruncatedKvStore, if (a.slots != nullptr) { dst[i1] = __float2bfloat16_rz(o1); dst[i2] = __float2bfloat16_rz(o2); });
      }
    }
  }
}

// One thread per (row, head), plain loops.
__global__ void qk_norm_rope_simple_kernel(QkNormRopeArgs a, int tasks) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t id = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= a.rows * tasks) return;
  const int64_t row = id / tasks;
  const HeadTask task = head_task(a, static_cast<int>(id % tasks));
  const float* x = head_source(a, row, task);
  __nv_bfloat16* dst = head_destination(a, row, task);
  if (task.kind == 2) {
    for (int e = 0; e < a.head_dim; ++e) dst[e] = __float2bfloat16_rn(x[e]);
    return;
  }
  const int half = a.head_dim / 2;
  float ss = 0.0f;
  for (int e = 0; e < a.head_dim; ++e) ss = fmaf(x[e], x[e], ss);
  const float r = inverse_rms(ss, a.head_dim, a.eps);
  const float* w = task.kind == 0 ? a.q_norm : a.k_norm;
  const float position = __ll2float_rn(a.positions[row]);
  for (int j = 0; j < half; ++j) {
    float c, s, o1, o2;
    rope_cos_sin(a, j, position, &c, &s);
    rotate_pair(a, w, x[j], x[j + half], r, j, c, s, &o1, &o2);
    dst[j] = __float2bfloat16_rn(o1);
    dst[j + half] = __float2bfloat16_rn(o2);
  }
}

// Gate i at column i·gate_stride of its row, up i at column up_offset + i·gate_stride.
__global__ void swiglu_kernel(const float* gate_up, int64_t rows, int64_t intermediate, int64_t gate_stride,
                              int64_t up_offset, __nv_bfloat16* act, int64_t ld_act) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t id = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= rows * intermediate) return;
  const int64_t row = id / intermediate, i = id % intermediate;
  const float* pair = gate_up + row * 2 * intermediate + i * gate_stride;
  const float g = pair[0], u = pair[up_offset];
  act[row * ld_act + i] = __float2bfloat16_rn(__fmul_rn(silu(g), u));
}

// One CTA per row: each thread keeps its best candidate, then a fixed tree picks the winner
// (the order is total, so the tree shape cannot change it).
__device__ void block_argmax_store(float best, int best_index, int32_t* out) {
  __shared__ float values[32];  // up to 1024 threads
  __shared__ int indices[32];
  warp_argmax(best, best_index);
  const int warp = threadIdx.x >> 5;
  if ((threadIdx.x & 31) == 0) {
    values[warp] = best;
    indices[warp] = best_index;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float v = values[0];
    int idx = indices[0];
    for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) {
      if (argmax_better(values[w], indices[w], v, idx)) {
        v = values[w];
        idx = indices[w];
      }
    }
    *out = idx;
  }
}

// 1024 threads per row and the loop unrolled, so a row's few thousand partials arrive in a couple of
// memory round trips (the order of comparisons cannot change a winner under a total order).
constexpr int kArgmaxReduceThreads = 1024;
__global__ void __launch_bounds__(kArgmaxReduceThreads)
    argmax_reduce_kernel(const float* values, const int32_t* indices, int64_t blocks, int32_t* tokens) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t row = blockIdx.x;
  float best = -INFINITY;
  int best_index = INT_MAX;
#pragma unroll 4
  for (int64_t i = threadIdx.x; i < blocks; i += blockDim.x) {
    const float v = values[row * blocks + i];
    const int idx = indices[row * blocks + i];
    if (argmax_better(v, idx, best, best_index)) {
      best = v;
      best_index = idx;
    }
  }
  block_argmax_store(best, best_index, tokens + row);
}

__global__ void argmax_rows_kernel(const float* logits, int64_t cols, int32_t* tokens) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t row = blockIdx.x;
  float best = -INFINITY;
  int best_index = INT_MAX;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float v = logits[row * cols + c];
    if (argmax_better(v, static_cast<int>(c), best, best_index)) {
      best = v;
      best_index = static_cast<int>(c);
    }
  }
  block_argmax_store(best, best_index, tokens + row);
}

__global__ void probe_kernel(int* out) { *out = 1; }

}  // namespace

void launch_rmsnorm(RowKernel kernel, const RmsNormArgs& args, cudaStream_t stream, bool pdl) {
  if (args.rows < 1) return;
  const unsigned rows = static_cast<unsigned>(args.rows);
  if (kernel == RowKernel::kSimple) {
    launch_kernel(DFLASH_KERNEL_SITE("rmsnorm_simple_kernel"), rmsnorm_simple_kernel, dim3((rows + 63) / 64), dim3(64), 0, stream, pdl, args);
  } else if (rmsnorm_vec_fits(args, nullptr)) {
    launch_kernel(DFLASH_KERNEL_SITE("rmsnorm_vec_kernel"), short_row(args) ? rmsnorm_vec_kernel<false, rmsnorm_row::kShortRowVecs>
                                                        : rmsnorm_vec_kernel<false, rmsnorm_row::kMaxVecs>,
                  dim3(rows), dim3(kNormThreads), 0, stream, pdl, args,
                  EmbedArgs{});
  } else {
    launch_kernel(DFLASH_KERNEL_SITE("rmsnorm_kernel"), rmsnorm_kernel, dim3(rows), dim3(kRowThreads), 0, stream, pdl, args);
  }
}

void launch_embed_rmsnorm(RowKernel kernel, const EmbedArgs& embed, const RmsNormArgs& norm, cudaStream_t stream) {
  if (norm.rows < 1) return;
  const unsigned rows = static_cast<unsigned>(norm.rows);
  if (kernel == RowKernel::kTuned && rmsnorm_vec_fits(norm, &embed)) {
    launch_kernel(DFLASH_KERNEL_SITE("rmsnorm_vec_kernel (embedding)"),
                  short_row(norm) ? rmsnorm_vec_kernel<true, rmsnorm_row::kShortRowVecs>
                                  : rmsnorm_vec_kernel<true, rmsnorm_row::kMaxVecs>,
                  dim3(rows), dim3(kNormThreads), 0, stream,
                  false, norm, embed);
    return;
  }
  launch_kernel(DFLASH_KERNEL_SITE("embed_kernel"), embed_kernel, dim3(rows), dim3(kRowThreads), 0, stream, false, embed, norm.cols,
                norm.block_width);
  launch_rmsnorm(kernel, norm, stream, false);
}

void launch_qk_norm_rope(RowKernel kernel, const QkNormRopeArgs& args, cudaStream_t stream, bool pdl) {
  if (args.rows < 1) return;
  const int tasks = (args.q_col >= 0 ? args.num_heads : 0) + 2 * args.num_kv_heads;
  if (kernel == RowKernel::kSimple) {
    const int64_t threads = args.rows * tasks;
    launch_kernel(DFLASH_KERNEL_SITE("qk_norm_rope_simple_kernel"), qk_norm_rope_simple_kernel, dim3(static_cast<unsigned>((threads + 127) / 128)),
                  dim3(128), 0, stream, pdl, args, tasks);
  } else {
    if (args.head_dim > 64 * kMaxPairsPerLane || args.head_dim % 2 != 0) {
      throw internal_error("qk_norm_rope: head_dim " + std::to_string(args.head_dim) + " is odd or above " +
                           std::to_string(64 * kMaxPairsPerLane));
    }
    // A CTA per kHeadWarps heads of a row; from 128 rows (batch 8 of a 16-wide block), where that
    // fills the SMs several times, twice as many, so that each row's cos and sin are computed by
    // fewer CTAs.
    const int per_cta = args.rows >= 128 ? 2 * kHeadWarps : kHeadWarps;
    const dim3 grid(static_cast<unsigned>(args.rows), static_cast<unsigned>((tasks + per_cta - 1) / per_cta));
    launch_kernel(DFLASH_KERNEL_SITE("qk_norm_rope_kernel"), qk_norm_rope_kernel, grid, dim3(kHeadWarps * 32),
                  static_cast<size_t>(args.head_dim) * sizeof(float), stream, pdl, args, per_cta);
  }
}

void launch_swiglu(const float* gate_up, int64_t rows, int64_t intermediate, uint16_t* act, int64_t ld_act,
                   cudaStream_t stream, bool pdl, bool split) {
  const int64_t total = rows * intermediate;
  if (total < 1) return;
  const int64_t gate_stride = split ? 1 : 2, up_offset = split ? intermediate : 1;
  launch_kernel(DFLASH_KERNEL_SITE("swiglu_kernel"), swiglu_kernel, dim3(static_cast<unsigned>((total + 255) / 256)), dim3(256), 0, stream, pdl,
                gate_up, rows, intermediate, gate_stride, up_offset, reinterpret_cast<__nv_bfloat16*>(act), ld_act);
}

void launch_argmax_reduce(const float* values, const int32_t* indices, int64_t rows, int64_t blocks, int32_t* tokens,
                          cudaStream_t stream, bool pdl) {
  if (rows < 1) return;
  launch_kernel(DFLASH_KERNEL_SITE("argmax_reduce_kernel"), argmax_reduce_kernel, dim3(static_cast<unsigned>(rows)), dim3(kArgmaxReduceThreads),
                0, stream, pdl, values, indices, blocks, tokens);
}

void launch_argmax_rows(const float* logits, int64_t rows, int64_t cols, int32_t* tokens, cudaStream_t stream, bool pdl) {
  if (rows < 1) return;
  launch_kernel(DFLASH_KERNEL_SITE("argmax_rows_kernel"), argmax_rows_kernel, dim3(static_cast<unsigned>(rows)), dim3(kRowThreads), 0, stream,
                pdl, logits, cols, tokens);
}

void prepare_row_kernels() {
  cudaFuncAttributes a;
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&a, rmsnorm_kernel));
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&a, rmsnorm_simple_kernel));
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&a, rmsnorm_vec_kernel<false, rmsnorm_row::kShortRowVecs>));
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&a, rmsnorm_vec_kernel<false, rmsnorm_row::kMaxVecs>));
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&a, rmsnorm_vec_kernel<true, rmsnorm_row::kShortRowVecs>));
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&a, rmsnorm_vec_kernel<true, rmsnorm_row::kMaxVecs>));
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&a, embed_kernel));
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&a, qk_norm_rope_kernel));
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&a, qk_norm_rope_simple_kernel));
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&a, swiglu_kernel));
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&a, argmax_reduce_kernel));
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&a, argmax_rows_kernel));
}

cudaError_t run_device_probe() {
  int* flag = nullptr;
  cudaError_t status = cudaMalloc(&flag, sizeof(int));
  if (status != cudaSuccess) return status;
  probe_kernel<<<1, 1>>>(flag);
  status = cudaGetLastError();
  if (status == cudaSuccess) status = cudaDeviceSynchronize();
  cudaFree(flag);
  return status;
}

DFLASH_DEVICE_MUTATION_SETTER(elementwise)

}  // namespace dflash
