// Attention of one propose (docs/spec/drafter.md §3): each block row's query heads attend, without a mask,
// to the sequence's cached context window (paged bf16 pool) followed by the B block rows (scratch),
// GQA, scores scaled by d^-1/2, fp32 softmax, output stored bf16 [rows, nh·d]. A DFlash2 sliding,
// non-causal layer (window_left = W - 1, docs/spec/dflash2.md §3.3) gives block row i a left edge:
// it sees the context positions from s + i - (W - 1) on and every block row; context rows that no
// block row sees are never read (zero-filled where a kernel stages them).
//
// Kernels, chosen in ONE place (choose_attention_kernel):
//  - tuned<D>, D in {64, 128, 256}: tensor cores over 64-key chunks, in one of two forms with the
//    same bits (attention_tiles.cuh): split-KV (one CTA per chunk, kv head and sequence, or a
//    few CTAs per kv head and sequence walking runs of its chunks where one per chunk would take
//    more than a wave; then a combine kernel) or whole-window (one CTA per kv head and sequence
//    walks every chunk and folds them as the combine does: no partials in memory). The form
//    follows the batch (attention_whole_window); attention_launch says which one runs. The
//    instantiation's compiled head_dim is part of the choice and checked against the config, so a
//    kernel built for one head_dim cannot run on another.
//  - generic: split-KV on CUDA cores (one CTA per chunk, kv head, group of 16 query rows and
//    sequence), head_dim a runtime value (any even d <= 256); same partial format and combine.
//  - simple: one CTA per (row, head), all scores in shared memory, for bisecting.
// All of them reduce in a fixed order: same inputs, same bits, whatever the other sequences.
#pragma once
#include <cstdint>
#include <string>

#include <cuda_runtime_api.h>

