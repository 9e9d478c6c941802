#include "cuda/drafter/levers.h"

#include "core/error.h"

namespace dflash {
namespace {

std::vector<Lever> make_table() {
  using K = KernelPlan;
  std::vector<Lever> t;
  t.emplace_back("gemm", "the block-row GEMMs (q|k|v, o, gate|up, down, lm_head; DFlash2's projections)",
                 &K::block_gemm,
                 std::vector<Lever::Value<GemmKernel>>{
                     {"mma", GemmKernel::kMma,
                      "the weight-only tensor-core kernel (E4M3 or bf16 weights converted in registers; bitwise "
                      "batch invariant)"},
                     {"cublaslt", GemmKernel::kCublasLt,
                      "cuBLASLt (E4M3 weights through exact bf16 copies of the codes, the scale in the epilogue; "
                      "invariant within a rounding bound)"},
                     {"simple", GemmKernel::kSimple, "one thread per output, a plain k loop (a fallback for bisecting)"}});
  t.emplace_back("gemm_m64", "block-row GEMMs of 64 rows and more, under gemm=mma", &K::block_library,
                 std::vector<Lever::Value<bool>>{
                     {"library", true,
                      "CUTLASS's mixed-input wgmma GEMM for E4M3 weights (w8a8: w8a8_m64), cuBLASLt for bf16 "
                      "weights, each where usable (a sequence's results then change with its batch within a "
                      "rounding bound)"},
                     {"mma", false,
                      "the mma kernel at every row count (bitwise batch invariant; w8a8: cuBLASLt at every row "
                      "count)"}})
      .resolved_by([](const KernelPlan& p) -> std::string {
        if (p.block_gemm != GemmKernel::kMma) return std::string("unused: gemm=") + gemm_kernel_name(p.block_gemm);
        if (!p.block_library) return "";
        return std::string(p.cutlass_usable ? "cutlass" : "mma") + " for E4M3 weights, " +
               (p.cublaslt_block_usable ? "cublaslt" : "mma") + " for bf16 weights";
      });
  t.emplace_back("ctx_gemm", "the context-row GEMMs (fc, k|v)", &K::ctx_gemm,
                 std::vector<Lever::Value<ContextGemm>>{
                     {"mma", ContextGemm::kMma, "the mma kernel (bitwise batch invariant)"},
                     {"auto", ContextGemm::kAuto,
                      "cuBLASLt for the bf16-weight GEMMs (fc; k|v with bf16 weights) of context chunks of more "
                      "than 64 rows, mma otherwise (invariant within a rounding bound)"},
                     {"cublaslt", ContextGemm::kCublasLt, "cuBLASLt (invariant within a rounding bound)"},
                     {"simple", ContextGemm::kSimple, "one thread per output (a fallback for bisecting)"}});
  t.emplace_back("attention", "the attention kernel", &K::attention_request,
                 std::vector<Lever::Value<AttentionRequest>>{
                     {"auto", AttentionRequest::kAuto, "tuned for head_dim 64, 128 and 256, generic otherwise"},
                     {"tuned", AttentionRequest::kTuned,
                      "tensor cores over 64-key chunks (other head_dims are refused)"},
                     {"generic", AttentionRequest::kGeneric, "split-KV on CUDA cores, any even head_dim up to 256"},
                     {"simple", AttentionRequest::kSimple,
                      "one CTA per (row, head), every score in shared memory (a fallback for bisecting)"}})
      .resolved_by([](const KernelPlan& p) { return p.attention.name(); });
  t.emplace_back("attention_walk_ctas", "the tuned attention's split-KV grid (bits never change with it)",
                 &K::attention_walk_ctas,
                 std::vector<Lever::Value<int>>{
                     {"auto", 0,
                      "one CTA per 64-key chunk while that grid fits in one wave, else the walking kernel with as "
                      "many CTAs per kv head and sequence as one wave holds"},
                     {"off", -1, "one CTA per chunk at every batch (the plain grid, for bisecting)"}});
  t.emplace_back("attention_whole_window", "the tuned attention's form (bits never change with it)",
                 &K::attention_whole_window,
                 std::vector<Lever::Value<WholeWindow>>{
                     {"auto", WholeWindow::kAuto,
                      "whole-window from 1024 warps (one per m-tile of 16 query rows of each sequence and kv head), "
                      "split-KV below"},
                     {"on", WholeWindow::kOn, "whole-window at every batch (one of auto's forms, to bisect it)"},
                     {"off", WholeWindow::kOff, "split-KV and combine at every batch (one of auto's forms, to bisect it)"}});
  t.emplace_back("rmsnorm", "the RMSNorms (and the embedding's)", &K::rmsnorm,
                 std::vector<Lever::Value<RowKernel>>{
                     {"tuned", RowKernel::kTuned, "one CTA per row"},
                     {"simple", RowKernel::kSimple, "one thread per row (a fallback for bisecting)"}});
  t.emplace_back("qk_norm_rope", "q_norm, k_norm and RoPE", &K::qk_norm_rope,
                 std::vector<Lever::Value<RowKernel>>{
                     {"tuned", RowKernel::kTuned,
                      "a CTA per row and 8 heads (16 from 128 rows), a warp per head (bits never change with the "
                      "grouping)"},
                     {"simple", RowKernel::kSimple, "one thread per row and head (a fallback for bisecting)"}});
  t.emplace_back("swiglu", "silu(gate) · up", &K::swiglu_fused,
                 std::vector<Lever::Value<bool>>{
                     {"fused", true, "in the gate|up GEMM's epilogue"},
                     {"separate", false, "a kernel of its own (a fallback for bisecting)"}});
  t.emplace_back("argmax", "the draft tokens of plain DFlash", &K::argmax_fused,
                 std::vector<Lever::Value<bool>>{
                     {"fused", true, "partials per 32 columns in the lm_head GEMM's epilogue, then a reduce"},
                     {"separate", false, "a kernel that scans the logits (a fallback for bisecting)"}});
  t.emplace_back("gemm_cols", "the mma kernel's CTA width at m <= 16 (bits never change with it)", &K::gemm_columns,
                 std::vector<Lever::Value<int>>{
                     {"auto", 0,
                      "32 or 64 columns per GEMM, whichever gives the busiest SM the fewest weight rows (ties: 64 "
                      "for E4M3, 32 for bf16 weights)"},
                     {"32", 32, "32 columns for every GEMM (one of auto's widths, to bisect it)"},
                     {"64", 64, "64 columns for every GEMM (one of auto's widths, to bisect it)"}});
  t.emplace_back("gemm_cols_m64", "the mma kernel's CTA width at m > 16, 64-row tiles (bits never change with it)",
                 &K::gemm_columns_m64,
                 std::vector<Lever::Value<int>>{
                     {"auto", 0,
                      "E4M3 weights: 32 or 64 columns, whichever gives the busiest SM the fewest bytes per k-tile; "
                      "bf16 weights: 32"},
                     {"32", 32, "32 columns for every GEMM (one of auto's widths, to bisect it)"},
                     {"64", 64,
                      "64 columns for every E4M3 GEMM (one of auto's widths, to bisect it; bf16 weights fall back "
                      "to 32)"}});
  t.emplace_back("gemm_epilogue",
                 "the kernel that finishes the library and fallback GEMMs' products (bits never change with it)",
                 &K::gemm_epilogue,
                 std::vector<Lever::Value<EpilogueKernel>>{
                     {"vector", EpilogueKernel::kVector,
                      "four columns per thread, 16-byte accesses (the warp form where a width or pointer is not a "
                      "multiple of four floats)"},
                     {"warp", EpilogueKernel::kWarp,
                      "one column per lane, a warp per 32-column block (the plain form, for bisecting)"}});
  t.emplace_back("cutlass_tile",
                 "activation rows per tile of the CUTLASS GEMM (results change with it within the library GEMMs' "
                 "bound)",
                 &K::cutlass_tile_rows,
                 std::vector<Lever::Value<int>>{
                     {"auto", 0,
                      "256 above 128 rows where those tiles still number two per SM or 128-row tiles would number "
                      "between one and two per SM, else 128"},
                     {"128", 128, "128 for every GEMM (one of auto's heights, to bisect it)"},
                     {"256", 256, "256 for every GEMM (one of auto's heights, to bisect it)"}});
  t.emplace_back("w8a8_m64", "w8a8's block-row GEMMs of 64 rows and more, under gemm_m64=library", &K::w8a8_cutlass,
                 std::vector<Lever::Value<bool>>{
                     {"cublaslt", false, "cuBLASLt's E4M3 GEMM, as below 64 rows (the epilogue kernel scales)"},
                     {"cutlass", true,
                      "CUTLASS's FP8 x FP8 GEMM with both scales in its epilogue (not yet measured on a GPU)"}});
  t.emplace_back("selector_topk", "DFlash2's top-K of each draft row's logits (bits never change with it)",
                 &K::selector_topk,
                 std::vector<Lever::Value<SelectorTopK>>{
                     {"threshold", SelectorTopK::kThreshold,
                      "row slices of two passes, candidates in shared memory, then a merge"},
                     {"plain", SelectorTopK::kPlain, "K passes over the row (the plain form, for bisecting)"}});
  t.emplace_back("pdl",
                 "programmatic dependent launch between the block forward's kernels after its first (bits never "
                 "change with it)",
                 &K::pdl,
                 std::vector<Lever::Value<bool>>{
                     {"on", true, "each next kernel scheduled early, the GEMMs streaming weights before the previous "
                                  "kernel ends"},
                     {"off", false, "plain stream order (for bisecting)"}});
  return t;
}

std::string stage_names() {
  std::string names;
  for (const Lever& lever : lever_table()) names += (names.empty() ? "" : ", ") + lever.stage();
  return names;
}

}  // namespace

Lever& Lever::resolved_by(std::function<std::string(const KernelPlan&)> resolved) {
  resolved_ = std::move(resolved);
  return *this;
}

std::string Lever::option_names() const {
  std::string names;
  for (const Option& o : options_) names += (names.empty() ? "" : ", ") + o.name;
  return names;
}

void Lever::set(KernelPlan& plan, const std::string& name) const {
  for (size_t i = 0; i < options_.size(); ++i) {
    if (options_[i].name == name) {
      set_(plan, i);
      return;
    }
  }
  throw bad_input("CUDA kernels: " + stage_ + "=" + name + " is not a value of " + stage_ + " (" + option_names() + ")");
}

const Lever::Option& Lever::held(const KernelPlan& plan) const {
  const int i = held_(plan);
  if (i < 0) throw internal_error("CUDA kernels: the plan holds no value of " + stage_ + " (" + option_names() + ")");
  return options_[static_cast<size_t>(i)];
}

std::string Lever::describe(const KernelPlan& plan) const {
  const Option& o = held(plan);
  std::string text = o.name + ": " + o.meaning;
  const std::string more = resolved_ ? resolved_(plan) : "";
  return more.empty() ? text : text + "; here: " + more;
}

const std::vector<Lever>& lever_table() {
  static const std::vector<Lever> table = make_table();
  return table;
}

const Lever& find_lever(const std::string& stage) {
  for (const Lever& lever : lever_table()) {
    if (lever.stage() == stage) return lever;
  }
  throw bad_input("CUDA kernels: unknown stage '" + stage + "' (" + stage_names() + ")");
}

void apply_levers(const std::map<std::string, std::string>& requested, KernelPlan* plan) {
  for (const auto& [stage, value] : requested) find_lever(stage).set(*plan, value);
}

std::vector<std::pair<std::string, std::string>> describe_levers(const KernelPlan& plan) {
  std::vector<std::pair<std::string, std::string>> d;
  for (const Lever& lever : lever_table()) d.emplace_back("kernel." + lever.stage(), lever.describe(plan));
  return d;
}

}  // namespace dflash
