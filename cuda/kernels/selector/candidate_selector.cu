#include "cuda/kernels/selector/candidate_selector.h"

#include <algorithm>
#include <string>

#include <cuda_bf16.h>

#include "core/error.h"
#include "cuda/runtime/cuda_check.h"
#include "cuda/runtime/launch.cuh"
#include "testing/fault_points.h"

namespace dflash {
namespace {

constexpr int kTopkThreads = kSelectorTopkThreads;
constexpr int kPlainTopkThreads = 256;
constexpr int kEdgeThreads = 256;  // 8 edge scores per CTA
// Shared-memory candidates of a slice's threshold pass. At most K · (slice / kTopkThreads) elements
// can pass the threshold (only the K threads whose own first reaches it hold any): 1024 for K = 16;
// more fall back to K passes over the slice.
constexpr int kTopkCandidates = 4096;

// The top-K order, total: NaN first (lower id first among NaNs), then larger values, then lower ids.
// As a comparison (the plain kernel):
__device__ __forceinline__ bool ranks_before(float va, int ia, float vb, int ib) {
  const bool an = isnan(va), bn = isnan(vb);
  if (an != bn) return an;
  if (!an && va != vb) return va > vb;
  return ia < ib;
}

// The same order (-0 and +0 are equal values) as one unsigned key (the threshold kernel), smaller
// first: the value's rank in the high word (NaN 0; numbers by their bits made ascending, then
// inverted), the id in the low word.
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

// K rounds over n keys key_at(i), each picking the smallest key above the previous pick (kNoKey
// once the keys run out), handed to emit(c, key) in every thread.
template <typename KeyAt, typename Emit>
__device__ void select_rounds(int top_k, const KeyAt& key_at, int64_t n, uint64_t* scratch, const Emit& emit) {
  bool first = true;
  uint64_t prev = 0;
  for (int c = 0; c < top_k; ++c) {
    uint64_t best = kNoKey;
    for (int64_t i = threadIdx.x; i < n; i += kTopkThreads) {
      const uint64_t key = key_at(i);
      if (first || key > prev) best = min(best, key);
    }
    best = block_min(best, scratch);
    emit(c, best);
    prev = best;
    first = false;
  }
}

// The K smallest of n keys key_at(i), in order, in three steps. (1) Each thread's first (smallest)
// key of its stride. (2) The threshold T: the K-th smallest of those firsts (K rounds of a block
// minimum); every one of the K smallest keys is <= T, since the firsts are K keys or more. (3) The
// keys <= T go to shared memory, and K rounds pick from them; past kTopkCandidates, from key_at
// itself. The K smallest of distinct keys are unique: neither the path nor the candidates' order
// changes them.
template <typename KeyAt, typename Emit>
__device__ void smallest_keys(int top_k, const KeyAt& key_at, int64_t n, uint64_t* candidates, uint64_t* scratch,
                              int* count, const Emit& emit) {
  uint64_t mine = kNoKey;
  // 16 loads in flight per thread.
#pragma unroll 16
  for (int64_t i = threadIdx.x; i < n; i += kTopkThreads) mine = min(mine, key_at(i));
  if (threadIdx.x == 0) *count = 0;  // the block minimums' barriers order this before the atomics
  uint64_t threshold = 0;
  for (int c = 0; c < top_k; ++c) threshold = block_min(c == 0 || mine > threshold ? mine : kNoKey, scratch);
  // threshold == kNoKey: fewer than K firsts; every key passes.
#pragma unroll 16
  for (int64_t i = threadIdx.x; i < n; i += kTopkThreads) {
    const uint64_t key = key_at(i);
    if (key <= threshold) {
      const int slot = atomicAdd(count, 1);
      if (slot < kTopkCandidates) candidates[slot] = key;
    }
  }
  __syncthreads();
  const int found = *count;
  if (found <= kTopkCandidates) {
    select_rounds(top_k, [&](int64_t i) { return candidates[i]; }, found, scratch, emit);
  } else {
    select_rounds(top_k, key_at, n, scratch, emit);
  }
}

// Slices per vocabulary shard, and in a row: each shard of vocab / shards logits is cut on its own.
__host__ __device__ constexpr int64_t shard_slices(int64_t vocab, int shards) {
  return (vocab / shards + kSelectorTopkSlice - 1) / kSelectorTopkSlice;
}
__host__ __device__ constexpr int64_t topk_slices(int64_t vocab, int shards) { return shards * shard_slices(vocab, shards); }

// The threshold top-K, step 1: one CTA per (mask row, slice of kSelectorTopkSlice logits) writes
// its slice's K smallest keys (kNoKey past the slice's length) to topk_keys, so that a row's
// logits stream through many SMs at once.
__global__ void __launch_bounds__(kTopkThreads) selector_topk_slices_kernel(SelectorArgs a) {
  pdl_launch_dependents();
  pdl_wait();
  extern __shared__ uint64_t candidates[];  // [kTopkCandidates]
  __shared__ uint64_t scratch[kTopkThreads / 32];
  __shared__ int count;
  const int64_t slices = topk_slices(a.vocab, a.shards), per_shard = shard_slices(a.vocab, a.shards);
  const int64_t row = blockIdx.x / slices, slice = blockIdx.x % slices;
  const int64_t shard_vocab = a.vocab / a.shards, within = (slice % per_shard) * kSelectorTopkSlice;
  const int64_t begin = (slice / per_shard) * shard_vocab + within;
  const int64_t n = min(kSelectorTopkSlice, shard_vocab - within);
  const float* logits = a.logits + row * a.vocab + begin;
  uint64_t* out = a.topk_keys + (row * slices + slice) * a.top_k;
  smallest_keys(
      a.top_k, [&](int64_t i) { return order_key(logits[i], static_cast<int>(begin + i)); }, n, candidates, scratch,
      &count, [&](int c, uint64_t key) {
        if (threadIdx.x == 0) out[c] = key;
      });
}

// Step 2: one CTA per mask row picks the K smallest of its slices' keys (`merged` of the row's
// `per_row`), and stores their ids, logits and unary scores (multiplier, then softcap).
__global__ void __launch_bounds__(kTopkThreads) selector_topk_merge_kernel(SelectorArgs a, int64_t per_row,
                                                                             int64_t merged) {
  pdl_launch_dependents();
  pdl_wait();
  __shared__ uint64_t scratch[kTopkThreads / 32];
  const int64_t row = blockIdx.x;
  const uint64_t* keys = a.topk_keys + row * per_row;
  select_rounds(a.top_k, [&](int64_t i) { return keys[i]; }, merged, scratch, [&](int c, uint64_t key) {
    if (threadIdx.x != 0) return;
    const int64_t k = row * a.top_k + c;
    // K <= vocab (the config refuses more): a pick is always found; -1 and NaN if not.
    const int id = key == kNoKey ? -1 : static_cast<int>(key & 0xffffffffu);
    const float value = id >= 0 ? a.logits[row * a.vocab + id] : __int_as_float(0x7fffffff);
    a.topk_ids[k] = id;
    a.topk_values[k] = value;
    float u = __fmul_rn(value, a.output_multiplier);
    if (a.softcap > 0.0f) u = __fmul_rn(a.softcap, tanhf(__fdiv_rn(u, a.softcap)));
    a.unary[k] = u;
  });
}

// The plain top-K (selector_topk=plain), kept to bisect with: one CTA per mask row, K rounds over
// the row, each finding the first element (in the top-K order) after the previous round's pick.
// The pick is the minimum of a total order, so the reduction's grouping cannot change it.
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

// One warp per edge score S[t, p, c] = unary[t, c] + Σ_j A[pred, j]·Hh[t, j]·Bs[id, j]: lane l adds
// the terms j = l, l + 32, ... in order, then the lanes' sums meet in a butterfly, which leaves the
// same bits in every lane. Each score depends on its own operands only, in a fixed order.
__global__ void __launch_bounds__(kEdgeThreads) selector_edges_kernel(SelectorArgs a) {
  pdl_launch_dependents();
  pdl_wait();
  const int k = a.top_k, r = a.rank, lane = threadIdx.x & 31;
  const int64_t scores = static_cast<int64_t>(a.batch) * a.slots * k * k;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kEdgeThreads / 32);
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * (kEdgeThreads / 32) + (threadIdx.x >> 5); e < scores; e += warps) {
    const int64_t row = e / (static_cast<int64_t>(k) * k);  // the mask row: sequence row / slots, slot row % slots
    const int p = static_cast<int>((e / k) % k), c = static_cast<int>(e % k);
    const int64_t pred = row % a.slots == 0 ? a.anchors[row / a.slots] : a.topk_ids[(row - 1) * k + p];
    const int64_t succ = a.topk_ids[row * k + c];
    const __nv_bfloat16* pa = reinterpret_cast<const __nv_bfloat16*>(a.predecessor) + pred * r;
    const __nv_bfloat16* sb = reinterpret_cast<const __nv_bfloat16*>(a.successor) + succ * r;
    const float* hh = a.hidden_proj + row * r;
    float sum = 0.0f;
    for (int j = lane; j < r; j += 32) {
      sum = __fadd_rn(sum, __fmul_rn(__fmul_rn(__bfloat162float(pa[j]), hh[j]), __bfloat162float(sb[j])));
    }
    for (int offset = 16; offset > 0; offset >>= 1) sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, offset));
    if (lane == 0) a.edge_scores[e] = __fadd_rn(a.unary[row * k + c], sum);
  }
}

