// DFlash2's candidate selector on the device (docs/spec/dflash2.md §3.4), replacing the per-row
// argmax: for each mask row, the top-K token ids of the raw logits (descending value, lower id first
// on equal values; NaN ranks above every number, as in the argmax), the unary scores (multiplier,
// then softcap), then per sequence the edge scores from the codebooks and the projected final-normed
// rows, and the greedy walk (predecessor slot 0 first, lowest slot on ties). The walk's tokens are
// the draft tokens.
//
// The kernels: top-K, over slices of each mask row, then a merge per row (a row's candidates depend
// on that row only; at TP = N the slices lie inside the N vocabulary shards and the merge is
// docs/spec/tensor-parallel.md §5.3's global merge of the shards' candidates); edge scores, one
// warp per score; the walk, one warp per sequence. Every value is reduced in a fixed order and the
// top-K order is total: same inputs, same bits, whatever the batch. Nothing is allocated:
// graph-capturable.
#pragma once
#include <cstdint>

#include <cuda_runtime_api.h>

namespace dflash {

// The most candidates per slot the kernels serve (dflash_config.selector_top_k; published 16).
constexpr int kSelectorMaxTopK = 256;
// The threshold top-K: one CTA of kSelectorTopkThreads per slice of kSelectorTopkSlice logits of a
// row, each thread taking every kSelectorTopkThreads-th element of its slice.
constexpr int kSelectorTopkThreads = 256;
constexpr int64_t kSelectorTopkSlice = 16384;

struct SelectorArgs {
  int batch = 0;
  int slots = 0;  // n = B - 1 mask rows per sequence; row r of the buffers is sequence r / n, slot r % n
  int64_t vocab = 0;
  int top_k = 0;  // K
  int shards = 1;  // vocabulary shards (tensor-parallel.md §5.3), dividing vocab: no slice crosses one
  int rank = 0;   // r
  float output_multiplier = 1.0f;
  float softcap = 0.0f;  // 0: off
  const float* logits = nullptr;        // [batch·n, vocab] raw lm_head outputs
  const float* hidden_proj = nullptr;   // [batch·n, rank] hidden_projection of the final-normed mask rows
  const uint16_t* predecessor = nullptr;  // [vocab, rank] bf16 codebook
  const uint16_t* successor = nullptr;    // [vocab, rank] bf16 codebook
  const int32_t* anchors = nullptr;     // [batch]: slot 0's predecessor
  uint64_t* topk_keys = nullptr;        // [batch·n, slices, K]: the threshold top-K's per-slice keys
  int32_t* topk_ids = nullptr;          // [batch·n, K]
  float* topk_values = nullptr;         // [batch·n, K]
  float* unary = nullptr;               // [batch·n, K]
  float* edge_scores = nullptr;         // [batch·n, K, K]: [slot, predecessor slot, candidate slot]
  float* walk_scores = nullptr;         // [batch·n, K]: the edge row the walk read
  int32_t* walk_index = nullptr;        // [batch·n]
  int32_t* tokens = nullptr;            // [batch·n]: the draft tokens
};

// The top-K kernel (selector_topk): threshold (default) splits each row into slices, passes over
// each slice twice, keeping the elements at or before the K-th of its threads' firsts in shared
// memory, then merges the slices' K best (two launches); plain makes K passes over the row (whole,
// at any shard count). The top K of a total order is unique: both give the same bits.
enum class SelectorTopK { kThreshold, kPlain };

// The keys SelectorArgs::topk_keys must hold for the threshold kernel.
int64_t selector_topk_keys(int64_t rows, int64_t vocab, int top_k, int shards = 1);

void launch_selector_topk(const SelectorArgs& args, SelectorTopK kernel, cudaStream_t stream, bool pdl);
// The edge scores, then the walk (two launches; the kernel class selector_walk).
void launch_selector_walk(const SelectorArgs& args, cudaStream_t stream, bool pdl);

void prepare_selector_kernels();

}  // namespace dflash
