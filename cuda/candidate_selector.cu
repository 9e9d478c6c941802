#include "cuda/candidate_selector.h"

#include <cuda_bf16.h>

#include "cuda/cuda_check.h"
#include "cuda/launch.cuh"

namespace dflash {
namespace {

constexpr int kTopkThreads = 512;
constexpr int kWalkThreads = 256;
// Shared-memory candidates of the threshold pass. At most K · ceil(V / kTopkThreads) elements can
// pass the threshold (only the K threads whose own best reaches it hold any), 7760 for K = 16 at
// V = 248320; more fall back to K passes over the row.
constexpr int kTopkCandidates = 8192;

// The top-K order, total: NaN first (lower id first among NaNs), then larger values, then lower ids.
__device__ __forceinline__ bool ranks_before(float va, int ia, float vb, int ib) {
  const bool an = isnan(va), bn = isnan(vb);
  if (an != bn) return an;
  if (!an && va != vb) return va > vb;
  return ia < ib;
}

// A logit and its id; id < 0: none, ranked after everything.
struct Ranked {
  float value;
  int id;
};
__device__ __forceinline__ bool before(const Ranked& x, const Ranked& y) {
  if (x.id < 0) return false;
  if (y.id < 0) return true;
  return ranks_before(x.value, x.id, y.value, y.id);
}

// The first of one Ranked per thread. The order is total, so the grouping cannot change the pick.
__device__ Ranked block_first(Ranked r, Ranked* scratch) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const Ranked other{__shfl_xor_sync(0xffffffffu, r.value, offset), __shfl_xor_sync(0xffffffffu, r.id, offset)};
    if (before(other, r)) r = other;
  }
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = r;
  __syncthreads();
  r = scratch[0];
  for (int w = 1; w < kTopkThreads / 32; ++w) {
    if (before(scratch[w], r)) r = scratch[w];
  }
  __syncthreads();  // scratch is rewritten by the next call
  return r;
}

// K rounds over n elements at(i), each picking the first element after the previous pick, and
// storing it with its unary score (multiplier, then softcap).
template <typename At>
__device__ void select_rounds(const SelectorArgs& a, int64_t row, const At& at, int64_t n, Ranked* scratch) {
  Ranked prev{0.0f, -1};
  for (int c = 0; c < a.top_k; ++c) {
    Ranked best{0.0f, -1};
    for (int64_t i = threadIdx.x; i < n; i += kTopkThreads) {
      const Ranked x = at(i);
      if (prev.id >= 0 && !before(prev, x)) continue;  // already taken
      if (before(x, best)) best = x;
    }
    best = block_first(best, scratch);
    if (threadIdx.x == 0) {
      const int64_t k = row * a.top_k + c;
      a.topk_ids[k] = best.id;  // K <= vocab (the config refuses more): always found
      a.topk_values[k] = best.value;
      float u = __fmul_rn(best.value, a.output_multiplier);
      if (a.softcap > 0.0f) u = __fmul_rn(a.softcap, tanhf(__fdiv_rn(u, a.softcap)));
      a.unary[k] = u;
    }
    prev = best;
  }
}

// One CTA per mask row, in three steps. (1) Each thread's first element of its stride of the row.
// (2) The threshold T: the K-th of those per-thread firsts (each thread counts the firsts ranked
// before its own). Every element of the row's top K ranks at or before T, since the firsts are K or
// more elements of the row. (3) The elements at or before T (at least K, few for real logits) go to
// shared memory, and K rounds pick the top K from them; past kTopkCandidates, from the row itself.
// The top K of a total order is unique, so the result does not depend on which path ran or on the
// candidates' order in shared memory: same bits as K passes over the row.
__global__ void __launch_bounds__(kTopkThreads) selector_topk_kernel(SelectorArgs a) {
  pdl_launch_dependents();
  pdl_wait();
  extern __shared__ Ranked candidates[];  // [kTopkCandidates]
  __shared__ Ranked firsts[kTopkThreads];
  __shared__ Ranked scratch[kTopkThreads / 32];
  __shared__ Ranked threshold;
  __shared__ int count;
  const int64_t row = blockIdx.x;
  const float* logits = a.logits + row * a.vocab;

  Ranked mine{0.0f, -1};
#pragma unroll 8
  for (int64_t v = threadIdx.x; v < a.vocab; v += kTopkThreads) {
    const Ranked x{logits[v], static_cast<int>(v)};
    if (before(x, mine)) mine = x;
  }
  firsts[threadIdx.x] = mine;
  if (threadIdx.x == 0) {
    threshold = Ranked{0.0f, -1};  // no K-th first (never with K <= vocab): every element passes
    count = 0;
  }
  __syncthreads();
  if (mine.id >= 0) {
    int ahead = 0;
    for (int j = 0; j < kTopkThreads; ++j) ahead += before(firsts[j], mine) ? 1 : 0;
    if (ahead == a.top_k - 1) threshold = mine;
  }
  __syncthreads();
  const Ranked t = threshold;
#pragma unroll 8
  for (int64_t v = threadIdx.x; v < a.vocab; v += kTopkThreads) {
    const Ranked x{logits[v], static_cast<int>(v)};
    if (t.id < 0 || x.id == t.id || before(x, t)) {
      const int slot = atomicAdd(&count, 1);
      if (slot < kTopkCandidates) candidates[slot] = x;
    }
  }
  __syncthreads();
  const int n = count;
  if (n <= kTopkCandidates) {
    select_rounds(a, row, [&](int64_t i) { return candidates[i]; }, n, scratch);
  } else {
    select_rounds(a, row, [&](int64_t i) { return Ranked{logits[i], static_cast<int>(i)}; }, a.vocab, scratch);
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

constexpr size_t kTopkSmemBytes = kTopkCandidates * sizeof(Ranked);

void launch_selector_topk(const SelectorArgs& a, cudaStream_t stream, bool pdl) {
  launch_kernel("selector_topk_kernel", selector_topk_kernel, dim3(static_cast<unsigned>(a.batch * a.slots)),
                dim3(kTopkThreads), kTopkSmemBytes, stream, pdl, a);
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
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&attributes, selector_walk_kernel));
}

}  // namespace dflash