// One warp per sequence walks its slots: at slot t, the first maximum of the edge row S[t, prev, :]
// (the lowest slot on ties, NaN never a maximum; a NaN in slot 0 keeps slot 0, as a scan that moves
// only to a strictly larger score would).
__global__ void __launch_bounds__(32) selector_walk_kernel(SelectorArgs a) {
  pdl_launch_dependents();
  pdl_wait();
  const int k = a.top_k, lane = threadIdx.x;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * a.slots;
  int prev = 0;
  for (int t = 0; t < a.slots; ++t) {
    const float* scores = a.edge_scores + ((row0 + t) * k + prev) * k;
    float best_value = 0.0f;
    int best = -1;  // -1: none yet (every score of this lane NaN)
    for (int c = lane; c < k; c += 32) {
      const float s = scores[c];
      a.walk_scores[(row0 + t) * k + c] = s;
      if (!isnan(s) && (best < 0 || s > best_value)) best_value = s, best = c;
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
      const float other_value = __shfl_xor_sync(0xffffffffu, best_value, offset);
      const int other = __shfl_xor_sync(0xffffffffu, best, offset);
      const bool take = other >= 0 && (best < 0 || other_value > best_value || (!(best_value > other_value) && other < best));
      if (take) best_value = other_value, best = other;
    }
    if (best < 0 || isnan(scores[0])) best = 0;
    if (lane == 0) {
      a.walk_index[row0 + t] = best;
      a.tokens[row0 + t] = a.topk_ids[(row0 + t) * k + best];
    }
    prev = best;
  }
}

}  // namespace

