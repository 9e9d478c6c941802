#include "cuda/drafter/kernel_plan.h"

#include <string>

#include "core/error.h"
#include "cuda/drafter/levers.h"

namespace dflash {

GemmKernel KernelPlan::block_kernel(int64_t rows, WeightFormat format) const {
  if (block_gemm != GemmKernel::kMma || !block_library || rows < kBlockLibraryMinRows) return block_gemm;
  if (format == WeightFormat::kE4M3) return cutlass_usable ? GemmKernel::kCutlass : GemmKernel::kMma;
  return cublaslt_block_usable ? GemmKernel::kCublasLt : GemmKernel::kMma;
}

GemmKernel KernelPlan::w8a8_block_kernel(int64_t rows) const {
  const GemmKernel kernel = block_kernel(rows, WeightFormat::kE4M3);
  return kernel == GemmKernel::kCutlass && !w8a8_cutlass ? GemmKernel::kMma : kernel;
}

GemmKernel KernelPlan::ctx_kernel(int64_t rows, WeightFormat format) const {
  switch (ctx_gemm) {
    case ContextGemm::kMma: return GemmKernel::kMma;
    case ContextGemm::kCublasLt: return GemmKernel::kCublasLt;
    case ContextGemm::kSimple: return GemmKernel::kSimple;
    case ContextGemm::kAuto: break;
  }
  return format == WeightFormat::kBf16 && rows >= kCtxLibraryMinRows ? GemmKernel::kCublasLt : GemmKernel::kMma;
}

bool KernelPlan::uses_cublaslt() const {
  return block_gemm == GemmKernel::kCublasLt || (block_gemm == GemmKernel::kMma && block_library) ||
         ctx_gemm == ContextGemm::kAuto || ctx_gemm == ContextGemm::kCublasLt;
}

bool KernelPlan::cublaslt_reads_e4m3(bool fp8) const {
  return fp8 && (block_gemm == GemmKernel::kCublasLt || ctx_gemm == ContextGemm::kCublasLt);
}

void KernelPlan::resolve_attention(int head_dim) {
  attention = choose_attention_kernel(find_lever("attention").held(*this).name, head_dim);
  attention.walk_ctas = attention_walk_ctas;
  attention.whole_window = attention_whole_window;
}

KernelPlan resolve_kernel_plan(const std::map<std::string, std::string>& requested, int head_dim) {
  KernelPlan plan;
  apply_levers(requested, &plan);
  plan.resolve_attention(head_dim);
  return plan;
}

std::vector<std::pair<std::string, std::string>> describe_kernel_plan(const KernelPlan& plan, bool w8a8) {
  std::vector<std::pair<std::string, std::string>> d = describe_levers(plan);
  std::string fallbacks;
  for (const std::string& f : plan.fallbacks) fallbacks += (fallbacks.empty() ? "" : "; ") + f;
  d.emplace_back("fallbacks", fallbacks.empty() ? "none" : fallbacks);
  std::string invariance;
  if (w8a8 && plan.block_gemm != GemmKernel::kSimple) {
    invariance = "within a rounding bound: w8a8's E4M3 GEMMs run on cuBLASLt from one block row";
    if (plan.w8a8_block_kernel(KernelPlan::kBlockLibraryMinRows) == GemmKernel::kCutlass) {
      invariance += " and on CUTLASS from " + std::to_string(KernelPlan::kBlockLibraryMinRows);
    }
    invariance += " (gemm=simple keeps them bitwise)";
  } else if (w8a8) {
    invariance = "bitwise for block rows (the plain kernels, k order)";
  } else if (plan.block_gemm == GemmKernel::kCublasLt) {
    invariance = "within a rounding bound: cuBLASLt serves the block GEMMs";
  } else if (plan.block_gemm == GemmKernel::kMma && plan.block_library &&
             (plan.cutlass_usable || plan.cublaslt_block_usable)) {
    invariance = "block rows bitwise while a propose has fewer than " +
                 std::to_string(KernelPlan::kBlockLibraryMinRows) +
                 ", within a rounding bound from there (library GEMMs; gemm_m64=mma keeps every count bitwise)";
  } else {
    invariance = "bitwise for block rows (own kernels, fixed reduction order)";
  }
  if (w8a8 && plan.ctx_gemm != ContextGemm::kSimple) {
    invariance += "; context rows within a rounding bound (w8a8's k|v on cuBLASLt; ctx_gemm=simple keeps them bitwise)";
  } else if (plan.ctx_gemm == ContextGemm::kAuto) {
    invariance += "; context rows bitwise while a context chunk has at most 64 rows, within a rounding bound above "
                  "(cuBLASLt)";
  } else if (plan.ctx_gemm == ContextGemm::kCublasLt) {
    invariance += "; context rows within a rounding bound (cuBLASLt)";
  } else {
    invariance += "; context rows bitwise";
  }
  d.emplace_back("batch_invariance", invariance);
  return d;
}

}  // namespace dflash
