// What the GPU tests and the benchmarks ask of a CudaDrafter beyond DraftProposer: its stream,
// its graphs, its device weights, and the block forward replayed or timed without some of its
// kernels. Not for production callers (tools/ and compare/ use make_cuda_drafter only).
#pragma once
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "core/fp8.h"
#include "cuda/drafter/cuda_drafter_impl.h"

namespace dflash {

// The stream every launch of the drafter goes to.
cudaStream_t drafter_stream(const CudaDrafter& drafter);

// The kernel plan the drafter resolved at construction.
const KernelPlan& drafter_kernel_plan(const CudaDrafter& drafter);

// Whether the block forward of (block_width, batch) runs as a captured CUDA graph by now.
bool drafter_graph_captured(const CudaDrafter& drafter, int block_width, int batch);

// Enqueues the block forward of the last propose again (same device inputs), as a graph replay
// when the graph exists, on drafter_stream(). Nothing is copied back. kBadInput before any propose.
void enqueue_last_block_forward(CudaDrafter& drafter);

// The device's copy of an E4M3 weight: "qkv", "o", "gate_up", "down" of `layer`, or "lm_head".
QuantizedRows download_fp8_weight(const CudaDrafter& drafter, const std::string& which, int layer);

// Bytes one block forward must read from HBM at least: every projection weight in its storage
// format (lm_head included), the norms, and DFlash2's convolution weights and hidden_projection; the
// KV cache and the codebook rows the walk reads are counted separately by the caller.
int64_t block_weight_bytes(const CudaDrafter& drafter);

// The last propose's block forward as a CUDA graph of its own, without the launches of the kernel
// classes in `without` (CudaDrafter::ForwardLaunch: "rmsnorm", "qkv", "qk_norm_rope",
// "attention_chunks", "combine", "o", "gate_up", "swiglu", "down", "lm_head", "argmax"; DFlash2:
// "conv_coef", "conv", "hidden_proj", "selector_topk", "selector_walk"): TIMING
// ONLY, what a class costs inside the graph is the time it saves; the outputs it leaves in the
// drafter's buffers are wrong until the next propose. The drafter itself and its own graphs are
// untouched. A class this forward does not launch, or "embed" (the first kernel, which every
// other one waits for), is refused with kBadInput naming it.
class BlockForwardWithout {
 public:
  BlockForwardWithout(CudaDrafter& drafter, const std::set<std::string>& without);
  ~BlockForwardWithout();
  BlockForwardWithout(const BlockForwardWithout&) = delete;
  BlockForwardWithout& operator=(const BlockForwardWithout&) = delete;
  void enqueue();  // on drafter_stream()

 private:
  cudaStream_t stream_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

// Negative controls for the stored-state checks (the GPU tests): faults planted after a propose
// with the page-table bookkeeping untouched.
// Layer `layer`'s K and V of slot `from` copied over slot `to` (a row stored at the wrong slot).
void copy_kv_slot(CudaDrafter& drafter, int layer, int64_t from, int64_t to);
// Layer `layer`'s K and V of every slot in `slots` overwritten with the bf16 bit pattern `bits`
// (0xFFFF is NaN): garbage where the drafter must not read.
void fill_kv_slots(CudaDrafter& drafter, int layer, const std::vector<int64_t>& slots, uint16_t bits);
// The last layer's block K/V of the last propose's first block row stored at `slot` (a block row
// kept in the pool).
void store_block_row(CudaDrafter& drafter, int64_t slot);
// The last propose's windows one row longer on the device (the page table unchanged), so the next
// enqueue_last_block_forward() has attention read one row past each window.
void lengthen_last_windows(CudaDrafter& drafter);

// Parses a '+'-separated list of kernel classes ("o+down"; "" or "none": no class).
std::set<std::string> parse_kernel_classes(const std::string& list);

}  // namespace dflash
