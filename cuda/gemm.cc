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

const char* gemm_kernel_name(GemmKernel kernel) {
  switch (kernel) {
    case GemmKernel::kMma: return "mma";
    case GemmKernel::kCublasLt: return "cublaslt";
    case GemmKernel::kSimple: return "simple";
  }
  return "?";
}

bool parse_gemm_kernel(const std::string& name, GemmKernel* out) {
  for (GemmKernel kernel : {GemmKernel::kMma, GemmKernel::kCublasLt, GemmKernel::kSimple}) {
    if (name == gemm_kernel_name(kernel)) {
      *out = kernel;
      return true;
    }
  }
  return false;
}

void gemm(GemmKernel kernel, const GemmContext& ctx, const uint16_t* a, int64_t lda, int64_t m,
          const DeviceMatrixView& w, const GemmEpilogue& epilogue) {
  if (m < 1) throw internal_error("gemm: m must be >= 1");
  if (kernel == GemmKernel::kMma) {
    launch_gemm_mma(ctx, a, lda, m, w, epilogue);
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
