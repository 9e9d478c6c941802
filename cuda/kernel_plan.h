// The kernel chosen for every stage of the CUDA drafter, resolved once at construction from
// CudaOptions::kernels (after the environment), with the fallbacks taken and why. Stages and values
// (docs/cuda-drafter.md):
//   gemm          block-row GEMMs: mma (default; aliases auto, small-m, fp8-small-m, bf16-small-m),
//                 mma-splitk (K split across CTAs for narrow N; bitwise batch invariant),
//                 cublaslt (alias cublas), simple
//   ctx_gemm      context-row GEMMs (fc, k/v): mma (default: bitwise batch invariant), mma-splitk,
//                 auto (cuBLASLt for bf16 weights when a chunk has more than 64 rows, mma otherwise:
//                 invariant only within a rounding bound), cublaslt, simple
//   attention     auto (default), tuned, generic, simple
//   attention_pass_ctas  1 (default), 2, 4 (auto = 1): CTAs sharing each chunk of the tuned
//                 attention, each with every n-th 64-column P·V pass (at most head_dim / 64; bits do
//                 not change with it)
//   rmsnorm       tuned (default), simple
//   qk_norm_rope  tuned (default), simple
//   swiglu        fused (default: in the gate|up GEMM's epilogue), separate
//   argmax        fused (default: partials in the lm_head GEMM's epilogue), separate
//   gemm_cols     auto (default: by weight shape), 32, 64, 96, 128: the mma kernel's CTA width at
//                 m <= 16 (bits do not change with it)
//   gemm_cols_m64 auto (default: by weight shape for E4M3, 32 for bf16), 32, 64: the mma kernel's CTA
//                 width at m > 16 (64-row tiles; 64 with bf16 weights falls back to 32 and the plan
//                 says so; bits do not change with it)
//   gemm_pipeline deep (default), deep-shared, ring: how the mma kernel streams operands at m <= 16 (only the
//                 weights through a deep shared-memory ring with the activations in registers, or
//                 weights and activations through a shallower ring; bits do not change with it)
//   gemm_trigger  last-issue (default), loop-end, start: where the deep pipeline's CTAs let the next
//                 kernel of the PDL chain be scheduled: once a warp has issued its last weight
//                 copy, after the main loop, or at the start (bits do not change with it)
//   gemm_solo_smem lean (default), full: the deep pipeline's solo layout takes at most 186 KB of shared
//                 memory, so that an attention CTA fits beside it, or up to 220 KB (bits do not change)
//   ablate        none (default), or a '+'-separated list of rmsnorm, qk_norm_rope, attention (both
//                 kernels), attention_chunks, combine, qkv, o, gate_up, down, lm_head, argmax: TIMING ONLY, those kernels of the block
//                 forward are not launched, so the outputs are wrong; what a kernel class costs
//                 inside the graph is the time it saves (docs/benchmarks.md)
//   pdl           on (default), off: programmatic dependent launch between the block forward's
//                 kernels (each next kernel is scheduled early and GEMMs stream weights before
//                 the previous kernel ends; bits do not change with it)
//   layer_chain   auto (default: off, kLayerChainByDefault: slower on an H200), on, off: each
//                 layer's o, post-attention RMSNorm, gate|up, down, the next input RMSNorm and
//                 q|k|v as one persistent kernel (cuda/layer_chain.h) for block forwards of at most
//                 16 rows with E4M3 weights, the mma GEMMs, the tuned RMSNorm and the fused SwiGLU;
//                 on where it cannot apply is reported under fallbacks (bits do not change with it)
//   layer_chain_ctas auto (default: one per SM), or a count up to the SMs: the chain's grid (fewer
//                 CTAs run more units each; for tests and bisecting; bits do not change with it)
//   layer_chain_lm_head off (default), on: the lm_head (with its argmax partials) as the last step of
//                 the last layer's chain instead of a kernel of its own (bits do not change with it)
#pragma once
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cuda/attention.h"
#include "cuda/elementwise.h"
#include "cuda/gemm.h"

namespace dflash {

struct KernelPlan {
  GemmKernel block_gemm = GemmKernel::kMma;
  // Default mma: drafter.md §5 asks our own kernels to be batch invariant bit for bit; cuBLASLt's
  // algorithm changes with the number of rows, so it is a lever, not the default.
  bool ctx_gemm_auto = false;  // auto: per chunk and weight format
  GemmKernel ctx_gemm = GemmKernel::kMma;  // when not auto
  AttentionChoice attention;
  RowKernel rmsnorm = RowKernel::kTuned;
  RowKernel qk_norm_rope = RowKernel::kTuned;
  bool swiglu_fused = true;
  bool argmax_fused = true;
  int gemm_columns = 0;  // 0: auto
  int gemm_columns_m64 = GemmContext{}.mma_columns_m64;  // 0: auto
  GemmPipeline gemm_pipeline = GemmPipeline::kDeep;
  GemmTrigger gemm_trigger = GemmContext{}.mma_trigger;
  bool gemm_lean_solo = GemmContext{}.mma_lean_solo;
  bool pdl = true;
  // The layer chain (cuda/layer_chain.h): requested auto / on / off; the drafter resolves it.
  enum class Chain { kAuto, kOn, kOff };
  Chain layer_chain = Chain::kAuto;
  int layer_chain_ctas = 0;  // 0: one CTA per SM
  bool layer_chain_lm_head = false;
  std::string layer_chain_resolved;  // set by the drafter: what runs, and why when it is off
  std::set<std::string> ablate;  // block-forward kernels not launched (timing only)
  bool ablated(const char* kernel) const { return ablate.count(kernel) != 0; }
  std::vector<std::string> fallbacks;  // "stage: wanted -> used (why)"

  // Rows above which ctx_gemm=auto hands bf16-weight context GEMMs to cuBLASLt.
  static constexpr int64_t kCtxLibraryMinRows = 65;
  GemmKernel ctx_kernel(int64_t rows, WeightFormat format) const;
  bool uses_cublaslt() const;
  // Whether an E4M3 weight may reach cuBLASLt (it then needs a decoded bf16 copy).
  bool cublaslt_reads_e4m3(bool fp8) const;
};

// Throws kBadInput naming the stage or value for unknown stages or kernels, and for a head_dim no
// attention kernel serves.
KernelPlan resolve_kernel_plan(const std::map<std::string, std::string>& requested, int head_dim);

// describe() entries of the plan.
std::vector<std::pair<std::string, std::string>> describe_kernel_plan(const KernelPlan& plan, bool fp8);

}  // namespace dflash
