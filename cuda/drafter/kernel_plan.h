// The kernel chosen for every stage of the CUDA drafter, resolved once at construction from
// CudaOptions::kernels (after the environment), with the fallbacks taken and why. The levers, their
// values and what each runs are in one table: cuda/drafter/levers.h.
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

// ctx_gemm's values: a kernel for every context chunk, or auto (per chunk size and weight format).
enum class ContextGemm { kMma, kAuto, kCublasLt, kSimple };
// attention's values, resolved with the head_dim into KernelPlan::attention.
enum class AttentionRequest { kAuto, kTuned, kGeneric, kSimple };

struct KernelPlan {
  // The levers' values (levers.h: each lever's values and what they run). The defaults are these
  // initializers.
  GemmKernel block_gemm = GemmKernel::kMma;  // gemm
  // gemm_m64=library: block GEMMs of at least kBlockLibraryMinRows rows go to the libraries, each
  // only where the drafter found it usable at construction (the fallbacks say when not).
  bool block_library = true;
  // Default mma: docs/spec/drafter.md §5 asks our own kernels to be batch invariant bit for bit;
  // cuBLASLt's algorithm changes with the number of rows, so it is a lever, not the default.
  ContextGemm ctx_gemm = ContextGemm::kMma;
  AttentionRequest attention_request = AttentionRequest::kAuto;  // attention
  int attention_walk_ctas = 0;  // 0: auto, -1: off (AttentionChoice::walk_ctas)
  WholeWindow attention_whole_window = WholeWindow::kAuto;
  RowKernel rmsnorm = RowKernel::kTuned;
  RowKernel qk_norm_rope = RowKernel::kTuned;
  bool swiglu_fused = true;
  bool argmax_fused = true;
  int gemm_columns = 0;      // gemm_cols; 0: auto
  int gemm_columns_m64 = 0;  // gemm_cols_m64; 0: auto
  EpilogueKernel gemm_epilogue = EpilogueKernel::kVector;
  int cutlass_tile_rows = 0;  // cutlass_tile; 0: auto
  // w8a8_m64=cutlass: w8a8's block GEMMs that gemm_m64 gives to CUTLASS run its FP8 × FP8 GEMM;
  // cublaslt (the default until it is measured on a GPU): cuBLASLt's E4M3 GEMM at every row count.
  bool w8a8_cutlass = false;
  SelectorTopK selector_topk = SelectorTopK::kThreshold;
  bool pdl = true;

  // Resolved from the levers, the head_dim and the device.
  AttentionChoice attention;  // resolve_attention()
  bool cutlass_usable = true;
  bool cublaslt_block_usable = true;
  std::vector<std::string> fallbacks;  // "stage: wanted -> used (why)"

  static constexpr int64_t kBlockLibraryMinRows = 64;
  // The kernel of a block-row GEMM of `rows` rows of a weight in `format`.
  GemmKernel block_kernel(int64_t rows, WeightFormat format) const;
  // The kernel requested for a w8a8 block GEMM of `rows` rows (gemm_w8a8: kMma runs cuBLASLt).
  GemmKernel w8a8_block_kernel(int64_t rows) const;
  // Rows above which ctx_gemm=auto hands bf16-weight context GEMMs to cuBLASLt.
  static constexpr int64_t kCtxLibraryMinRows = 65;
  GemmKernel ctx_kernel(int64_t rows, WeightFormat format) const;
  bool uses_cublaslt() const;
  // Whether an E4M3 weight may reach cuBLASLt (it then needs a decoded bf16 copy).
  bool cublaslt_reads_e4m3(bool fp8) const;
  // attention from attention_request, the walk and form levers and head_dim; kBadInput for a
  // head_dim no kernel serves, or tuned asked for a head_dim it is not built for.
  void resolve_attention(int head_dim);
};

// The defaults with `requested` applied (levers.h apply_levers) and the attention resolved. Throws
// kBadInput naming the stage or value for unknown stages or values (listing the table's), and for
// a head_dim no attention kernel serves.
KernelPlan resolve_kernel_plan(const std::map<std::string, std::string>& requested, int head_dim);

// describe() entries of the plan: every lever of the table, the fallbacks taken, the batch
// invariance it gives. `w8a8`: the E4M3 GEMMs take quantized activations (gemm_w8a8), on cuBLASLt
// from one row and CUTLASS from kBlockLibraryMinRows block rows, unless the lever asks for the
// plain kernel.
std::vector<std::pair<std::string, std::string>> describe_kernel_plan(const KernelPlan& plan, bool w8a8);

}  // namespace dflash
