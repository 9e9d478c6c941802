// The kernel chosen for every stage of the CUDA drafter, resolved once at construction from
// CudaOptions::kernels (after the environment), with the fallbacks taken and why. Stages and values
// (docs/cuda-drafter.md):
//   gemm          block-row GEMMs: mma (default; aliases auto, small-m, fp8-small-m, bf16-small-m),
//                 cublaslt (alias cublas), simple
//   gemm_m64      block-row GEMMs of 64 rows or more (with gemm=mma): library (default; alias auto:
//                 CUTLASS's mixed-input wgmma GEMM for E4M3 weights, cuBLASLt for bf16 weights; the
//                 results then change with the batch within a rounding bound), mma (bitwise batch
//                 invariant at every row count)
//   ctx_gemm      context-row GEMMs (fc, k/v): mma (default: bitwise batch invariant),
//                 auto (cuBLASLt for bf16 weights when a chunk has more than 64 rows, mma otherwise:
//                 invariant only within a rounding bound), cublaslt, simple
//   attention     auto (default), tuned, generic, simple
//   attention_pass_ctas  1 (default), 2, 4 (auto = 1): CTAs sharing each chunk of the tuned
//                 attention, each with every n-th 64-column P·V pass (at most head_dim / 64; bits do
//                 not change with it)
//   attention_walk_ctas  auto (default: off while one CTA per 64-key chunk fits in one wave, else as
//                 many CTAs per kv head and sequence as one wave holds), off, 1, 2, 3, 4, 6, 8, 16:
//                 CTAs per kv head and sequence of the split-KV kernel that walks balanced runs of
//                 the sequence's chunks (bits do not change with it)
//   attention_whole_window  auto (default: from 1024 warps, one per 16 query rows of a sequence
//                 and kv head), on, off: the tuned attention as one whole-window kernel instead of
//                 split-KV and combine (bits do not change with it)
//   rmsnorm       tuned (default), simple
//   qk_norm_rope  tuned (default), simple
//   swiglu        fused (default: in the gate|up GEMM's epilogue), separate
//   argmax        fused (default: partials in the lm_head GEMM's epilogue), separate
//   gemm_cols     auto (default: by weight shape), 32, 64, 96, 128: the mma kernel's CTA width at
//                 m <= 16 (bits do not change with it)
//   gemm_cols_m64 auto (default: by weight shape for E4M3, 32 for bf16), 32, 64: the mma kernel's CTA
//                 width at m > 16 (64-row tiles; 64 with bf16 weights falls back to 32 and the plan
//                 says so; bits do not change with it)
//   gemm_epilogue vector (default; alias auto), warp: the kernel that finishes the library GEMMs'
//                 products (gemm.h EpilogueKernel; bits do not change with it)
//   cutlass_tile  auto (default), 128, 256: activation rows per tile of the CUTLASS GEMM (auto: 256
//                 above 128 rows where the tiles of 256 still fill the SMs twice,
//                 gemm_cutlass_tile_rows; the results change with it within the library GEMMs' bound)
//   selector_topk threshold (default; alias auto), plain: DFlash2's top-K kernel (candidate_selector.h;
//                 bits do not change with it)
//   pdl           on (default), off: programmatic dependent launch between the block forward's
//                 kernels (each next kernel is scheduled early and GEMMs stream weights before
//                 the previous kernel ends; bits do not change with it)
#pragma once
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cuda/kernels/attention/attention.h"
#include "cuda/kernels/selector/candidate_selector.h"
#include "cuda/kernels/elementwise/elementwise.h"
#include "cuda/kernels/gemm/gemm.h"

namespace dflash {

struct KernelPlan {
  GemmKernel block_gemm = GemmKernel::kMma;
  // gemm_m64=library: block GEMMs of at least kBlockLibraryMinRows rows go to the libraries, each
  // only where the drafter found it usable at construction (the fallbacks say when not).
  bool block_library = true;
  bool cutlass_usable = true;
  bool cublaslt_block_usable = true;
  static constexpr int64_t kBlockLibraryMinRows = 64;
  // The kernel of a block-row GEMM of `rows` rows of a weight in `format`.
  GemmKernel block_kernel(int64_t rows, WeightFormat format) const;
  // Default mma: docs/spec/drafter.md §5 asks our own kernels to be batch invariant bit for bit; cuBLASLt's
  // algorithm changes with the number of rows, so it is a lever, not the default.
  bool ctx_gemm_auto = false;  // auto: per chunk and weight format
  GemmKernel ctx_gemm = GemmKernel::kMma;  // when not auto
  AttentionChoice attention;
  RowKernel rmsnorm = RowKernel::kTuned;
  RowKernel qk_norm_rope = RowKernel::kTuned;
  bool swiglu_fused = true;
  bool argmax_fused = true;
  SelectorTopK selector_topk = SelectorTopK::kThreshold;
  EpilogueKernel gemm_epilogue = EpilogueKernel::kVector;
  int cutlass_tile_rows = 0;  // 0: auto
  int gemm_columns = 0;  // 0: auto
  int gemm_columns_m64 = GemmContext{}.mma_columns_m64;  // 0: auto
  bool pdl = true;
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
