#include "cuda/tp/vocab_parallel.h"

#include <climits>
#include <string>

#include "core/error.h"
#include "cuda/kernels/gemm/gemm_epilogue.cuh"
#include "cuda/runtime/launch.cuh"
#include "testing/fault_points.cuh"

namespace dflash {
namespace {

constexpr int kThreads = 256;

// One CTA per row. Each rank's best is a block reduction over its columns; thread 0 merges the
// ranks' (value, global index) pairs in rank order (the order is total, so the order of the merge
// cannot change the winner).
__global__ void vocab_parallel_argmax_kernel(VocabShards s, float* logits, int64_t ld_logits, int32_t* tokens) {
  __shared__ float values[kThreads / 32];
  __shared__ int indices[kThreads / 32];
  const int64_t row = blockIdx.x;
  float merged = -INFINITY;
  int merged_index = INT_MAX;
  for (int r = 0; r < s.ranks; ++r) {
    const float* shard = s.base + r * s.rank_stride + row * s.ld;
    float best = -INFINITY;
    int best_local = INT_MAX;
    for (int64_t c = threadIdx.x; c < s.shard_vocab; c += blockDim.x) {
      const float v = shard[c];
      if (logits != nullptr) logits[row * ld_logits + r * s.shard_vocab + c] = v;
      if (argmax_better(v, static_cast<int>(c), best, best_local)) {
        best = v;
        best_local = static_cast<int>(c);
      }
    }
    warp_argmax(best, best_local);
    if ((threadIdx.x & 31) == 0) {
      values[threadIdx.x >> 5] = best;
      indices[threadIdx.x >> 5] = best_local;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < kThreads / 32; ++w) {
        if (argmax_better(values[w], indices[w], best, best_local)) {
          best = values[w];
          best_local = indices[w];
        }
      }
      int64_t offset = r * s.shard_vocab;
      DFLASH_DEVICE_MUTATE(kTpVocabOffset, if (r > 0) offset = (r - 1) * s.shard_vocab);
      const int global = static_cast<int>(offset + best_local);  // what rank r sends
      if (r == 0 || argmax_better(best, global, merged, merged_index)) {
        merged = best;
        merged_index = global;
      }
    }
    __syncthreads();  // values/indices are reused by the next rank
  }
  if (threadIdx.x == 0 && tokens != nullptr) tokens[row] = merged_index;
}

}  // namespace

void launch_vocab_parallel_argmax(cudaStream_t stream, const VocabShards& shards, float* logits, int64_t ld_logits,
                                  int32_t* tokens) {
  if (shards.ranks < 1 || shards.rows < 0 || shards.shard_vocab < 1 || shards.ld < shards.shard_vocab ||
      shards.ranks * shards.shard_vocab > INT_MAX || (logits != nullptr && ld_logits < shards.ranks * shards.shard_vocab)) {
    throw internal_error("vocab_parallel_argmax: " + std::to_string(shards.ranks) + " shards of " +
                         std::to_string(shards.shard_vocab) + " tokens");
  }
  if (shards.rows == 0) return;
  launch_kernel(DFLASH_KERNEL_SITE("vocab_parallel_argmax_kernel"), vocab_parallel_argmax_kernel,
                dim3(static_cast<unsigned>(shards.rows)), dim3(kThreads), 0, stream, false, shards, logits, ld_logits,
                tokens);
}

DFLASH_DEVICE_MUTATION_SETTER(vocab_parallel)

}  // namespace dflash
