#include "cuda/gemm.h"

#include <cstddef>
#include <string>

#include "core/error.h"

namespace dflash {

DeviceMatrixView DeviceMatrixView::rows(int64_t first, int64_t count) const {
  if (first < 0 || count < 0 || first + count > n) {
    throw internal_error("weight view: rows " + std::to_string(first) + "+" + std::to_string(count) + " of " +
                         std::to_string(n));
  }
  DeviceMatrixView v = *this;
  const int64_t element_bytes = format == WeightFormat::kE4M3 ? 1 : 2;
  v.n = count;
  v.data = static_cast<const uint8_t*>(data) + first * k_pad * element_bytes;
  if (scale != nullptr) v.scale = scale + first;
  if (bias != nullptr) v.bias = bias + first;
  if (decoded != nullptr) v.decoded = decoded + first * k_pad;
  return v;
}

namespace {

// The value of `values` whose name_of(value) is `name`.
template <typename E, size_t N>
bool parse_named(const std::string& name, const E (&values)[N], const char* (*name_of)(E), E* out) {
  for (E value : values) {
    if (name == name_of(value)) {
      *out = value;
      return true;
    }
  }
  return false;
}

}  // namespace

const char* gemm_kernel_name(GemmKernel kernel) {
  switch (kernel) {
    case GemmKernel::kMma: return "mma";
    case GemmKernel::kCublasLt: return "cublaslt";
    case GemmKernel::kSimple: return "simple";
    case GemmKernel::kMmaSplitK: return "mma-splitk";
  }
  return "?";
}

bool parse_gemm_kernel(const std::string& name, GemmKernel* out) {
  const GemmKernel all[] = {GemmKernel::kMma, GemmKernel::kCublasLt, GemmKernel::kSimple, GemmKernel::kMmaSplitK};
  return parse_named(name, all, gemm_kernel_name, out);
}

const char* gemm_pipeline_name(GemmPipeline pipeline) {
  switch (pipeline) {
    case GemmPipeline::kRing: return "ring";
    case GemmPipeline::kDeep: return "deep";
    case GemmPipeline::kDeepShared: return "deep-shared";
  }
  return "?";
}

const char* gemm_trigger_name(GemmTrigger trigger) {
  switch (trigger) {
    case GemmTrigger::kLoopEnd: return "loop-end";
    case GemmTrigger::kLastIssue: return "last-issue";
    case GemmTrigger::kStart: return "start";
  }
  return "?";
}

bool parse_gemm_pipeline(const std::string& name, GemmPipeline* out) {
  const GemmPipeline all[] = {GemmPipeline::kRing, GemmPipeline::kDeep, GemmPipeline::kDeepShared};
  return parse_named(name, all, gemm_pipeline_name, out);
}

bool parse_gemm_trigger(const std::string& name, GemmTrigger* out) {
  const GemmTrigger all[] = {GemmTrigger::kLoopEnd, GemmTrigger::kLastIssue, GemmTrigger::kStart};
  return parse_named(name, all, gemm_trigger_name, out);
}

int64_t gemm_scratch_floats(GemmKernel kernel, int64_t m, int64_t n, int64_t k_pad) {
  switch (kernel) {
    case GemmKernel::kMma: return 0;
    case GemmKernel::kMmaSplitK: {
      const int splits = gemm_split_count(n, k_pad);
      return splits == 1 ? 0 : m * n * splits;
    }
    case GemmKernel::kCublasLt:
    case GemmKernel::kSimple: return m * n;  // raw sums before the epilogue kernel (upper bound)
  }
  return m * n;
}

void gemm(GemmKernel kernel, const GemmContext& ctx, const uint16_t* a, int64_t lda, int64_t m,
          const DeviceMatrixView& w, const GemmEpilogue& epilogue) {
  if (m < 1) throw internal_error("gemm: m must be >= 1");
  // One split: literally the mma kernel, so that wide GEMMs give mma's bits under either lever.
  if (kernel == GemmKernel::kMma || (kernel == GemmKernel::kMmaSplitK && gemm_split_count(w.n, w.k_pad) == 1)) {
    launch_gemm_mma(ctx, a, lda, m, w, epilogue);
    return;
  }
  if (kernel == GemmKernel::kMmaSplitK) {
    if (ctx.raw == nullptr) {
      throw internal_error("gemm mma-splitk: no partial-sum scratch for " + std::to_string(w.n) + "x" +
                           std::to_string(w.k_pad) + " (GemmContext::raw)");
    }
    launch_gemm_mma_splitk(ctx, a, lda, m, w, epilogue, ctx.raw, ctx.raw_capacity);
    return;
  }
  // A plain fp32 store with nothing to apply can take the library's result directly.
  const bool store_only = epilogue.residual == nullptr && epilogue.swiglu_out == nullptr &&
                          epilogue.argmax_value == nullptr && w.bias == nullptr &&
                          w.format == WeightFormat::kBf16 && epilogue.out != nullptr;
  if (kernel == GemmKernel::kCublasLt && store_only) {
    cublaslt_matmul(ctx, a, lda, m, w, epilogue.out, epilogue.ld_out);
    return;
  }
  if (ctx.raw == nullptr || static_cast<size_t>(m * w.n) > ctx.raw_capacity) {
    throw internal_error("gemm " + std::string(gemm_kernel_name(kernel)) + ": scratch for " + std::to_string(m) + "x" +
                         std::to_string(w.n) + " accumulators was not allocated");
  }
  if (kernel == GemmKernel::kCublasLt) {
    cublaslt_matmul(ctx, a, lda, m, w, ctx.raw, w.n);
  } else {
    launch_gemm_simple(ctx.stream, a, lda, m, w, ctx.raw);
  }
  launch_gemm_epilogue(ctx.stream, ctx.raw, m, w, epilogue);
}

}  // namespace dflash
