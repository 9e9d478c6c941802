#include "cuda/drafter/kernel_plan.h"

#include <initializer_list>
#include <string>

#include "core/error.h"

namespace dflash {
namespace {

GemmKernel parse_gemm(const std::string& stage, const std::string& value) {
  if (value == "auto" || value == "small-m" || value == "fp8-small-m" || value == "bf16-small-m") return GemmKernel::kMma;
  if (value == "cublas") return GemmKernel::kCublasLt;
  GemmKernel kernel;
  if (parse_gemm_kernel(value, &kernel)) return kernel;
  throw bad_input("CUDA kernels: " + stage + "=" + value + " is not a kernel (mma, cublaslt, simple)");
}

RowKernel parse_row(const std::string& stage, const std::string& value) {
  if (value == "tuned" || value == "auto") return RowKernel::kTuned;
  if (value == "simple") return RowKernel::kSimple;
  throw bad_input("CUDA kernels: " + stage + "=" + value + " is not a kernel (tuned, simple)");
}

bool parse_fused(const std::string& stage, const std::string& value) {
  if (value == "fused" || value == "auto") return true;
  if (value == "separate" || value == "simple") return false;
  throw bad_input("CUDA kernels: " + stage + "=" + value + " is not a kernel (fused, separate)");
}

// A numeric lever: "auto" gives auto_value, else one of `allowed`; anything else is refused by name,
// e.g. "gemm_cols=48 is not a width (auto, 32, 64, 96, 128)".
int parse_number(const std::string& stage, const std::string& value, std::initializer_list<int> allowed, int auto_value,
                 const char* what) {
  if (value == "auto") return auto_value;
  std::string names = "auto";
  for (int a : allowed) {
    if (value == std::to_string(a)) return a;
    names += ", " + std::to_string(a);
  }
  throw bad_input("CUDA kernels: " + stage + "=" + value + " is not " + what + " (" + names + ")");
}

// An on/off lever: "auto" gives auto_value; anything else is refused by name.
bool parse_switch(const std::string& stage, const std::string& value, bool auto_value) {
  if (value == "auto") return auto_value;
  if (value == "on" || value == "off") return value == "on";
  throw bad_input("CUDA kernels: " + stage + "=" + value + " is not a setting (auto, on, off)");
}

}  // namespace

GemmKernel KernelPlan::block_kernel(int64_t rows, WeightFormat format) const {
  if (block_gemm != GemmKernel::kMma || !block_library || rows < kBlockLibraryMinRows) return block_gemm;
  if (format == WeightFormat::kE4M3) return cutlass_usable ? GemmKernel::kCutlass : GemmKernel::kMma;
  return cublaslt_block_usable ? GemmKernel::kCublasLt : GemmKernel::kMma;
}

GemmKernel KernelPlan::ctx_kernel(int64_t rows, WeightFormat format) const {
  if (!ctx_gemm_auto) return ctx_gemm;
  return format == WeightFormat::kBf16 && rows >= kCtxLibraryMinRows ? GemmKernel::kCublasLt : GemmKernel::kMma;
}

bool KernelPlan::uses_cublaslt() const {
  return block_gemm == GemmKernel::kCublasLt || (block_gemm == GemmKernel::kMma && block_library) || ctx_gemm_auto ||
         ctx_gemm == GemmKernel::kCublasLt;
}

bool KernelPlan::cublaslt_reads_e4m3(bool fp8) const {
  return fp8 && (block_gemm == GemmKernel::kCublasLt || (!ctx_gemm_auto && ctx_gemm == GemmKernel::kCublasLt));
}

KernelPlan resolve_kernel_plan(const std::map<std::string, std::string>& requested, int head_dim) {
  KernelPlan plan;
  std::string attention = "auto";
  int attention_pass_ctas = AttentionChoice{}.pass_ctas;
  int attention_walk_ctas = AttentionChoice{}.walk_ctas;
  WholeWindow whole_window = WholeWindow::kAuto;
  for (const auto& [stage, value] : requested) {
    if (stage == "gemm") {
      plan.block_gemm = parse_gemm(stage, value);
    } else if (stage == "gemm_m64") {
      if (value != "library" && value != "auto" && value != "mma") {
        throw bad_input("CUDA kernels: gemm_m64=" + value + " is not a choice (library, mma)");
      }
      plan.block_library = value != "mma";
    } else if (stage == "ctx_gemm") {
      plan.ctx_gemm_auto = value == "auto";
      if (!plan.ctx_gemm_auto) plan.ctx_gemm = parse_gemm(stage, value);
    } else if (stage == "attention") {
      attention = value;
    } else if (stage == "attention_pass_ctas") {
      attention_pass_ctas = parse_number(stage, value, {1, 2, 4}, AttentionChoice{}.pass_ctas, "a count");
    } else if (stage == "attention_walk_ctas") {
      attention_walk_ctas = value == "off" ? -1 : parse_number(stage, value, {1, 2, 3, 4, 6, 8, 16}, 0, "a count or off");
    } else if (stage == "attention_whole_window") {
      whole_window = value == "auto" ? WholeWindow::kAuto
                                     : (parse_switch(stage, value, false) ? WholeWindow::kOn : WholeWindow::kOff);
    } else if (stage == "rmsnorm") {
      plan.rmsnorm = parse_row(stage, value);
    } else if (stage == "qk_norm_rope" || stage == "rope") {
      plan.qk_norm_rope = parse_row(stage, value);
    } else if (stage == "swiglu") {
      plan.swiglu_fused = parse_fused(stage, value);
    } else if (stage == "argmax") {
      plan.argmax_fused = parse_fused(stage, value);
    } else if (stage == "gemm_cols") {
      plan.gemm_columns = parse_number(stage, value, {32, 64, 96, 128}, 0, "a width");
    } else if (stage == "gemm_cols_m64") {
      plan.gemm_columns_m64 = parse_number(stage, value, {32, 64}, 0, "a width");
    } else if (stage == "selector_topk") {
      if (value != "threshold" && value != "auto" && value != "plain") {
        throw bad_input("CUDA kernels: selector_topk=" + value + " is not a kernel (threshold, plain)");
      }
      plan.selector_topk = value == "plain" ? SelectorTopK::kPlain : SelectorTopK::kThreshold;
    } else if (stage == "gemm_epilogue") {
      if (value != "vector" && value != "auto" && value != "warp") {
        throw bad_input("CUDA kernels: gemm_epilogue=" + value + " is not a kernel (vector, warp)");
      }
      plan.gemm_epilogue = value == "warp" ? EpilogueKernel::kWarp : EpilogueKernel::kVector;
    } else if (stage == "cutlass_tile") {
      plan.cutlass_tile_rows = parse_number(stage, value, {128, 256}, 0, "a tile height");
    } else if (stage == "pdl") {
      plan.pdl = parse_switch(stage, value, KernelPlan{}.pdl);
    } else {
      throw bad_input("CUDA kernels: unknown stage '" + stage +
                      "' (gemm, gemm_m64, ctx_gemm, attention, attention_pass_ctas, attention_walk_ctas, attention_whole_window, rmsnorm, qk_norm_rope, swiglu, argmax, "
                      "gemm_cols, gemm_cols_m64, gemm_epilogue, cutlass_tile, selector_topk, pdl)");
    }
  }
  plan.attention = choose_attention_kernel(attention, head_dim);
  plan.attention.pass_ctas = attention_pass_ctas;
  plan.attention.walk_ctas = attention_walk_ctas;
  plan.attention.whole_window = whole_window;
  // The fused epilogues live in the mma kernel; the fallbacks run the same epilogue code as a
  // separate kernel, so fusion choices hold for every GEMM kernel.
  return plan;
}

std::vector<std::pair<std::string, std::string>> describe_kernel_plan(const KernelPlan& plan, bool fp8) {
  std::vector<std::pair<std::string, std::string>> d;
  std::string gemm = gemm_kernel_name(plan.block_gemm);
  if (plan.block_gemm == GemmKernel::kMma) gemm += fp8 ? " (weight-only E4M3, tensor cores)" : " (bf16 weights, tensor cores)";
  if (plan.block_gemm == GemmKernel::kCublasLt && fp8) gemm += " (E4M3 codes as exact bf16 copies, scale in the epilogue)";
  d.emplace_back("kernel.gemm", gemm);
  if (plan.block_gemm == GemmKernel::kMma) {
    std::string large = "mma (every row count)";
    if (plan.block_library) {
      large = std::string("library from ") + std::to_string(KernelPlan::kBlockLibraryMinRows) + " block rows: " +
              (plan.cutlass_usable ? "cutlass (mixed-input wgmma) for E4M3 weights" : "mma for E4M3 weights") + ", " +
              (plan.cublaslt_block_usable ? "cublaslt" : "mma") + " for bf16 weights";
    }
    d.emplace_back("kernel.gemm_m64", large);
  }
  if (plan.ctx_gemm_auto) {
    d.emplace_back("kernel.ctx_gemm", std::string("auto: cublaslt for bf16 weights (fc") + (fp8 ? "" : ", k/v") +
                                          ") when a context chunk has more than 64 rows, mma otherwise");
  } else {
    d.emplace_back("kernel.ctx_gemm", gemm_kernel_name(plan.ctx_gemm));
  }
  d.emplace_back("kernel.attention", plan.attention.name());
  d.emplace_back("kernel.rmsnorm", plan.rmsnorm == RowKernel::kTuned ? "tuned" : "simple");
  d.emplace_back("kernel.qk_norm_rope", plan.qk_norm_rope == RowKernel::kTuned ? "tuned" : "simple");
  d.emplace_back("kernel.swiglu", plan.swiglu_fused ? "fused (gate|up GEMM epilogue)" : "separate");
  d.emplace_back("kernel.argmax", plan.argmax_fused ? "fused (lm_head GEMM epilogue partials)" : "separate");
  d.emplace_back("kernel.gemm_epilogue", plan.gemm_epilogue == EpilogueKernel::kWarp
                                             ? "warp (one column per lane; library and fallback GEMMs)"
                                             : "vector (four columns per thread; library and fallback GEMMs)");
  d.emplace_back("kernel.cutlass_tile",
                 plan.cutlass_tile_rows == 0
                     ? "auto (256 activation rows per tile above 128 rows where that still gives two tiles per SM "
                       "or 128-row tiles would give between one and two, else 128)"
                     : std::to_string(plan.cutlass_tile_rows) + " activation rows per tile");
  d.emplace_back("kernel.selector_topk", plan.selector_topk == SelectorTopK::kPlain
                                             ? "plain (K passes over the row; DFlash2 only)"
                                             : "threshold (row slices of two passes, candidates in shared "
                                               "memory, then a merge; DFlash2 only)");
  d.emplace_back("kernel.gemm_cols", plan.gemm_columns == 0 ? "auto (m <= 16: 32 or 64 columns per CTA, whichever gives the "
                                                              "busiest SM the fewest weight rows)"
                                                            : std::to_string(plan.gemm_columns) + " (m <= 16)");
  d.emplace_back("kernel.gemm_cols_m64",
                 plan.gemm_columns_m64 == 0
                     ? std::string(fp8 ? "auto (m > 16: 32 or 64 columns per CTA, whichever gives the busiest SM the "
                                         "fewest bytes per k-tile)"
                                       : "auto (m > 16: 32 columns per CTA for bf16 weights)")
                     : std::to_string(plan.gemm_columns_m64) + " (m > 16: 64-row tiles)");
  d.emplace_back("kernel.pdl", plan.pdl ? "on (block forward)" : "off");
  std::string fallbacks;
  for (const std::string& f : plan.fallbacks) fallbacks += (fallbacks.empty() ? "" : "; ") + f;
  d.emplace_back("fallbacks", fallbacks.empty() ? "none" : fallbacks);
  std::string invariance;
  if (plan.block_gemm == GemmKernel::kCublasLt) {
    invariance = "within a rounding bound: cuBLASLt serves the block GEMMs";
  } else if (plan.block_gemm == GemmKernel::kMma && plan.block_library &&
             (plan.cutlass_usable || plan.cublaslt_block_usable)) {
    invariance = "block rows bitwise while a propose has fewer than " +
                 std::to_string(KernelPlan::kBlockLibraryMinRows) +
                 ", within a rounding bound from there (library GEMMs; gemm_m64=mma keeps every count bitwise)";
  } else {
    invariance = "bitwise for block rows (own kernels, fixed reduction order)";
  }
  if (plan.ctx_gemm_auto) {
    invariance += "; context rows bitwise while a context chunk has at most 64 rows, within a rounding bound above "
                  "(cuBLASLt)";
  } else if (plan.ctx_gemm == GemmKernel::kCublasLt) {
    invariance += "; context rows within a rounding bound (cuBLASLt)";
  } else {
    invariance += "; context rows bitwise";
  }
  d.emplace_back("batch_invariance", invariance);
  return d;
}

}  // namespace dflash
