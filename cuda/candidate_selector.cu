#include "cuda/candidate_selector.h"

#include <cuda_bf16.h>

#include "cuda/cuda_check.h"
#include "cuda/launch.cuh"

namespace dflash {
namespace {

constexpr int kTopkThreads = 512;
constexpr int kPlainTopkThreads = 256;
constexpr int kWalkThreads = 256;
// Shared-memory candidates of the threshold pass. At most K · ceil(V / kTopkThreads) elements can
// pass the threshold (only the K threads whose own best reaches it hold any), 7760 for K = 16 at
// V = 248320; more fall back to K passes over the row.
constexpr int kTopkCandidates = 8192;

// The top-K order, total: NaN first (lower id first among NaNs), then larger values, then lower ids.
// As a comparison (the plain kernel):
__device__ __forceinline__ bool ranks_before(float va, int ia, float vb, int ib) {
  const bool an = isnan(va), bn = isnan(vb);
  if (an != bn) return an;
  if (!an && va != vb) return va > vb;
  return ia < ib;
}

// The same order (-0 and +0 are equal values) as one unsigned key (the threshold kernel), smaller first: the value's rank in the high
// word (NaN 0; numbers by their bits made ascending, then inverted), the id in the low word.
__device__ __forceinline__ uint64_t order_key(float value, int id) {
  uint32_t u = __float_as_uint(value == 0.0f ? 0.0f : value);
  u = (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);  // ascending with the value
  const uint32_t rank = isnan(value) ? 0u : ~u;
  return (static_cast<uint64_t>(rank) << 32) | static_cast<uint32_t>(id);
}
constexpr uint64_t kNoKey = ~0ull;  // after every element

// The smallest of one key per thread.
__device__ uint64_t block_min(uint64_t key, uint64_t* scratch) {
  for (int offset = 16; offset > 0; offset >>= 1) key = min(key, __shfl_xor_sync(0xffffffffu, key, offset));
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = key;
  __syncthreads();
  key = scratch[0];
  for (int w = 1; w < kTopkThreads / 32; ++w) key = min(key, scratch[w]);
  __syncthreads();  // scratch is rewritten by the next call
  return key;
}

// K rounds over n keys key_at(i), each picking the smallest key above the previous pick, and
// storing its id, its logit and its unary score (multiplier, then softcap).
template <typename KeyAt>
__device__ void select_rounds(const SelectorArgs& a, int64_t row, const float* logits, const KeyAt& key_at, int64_t n,
                              uint64_t* scratch) {
  bool first = true;
  uint64_t prev = 0;
  for (int c = 0; c < a.top_k; ++c) {
    uint64_t best = kNoKey;
    for (int64_t i = threadIdx.x; i < n; i += kTopkThreads) {
      const uint64_t key = key_at(i);
      if (first || key > prev) best = min(best, key);
    }
    best = block_min(best, scratch);
    if (threadIdx.x == 0) {
      const int64_t k = row * a.top_k + c;
      // K <= vocab (the config refuses more): a pick is always found; -1 and NaN if not.
      const int id = best == kNoKey ? -1 : static_cast<int>(best & 0xffffffffu);
      const float value = id >= 0 ? logits[id] : __int_as_float(0x7fffffff);
      a.topk_ids[k] = id;
      a.topk_values[k] = value;
      float u = __fmul_rn(value, a.output_multiplier);
      if (a.softcap > 0.0f) u = __fmul_rn(a.softcap, tanhf(__fdiv_rn(u, a.softcap)));
      a.unary[k] = u;
    }
    prev = best;
    first = false;
  }
}

// One CTA per mask row, in three steps. (1) Each thread's first key of its stride of the row.
// (2) The threshold T: the K-th smallest of those per-thread firsts (K rounds of a block minimum).
// Every element of the row's top K has a key <= T, since the firsts are K or more elements of the
// row. (3) The keys <= T (at least K, few for real logits) go to shared memory, and K rounds pick
// the top K from them; past kTopkCandidates, from the row itself. The top K of a total order is
// unique, so neither the path nor the candidates' order in shared memory changes the result: the
// same bits as K passes over the row.
__global__ void __launch_bounds__(kTopkThreads) selector_topk_kernel(SelectorArgs a) {
  pdl_launch_dependents();
  pdl_wait();
  extern __shared__ uint64_t candidates[];  // [kTopkCandidates]
  __shared__ uint64_t scratch[kTopkThreads / 32];
  __shared__ int count;
  const int64_t row = blockIdx.x;
  const float* logits = a.logits + row * a.vocab;

  uint64_t mine = kNoKey;
#pragma unroll 8
  for (int64_t v = threadIdx.x; v < a.vocab; v += kTopkThreads) mine = min(mine, order_key(logits[v], static_cast<int>(v)));
  if (threadIdx.x == 0) count = 0;
  uint64_t threshold = 0;
  for (int c = 0; c < a.top_k; ++c) threshold = block_min(c == 0 || mine > threshold ? mine : kNoKey, scratch);
  // threshold == kNoKey: fewer than K firsts (never with K <= vocab); every element passes.
#pragma unroll 8
  for (int64_t v = threadIdx.x; v < a.vocab; v += kTopkThreads) {
    const uint64_t key = order_key(logits[v], static_cast<int>(v));
    if (key <= threshold) {
      const int slot = atomicAdd(&count, 1);
      if (slot < kTopkCandidates) candidates[slot] = key;
    }
  }
  __syncthreads();
  const int n = count;
  if (n <= kTopkCandidates) {
    select_rounds(a, row, logits, [&](int64_t i) { return candidates[i]; }, n, scratch);
  } else {
    select_rounds(a, row, logits, [&](int64_t i) { return order_key(logits[i], static_cast<int>(i)); }, a.vocab, scratch);
  }
}

// The plain top-K (selector_topk=plain), kept to bisect with: one CTA per mask row, K rounds over
// the row, each finding the first element (in the top-K order) after the previous round's pick. The pick is the minimum of a total order, so the reduction's
// grouping cannot change it.
__global__ void __launch_bounds__(kPlainTopkThreads) selector_topk_plain_kernel(SelectorArgs a) {
  pdl_launch_dependents();
  pdl_wait();
  __shared__ float warp_value[kPlainTopkThreads / 32];
  __shared__ int warp_id[kPlainTopkThreads / 32];
  const int64_t row = blockIdx.x;
  const float* logits = a.logits + row * a.vocab;
  float prev_value = 0.0f;
  int prev_id = -1;  // none yet
  for (int c = 0; c < a.top_k; ++c) {
    float best_value = 0.0f;
    int best_id = -1;
    for (int64_t v = threadIdx.x; v < a.vocab; v += kPlainTopkThreads) {
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
    for (int w = 1; w < kPlainTopkThreads / 32; ++w) {
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

constexpr size_t kTopkSmemBytes = kTopkCandidates * sizeof(uint64_t);

void launch_selector_topk(const SelectorArgs& a, SelectorTopK kernel, cudaStream_t stream, bool pdl) {
  const dim3 grid(static_cast<unsigned>(a.batch * a.slots));
  if (kernel == SelectorTopK::kPlain) {
    launch_kernel("selector_topk_plain_kernel", selector_topk_plain_kernel, grid, dim3(kPlainTopkThreads), 0, stream, pdl, a);
  } else {
    launch_kernel("selector_topk_kernel", selector_topk_kernel, grid, dim3(kTopkThreads), kTopkSmemBytes, stream, pdl, a);
  }
}

void launch_selector_walk(const SelectorArgs& a, cudaStream_t stream, bool pdl) {
  launch_kernel("selector_walk_kernel", selector_walk_kernel, dim3(static_cast<unsigned>(a.batch)), dim3(kWalkThreads),
                0, stream, pdl, a);
}

void prepare_selector_kernels() {
  DFLASH_CUDA_CHECK(cudaFuncSetAttribute(selector_topk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(kTopkSmemBytes)));
  cudaFuncAttributes attributes;
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&attributes, selector_topk_kernel));
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&attributes, selector_topk_plain_kernel));
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&attributes, selector_walk_kernel));
}

}  // namespace dflash