constexpr size_t kTopkSmemBytes = kTopkCandidates * sizeof(uint64_t);
// Within the 48 KB a launch may ask for without cudaFuncAttributeMaxDynamicSharedMemorySize.
static_assert(kTopkSmemBytes <= 48 * 1024, "the slices kernel's candidates need an opt-in above 48 KB");

int64_t selector_topk_keys(int64_t rows, int64_t vocab, int top_k, int shards) {
  return rows * topk_slices(vocab, shards) * top_k;
}

void launch_selector_topk(const SelectorArgs& a, SelectorTopK kernel, cudaStream_t stream, bool pdl) {
  const int64_t rows = static_cast<int64_t>(a.batch) * a.slots;
  if (kernel == SelectorTopK::kPlain) {
    launch_kernel(DFLASH_KERNEL_SITE("selector_topk_plain_kernel"), selector_topk_plain_kernel, dim3(static_cast<unsigned>(rows)),
                  dim3(kPlainTopkThreads), 0, stream, pdl, a);
    return;
  }
  if (a.shards < 1 || a.vocab % a.shards != 0) {
    throw internal_error("selector top-K: " + std::to_string(a.shards) + " shards of a vocabulary of " +
                         std::to_string(a.vocab));
  }
  const int64_t slices = topk_slices(a.vocab, a.shards);
  const int64_t ctas = rows * slices;
  if (ctas > INT32_MAX) {
    throw internal_error("selector top-K: " + std::to_string(rows) + " rows x " + std::to_string(slices) +
                         " slices exceed the grid");
  }
  const int64_t per_row = slices * a.top_k;
  int64_t merged = per_row;
  DFLASH_MUTATE(kernel_mutation(), kTpShardTopkUnmerged, if (a.shards > 1) merged = shard_slices(a.vocab, a.shards) * a.top_k);
  launch_kernel(DFLASH_KERNEL_SITE("selector_topk_slices_kernel"), selector_topk_slices_kernel, dim3(static_cast<unsigned>(ctas)),
                dim3(kTopkThreads), kTopkSmemBytes, stream, pdl, a);
  launch_kernel(DFLASH_KERNEL_SITE("selector_topk_merge_kernel"), selector_topk_merge_kernel, dim3(static_cast<unsigned>(rows)),
                dim3(kTopkThreads), 0, stream, pdl, a, per_row, merged);
}

void launch_selector_walk(const SelectorArgs& a, cudaStream_t stream, bool pdl) {
  const int64_t scores = static_cast<int64_t>(a.batch) * a.slots * a.top_k * a.top_k;
  const int64_t per_cta = kEdgeThreads / 32;
  const int64_t ctas = std::min<int64_t>((scores + per_cta - 1) / per_cta, int64_t{1} << 20);  // then grid-stride
  launch_kernel(DFLASH_KERNEL_SITE("selector_edges_kernel"), selector_edges_kernel, dim3(static_cast<unsigned>(ctas)),
                dim3(kEdgeThreads), 0, stream, pdl, a);
  launch_kernel(DFLASH_KERNEL_SITE("selector_walk_kernel"), selector_walk_kernel, dim3(static_cast<unsigned>(a.batch)), dim3(32),
                0, stream, pdl, a);
}

void prepare_selector_kernels() {
  cudaFuncAttributes attributes;
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&attributes, selector_topk_slices_kernel));
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&attributes, selector_topk_merge_kernel));
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&attributes, selector_topk_plain_kernel));
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&attributes, selector_edges_kernel));
  DFLASH_CUDA_CHECK(cudaFuncGetAttributes(&attributes, selector_walk_kernel));
}

}  // namespace dflash
