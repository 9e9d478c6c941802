// The vocabulary-parallel argmax of docs/spec/tensor-parallel.md §5.2 on the device: rank r holds
// the logits of tokens [r·V/N, (r+1)·V/N); each rank's best (the greatest value, NaN above every
// number, the lowest local index on ties) travels with its global index r·V/N + local, and the N
// pairs are merged under the same order with global indices. Equal to the one-device argmax.
#pragma once
#include <cstdint>

#include <cuda_runtime_api.h>

namespace dflash {

struct VocabShards {
  const float* base = nullptr;  // rank r's logits [rows, shard_vocab] at base + r·rank_stride, leading dimension ld
  int64_t rank_stride = 0;
  int ranks = 0;
  int64_t rows = 0, shard_vocab = 0, ld = 0;
};

// tokens[m] = the merged argmax of row m (null: none); logits, when not null, receives every shard's
// values at their global columns ([rows, ranks·shard_vocab], leading dimension ld_logits).
void launch_vocab_parallel_argmax(cudaStream_t stream, const VocabShards& shards, float* logits, int64_t ld_logits,
                                  int32_t* tokens);

}  // namespace dflash