namespace dflash {

constexpr int kAttentionChunk = 64;     // keys per split-KV chunk
constexpr int kAttentionMaxHeadDim = 256;

enum class AttentionKernel { kTuned, kGeneric, kSimple };

// The tuned kernel's form: whole-window from kAttentionWholeWindowMinWarps warps (one per m-tile
// of 16 query rows of every sequence and kv head) on (auto), always (on), never (off: split-KV and
// combine at every batch). With fewer, the whole-window warps leave SMSPs idle through their
// chunk-by-chunk chains and the split-KV grid's parallel chunks win; from it they fill the SMs
// and save the partials' round trip (docs/benchmarks.md: 512 warps lose, 1024 win).
enum class WholeWindow { kAuto, kOn, kOff };
constexpr int kAttentionWholeWindowMinWarps = 1024;

struct AttentionChoice {
  AttentionKernel kernel = AttentionKernel::kGeneric;
  int compiled_head_dim = 0;  // tuned: the template's D; generic/simple: 0 (runtime)
  int walk_ctas = 0;          // tuned split-KV: CTAs per kv head and sequence walking runs of chunks;
                              // 0 = auto, -1 = off (one CTA per chunk; the drafter's levers are these
                              // two), > 0 = that many (the kernel tests walk the runs auto picks at
                              // other shapes, empty ones included)
  WholeWindow whole_window = WholeWindow::kAuto;  // tuned: the form (attention_whole_window)
  std::string name() const;   // e.g. "tuned-d128 (split-KV; whole-window from 1024 warps)"
};

// Whether a tuned propose runs whole-window (else split-KV and combine): batch sequences of
// block_width rows, num_heads query heads over num_kv_heads.
bool attention_runs_whole_window(const AttentionChoice& choice, int batch, int block_width, int num_heads,
                                 int num_kv_heads);

// requested: "auto" (tuned for 64/128/256, generic otherwise), "tuned" (refuses other head_dims
// with kBadInput naming the head_dim), "generic", "simple". Throws kBadInput for a head_dim no
// kernel can serve (odd, or above 256) or an unknown name.
AttentionChoice choose_attention_kernel(const std::string& requested, int head_dim);

// Device view of one propose's attention inputs. Shapes use R = batch·B block rows.
struct AttentionArgs {
  const uint16_t* q = nullptr;        // [R, nh·d] bf16, after q_norm and RoPE
  const uint16_t* k_block = nullptr;  // [R, nkv·d] bf16, block rows' keys
  const uint16_t* v_block = nullptr;  // [R, nkv·d] bf16
  const uint16_t* k_pool = nullptr;   // [slots, nkv·d] bf16, this layer's context keys
  const uint16_t* v_pool = nullptr;   // [slots, nkv·d] bf16
  const int32_t* block_tables = nullptr;   // [batch, max_pages_per_seq] physical page of each logical page
  const int64_t* window_begin = nullptr;   // [batch] first position attended to
  const int32_t* window_length = nullptr;  // [batch] context positions attended to
  const int64_t* first_logical_page = nullptr;  // [batch] logical page of block_tables[b][0]
  int max_pages_per_seq = 0;
  int page_size = 0;
  int window_left = -1;  // W - 1 for a sliding layer (the window ends at position s - 1); -1: full
  int batch = 0, block_width = 0;
  int num_heads = 0, num_kv_heads = 0, head_dim = 0;
  float scale = 0.0f;                  // d^-1/2
  int max_chunks = 0;                  // ceil((max window + max block width) / kAttentionChunk)
  int max_block_width = 0;             // partial buffers' row capacity per sequence
  float* partial_out = nullptr;        // [batch, nh, max_block_width, max_chunks, d]
  float* partial_max_sum = nullptr;    // [batch, nh, max_block_width, max_chunks, 2]
  uint16_t* out = nullptr;             // [R, ld_out] bf16 (columns nh·d onwards untouched)
  int64_t ld_out = 0;
  int sm_count = 0;  // the device's SMs (the whole-window form sizes its grid by them; host only)
};

// What launch_attention_chunks runs for `args` under `choice`: the decision it takes itself, so
// that a launch plan can report it (the walk count depends on the device's SMs and the walking
// kernel's occupancy).
enum class AttentionForm { kSimple, kGeneric, kSplitKv, kWalk, kWholeWindow };
struct AttentionLaunch {
  AttentionForm form = AttentionForm::kGeneric;
  int walk_ctas = 0;       // kWalk: CTAs per kv head and sequence
  bool combines() const;   // the split-KV forms leave partials for the combine kernel
  std::string name() const;  // e.g. "tuned split-KV, walking over 6 CTAs per kv head and sequence"
};
AttentionLaunch attention_launch(const AttentionChoice& choice, const AttentionArgs& args);

// Floats needed for partial_out / partial_max_sum.
int64_t attention_partial_floats(int max_batch, int num_heads, int max_block_width, int max_chunks, int head_dim);
// Dynamic shared memory the simple kernel needs for `max_keys` keys (it is refused above the limit).
size_t attention_simple_smem_bytes(int64_t max_keys);
// The most dynamic shared memory a kernel of the current device may use.
size_t attention_simple_max_smem_bytes();

// pdl: launch with programmatic dependent launch (cuda/runtime/launch.cuh; every kernel here waits first).
// launch_attention runs both kernels of the split-KV choices: the chunks (or, for simple and
// whole-window, the whole attention) and then the combine (nothing for those two), which are also
// launched one at a time by the block forward (each a kernel class of its own in the benchmark).
void launch_attention(const AttentionChoice& choice, const AttentionArgs& args, cudaStream_t stream, bool pdl = false);
void launch_attention_chunks(const AttentionChoice& choice, const AttentionArgs& args, cudaStream_t stream, bool pdl);
void launch_attention_combine(const AttentionChoice& choice, const AttentionArgs& args, cudaStream_t stream, bool pdl);

// Sets the kernels' shared-memory limits and loads them, so that nothing happens for the first
// time inside a graph capture.
void prepare_attention_kernels();

}  // namespace dflash
