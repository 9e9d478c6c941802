// The layer chain (KernelPlan::layer_chain): a run of the block forward's GEMMs and RMSNorms as ONE
// persistent kernel, one CTA per SM, the steps separated by grid-wide barriers. The drafter runs
// one chain per layer l:
//   o_l (+ residual) | post_attention RMSNorm | gate|up_l (+ SwiGLU) | down_l (+ residual) |
//   input RMSNorm of l+1 (final norm after the last layer) | q|k|v of l+1 (lm_head: a lever)
// so that only q/k norm + RoPE and the attention run as kernels of their own between chains.
//
// Why: at batch 1 every GEMM of the drafter is a weight stream (docs/benchmarks.md), and a kernel
// boundary drains it: the next kernel's CTAs get an SM only once this one's leave it. In the chain
// each warp streams the weights of every GEMM step through one cp.async ring in the order it will
// consume them, across step boundaries: while a CTA waits at a barrier, its ring keeps filling
// with the next step's weights (they depend on nothing), so the weights keep flowing while the
// activations cross the barrier. Measured on an H200 it is slower than the separate kernels (one
// CTA of 8 warps per SM streams 32-column units at ~1.8 TB/s, issue-bound; docs/benchmarks.md,
// "The layer chain"), so layer_chain=auto leaves it off (kLayerChainByDefault) and it is a lever.
//
// Bits: a GEMM output element is reduced exactly as the mma kernel reduces it (gemm_tiles.cuh: the
// same k-tiles per warp, mma steps and warp order), the RMSNorm rows in the tuned kernel's order
// (rmsnorm_row.cuh), the epilogues are the same code: the chain's outputs are bit-identical to the
// separate kernels' (tested in gpu_drafter_test, also at the Qwen3-8B geometry).
//
// Limits, checked by layer_chain_refusal: E4M3 weights, at most 16 rows per GEMM (one 16-row
// tile), RMSNorm rows the vectorized kernel serves (rmsnorm_vec_fits). The grid barriers need
// every CTA of the launch resident at once: the grid is at most the SMs times
// layer_chain_ctas_per_sm (checked at construction), and nothing else may hold SMs for the whole
// kernel (two chains on concurrent streams could each hold half the GPU). A barrier that waits
// longer than kLayerChainBarrierTimeoutNs stops the kernel with a trap (a CUDA error, not a hang).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "cuda/elementwise.h"
#include "cuda/gemm.h"

namespace dflash {

constexpr int kLayerChainMaxSteps = 7;
constexpr int kLayerChainMaxGemms = 5;
constexpr int kLayerChainMaxNorms = 2;
constexpr int64_t kLayerChainMaxRows = 16;
constexpr uint64_t kLayerChainBarrierTimeoutNs = 2'000'000'000;  // 2 s: a barrier takes microseconds
// Whether layer_chain=auto runs the chain: not yet, it is slower than the separate kernels on an
// H200 (docs/benchmarks.md, "The layer chain").
constexpr bool kLayerChainByDefault = false;

struct LayerChainStep {
  enum class Kind { kGemm, kRmsNorm };
  Kind kind = Kind::kGemm;
  // kGemm: C = A·Wᵀ with the epilogue; A [m, lda] bf16 (16-byte aligned, lda >= w.k_pad, a multiple
  // of 8, columns past k zero), m <= kLayerChainMaxRows.
  const uint16_t* a = nullptr;
  int64_t lda = 0, m = 0;
  DeviceMatrixView w;
  GemmEpilogue epilogue;
  // kRmsNorm: norm.rows <= kLayerChainMaxRows.
  RmsNormArgs norm;
};

// Why `steps` cannot run as one chain (empty when it can): too many steps, a non-E4M3 weight, too
// many rows, misaligned operands, a norm the vectorized kernel would not serve.
std::string layer_chain_refusal(const std::vector<LayerChainStep>& steps);

// Enqueues the chain on `stream` with `ctas` CTAs. `barrier`: one device counter (zeroed once, at
// allocation) that only this chain's position in the forward uses, with the same step count at
// every launch: the barriers count up from wherever the last launch left it, never reset. pdl:
// the launch may start while the previous kernel runs (its CTAs stream their first weight tiles
// before the PDL wait). Throws kInternal with layer_chain_refusal's reason for steps it cannot run.
void launch_layer_chain(const std::vector<LayerChainStep>& steps, int ctas, unsigned long long* barrier,
                        cudaStream_t stream, bool pdl);

// The chain kernel's dynamic shared memory (its weight rings and reduction buffers).
size_t layer_chain_smem_bytes();
// CTAs of the chain kernel that fit on one SM of the current device at once (0: none). The first
// call also sets the kernel's shared-memory limit (once per process), so calling it at
// construction keeps that out of any graph capture.
int layer_chain_ctas_per_sm();

}  // namespace dflash
