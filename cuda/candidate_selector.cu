#include "cuda/candidate_selector.h"

#include <cuda_bf16.h>

#include "cuda/cuda_check.h"
#include "cuda/launch.cuh"

namespace dflash {
namespace {

constexpr int kTopkThreads = 256;
constexpr int kWalkThreads = 256;

// The top-K order, total: NaN first (lower id first among NaNs), then larger values, then lower ids.
__device__ __forceinline__ bool ranks_before(float va, int ia, float vb, int ib) {
  const bool an = isnan(va), bn = isnan(vb);
  if (an != bn) return an;
  if (!an && va != vb) return va > vb;
  return ia < ib;
}

// One CTA per mask row: K rounds, each finding the first element (in the top-K order) that comes
// after the previous round's pick. The pick is the minimum of a total order, so the reduction's
// grouping cannot change it.
__global__ void __launch_bounds__(kTopkThreads) selector_topk_kernel(SelectorArgs a) {
  pdl_launch_dependents();
  pdl_wait();
  __shared__ float warp_value[kTopkThreads / 32];
  __shared__ int warp_id[kTopkThreads / 32];
  const int64_t row = blockIdx.x;
  const float* logits = a.logits + row * a.vocab;
  float prev_value = 0.0f;
  int prev_id = -1;  // none yet
  for (int c = 0; c < a.top_k; ++c) {
    float best_value = 0.0f;
    int best_id = -1;
    for (int64_t v = threadIdx.x; v < a.vocab; v += kTopkThreads) {
      const float value = logits[v];
      const int id = static_cast<int>(v);
      if (prev_id >= 0 && !ranks_before(prev_value, prev_id, value, id)) continue;  // already taken
      if (best_id < 0 || ranks_before(value, id, best_value, best_id)) best_value = value, best_id = id;
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
      const float other_value = __shfl_xor_sync(0xffffffffu, best_value, offset);
      const int other_id = __shfl_xor_sync(0xffffffffu, best_id, offset);
      if (other_id >= 0 && (best_id < 0 || ranks_before(other_value, other_id, best_value, best_id))) {
        best_value = other_value, best_id = other_id;
      }
    }
    if ((threadIdx.x & 31) == 0) {
      warp_value[threadIdx.x >> 5] = best_value;
      warp_id[threadIdx.x >> 5] = best_id;
    }
    __syncthreads();
    best_value = warp_value[0];
    best_id = warp_id[0];
    for (int w = 1; w < kTopkThreads / 32; ++w) {
      if (warp_id[w] >= 0 && (best_id < 0 || ranks_before(warp_value[w], warp_id[w], best_value, best_id))) {
        best_value = warp_value[w], best_id = warp_id[w];
      }
    }
    __syncthreads();  // warp_value / warp_id are rewritten by the next round
    if (threadIdx.x == 0) {
      const int64_t at = row * a.top_k + c;
      a.topk_ids[at] = best_id;  // K <= vocab (the config refuses more): always found
      a.topk_values[at] = best_value;
      // Unary scores, after the top-k: multiplier, then softcap.
      float u = __fmul_rn(best_value, a.output_multiplier);
      if (a.softcap > 0.0f) u = __fmul_rn(a.softcap, tanhf(__fdiv_rn(u, a.softcap)));
      a.unary[at] = u;
    }
    prev_value = best_value;
    prev_id = best_id;
  }
}

// One CTA per sequence: every edge score S[t, p, c] = unary[t, c] + Σ_j A[pred, j]·Hh[t, j]·Bs[id, j]
// (one thread per element, j in order), then the walk by one thread.
__global__ void __launch_bounds__(kWalkThreads) selector_walk_kernel(SelectorArgs a) {
  pdl_launch_dependents();
  pdl_wait();
  const int b = blockIdx.x;
  const int n = a.slots, k = a.top_k, r = a.rank;
  const int64_t row0 = static_cast<int64_t>(b) * n;
  const int64_t elements = static_cast<int64_t>(n) * k * k;
  for (int64_t e = threadIdx.x; e < elements; e += kWalkThreads) {
    const int64_t t = e / (static_cast<int64_t>(k) * k);
    const int p = static_cast<int>((e / k) % k), c = static_cast<int>(e % k);
    const int64_t pred = t == 0 ? a.anchors[b] : a.topk_ids[(row0 + t - 1) * k + p];
    const int64_t succ = a.topk_ids[(row0 + t) * k + c];
    const __nv_bfloat16* pa = reinterpret_cast<const __nv_bfloat16*>(a.predecessor) + pred * r;
    const __nv_bfloat16* sb = reinterpret_cast<const __nv_bfloat16*>(a.successor) + succ * r;
    const float* hh = a.hidden_proj + (row0 + t) * r;
    float sum = 0.0f;
    for (int j = 0; j < r; ++j) {
      sum = __fadd_rn(sum, __fmul_rn(__fmul_rn(__bfloat162float(pa[j]), hh[j]), __bfloat162float(sb[j])));
    }
    a.edge_scores[((row0 + t) * k + p) * k + c] = __fadd_rn(a.unary[(row0 + t) * k + c], sum);
  }
  __syncthreads();  // the edge scores are visible to the CTA
  if (threadIdx.x != 0) return;
  int prev = 0;
  for (int t = 0; t < n; ++t) {
    const float* scores = a.edge_scores + ((row0 + t) * k + prev) * k;
    int best = 0;
    for (int c = 1; c < k; ++c) {
      if (scores[c] > scores[best]) best = c;  // the first maximum: lowest slot on ties
    }
    for (int c = 0; c < k; ++c) a.walk_scores[(row0 + t) * k + c] = scores[c];
    a.walk_index[row0 + t] = best;
    a.tokens[row0 + t] = a.topk_ids[(row0 + t) * k + best];
    prev = best;
  }
}

}  // namespace

void launch_selector_topk(const SelectorArgs& a, cudaStream_t stream, bool pdl) {
  launch_kernel("selector_topk_kernel", selector_topk_kernel, dim3(static_cast<unsigned>(a.batch * a.slots)),
                dim3(kTopkThreads), 0, stream, pdl, a);
}

void launch_selector_walk(const SelectorArgs& a, cudaStream_t stream, bool pdl) {
  launch_kernel("selector_walk_kernel", selector_walk_kernel, dim3(static_cast<unsigned>(a.batch)), dim3(kWalkThreads),
                0, stream, pdl, a);
}

void prepare_selector_kernels() {
  cudaFuncAttributes attributes;
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&attributes, selector_topk_kernel));
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&attributes, selector_walk_kernel));
}

}  // namespace dflash
