#include "cuda/kernels/gemm/gemm.h"

#include <cstddef>
#include <string>

#include "core/error.h"
#include "cuda/kernels/gemm/gemm_cutlass_mixed.h"
#include "testing/fault_points.h"

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
    case GemmKernel::kCutlass: return "cutlass";
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

int gemm_cutlass_tile_rows(int requested, int64_t m, int64_t n, int sm_count) {
  if (requested != 0) return requested;
  if (m <= 128 || sm_count < 1) return 128;
  const int64_t sms = sm_count;
  const int64_t tiles = (n + 127) / 128 * ((m + 127) / 128);       // of 128 activation rows
  const int64_t wide_tiles = (n + 127) / 128 * ((m + 255) / 256);  // of 256
  return wide_tiles >= 2 * sms || (tiles > sms && tiles < 2 * sms) ? 256 : 128;
}

namespace {

// The fp32 scratch a kernel that finishes in the epilogue kernel writes its m × n products to.
float* raw_scratch(GemmKernel kernel, const GemmContext& ctx, int64_t m, int64_t n) {
  if (ctx.raw == nullptr || static_cast<size_t>(m * n) > ctx.raw_capacity) {
    throw internal_error("gemm " + std::string(gemm_kernel_name(kernel)) + ": scratch for " + std::to_string(m) + "x" +
                         std::to_string(n) + " accumulators was not allocated");
  }
  return ctx.raw;
}

// Where a library's m × n product goes: straight to the epilogue's output when it is already final
// (`scaled`, no bias) and only stored, else the scratch the epilogue kernel then reads.
struct LibraryProduct {
  bool direct = false;
  float* data = nullptr;
  int64_t ld = 0;
};
LibraryProduct library_product(GemmKernel kernel, const GemmContext& ctx, int64_t m, const DeviceMatrixView& w,
                               const GemmEpilogue& epilogue, bool scaled) {
  LibraryProduct p;
  p.direct = scaled && epilogue.out != nullptr && epilogue.residual == nullptr && epilogue.swiglu_out == nullptr &&
             w.bias == nullptr;
  p.data = p.direct ? epilogue.out : raw_scratch(kernel, ctx, m, w.n);
  p.ld = p.direct ? epilogue.ld_out : w.n;
  return p;
}

// The epilogue kernel on a library's product: nothing where it went straight to the output and no
// argmax is asked, else what is left (`finish` without the scales the library applied).
void finish_library_product(const GemmContext& ctx, const LibraryProduct& p, int64_t m, const DeviceMatrixView& finish,
                            const GemmEpilogue& epilogue) {
  if (p.direct && epilogue.argmax_value == nullptr) return;
  GemmEpilogue rest = epilogue;
  if (p.direct) rest.out = nullptr;  // written
  launch_gemm_epilogue(ctx.stream, p.data, p.ld, m, finish, rest, ctx.epilogue_kernel, ctx.pdl);
}

// The libraries (cuBLASLt, CUTLASS) multiply; the fallbacks' epilogue kernel does the rest, so each
// value gets the mma kernel's fp32 operations in the same order. CUTLASS also scales (its epilogue
// multiplies as ours does); cuBLASLt reads E4M3 weights through unscaled bf16 copies. A product
// that is already final (scaled, no bias) and only stored goes straight to the output, and the
// argmax partials, if asked, are then read from there. Where the epilogue only adds to the
// residual, the library adds it itself, with the same roundings (CUTLASS: the scaled product, then
// the add; cuBLASLt, bf16 weights: beta = 1 where k is not split).
void gemm_library(GemmKernel kernel, const GemmContext& ctx, const uint16_t* a, int64_t lda, int64_t m,
                  const DeviceMatrixView& w, const GemmEpilogue& epilogue) {
  const bool residual_only = epilogue.residual != nullptr && epilogue.out == nullptr &&
                             epilogue.swiglu_out == nullptr && epilogue.argmax_value == nullptr && w.bias == nullptr;
  const int tile_rows = gemm_cutlass_tile_rows(ctx.cutlass_tile_rows, m, w.n, ctx.sm_count);  // kCutlass
  if (residual_only && kernel == GemmKernel::kCutlass) {
    launch_gemm_cutlass_mixed(ctx.stream, a, lda, m, w, epilogue.residual, epilogue.ld_residual, ctx.cutlass_workspace,
                              ctx.cutlass_workspace_bytes, epilogue.residual, tile_rows);
    return;
  }
  if (residual_only && kernel == GemmKernel::kCublasLt && w.format == WeightFormat::kBf16 &&
      cublaslt_matmul_add(ctx, a, lda, m, w, epilogue.residual, epilogue.ld_residual)) {
    DFLASH_MUTATE(kernel_mutation(), kCublasLtResidualTwice, cublaslt_matmul_add(ctx, a, lda, m, w, epilogue.residual, epilogue.ld_residual));
    return;
  }
  const LibraryProduct product =
      library_product(kernel, ctx, m, w, epilogue, kernel == GemmKernel::kCutlass || w.format == WeightFormat::kBf16);
  if (kernel == GemmKernel::kCutlass) {
    DeviceMatrixView unbiased = w;
    unbiased.bias = nullptr;  // added by the epilogue kernel
    launch_gemm_cutlass_mixed(ctx.stream, a, lda, m, unbiased, product.data, product.ld, ctx.cutlass_workspace,
                              ctx.cutlass_workspace_bytes, nullptr, tile_rows);
  } else {
    cublaslt_matmul(ctx, a, lda, m, w, product.data, product.ld);
  }
  DeviceMatrixView finish = w;
  if (kernel == GemmKernel::kCutlass) finish.scale = nullptr;  // applied
  finish_library_product(ctx, product, m, finish, epilogue);
  DFLASH_MUTATE(kernel_mutation(), kCublasLtResidualTwice, if (kernel == GemmKernel::kCublasLt && epilogue.residual != nullptr) launch_gemm_epilogue(ctx.stream, product.data, product.ld, m, finish, epilogue, ctx.epilogue_kernel, ctx.pdl));
}

}  // namespace

void gemm(GemmKernel kernel, const GemmContext& ctx, const uint16_t* a, int64_t lda, int64_t m,
          const DeviceMatrixView& w, const GemmEpilogue& epilogue) {
  if (m < 1) throw internal_error("gemm: m must be >= 1");
  if (epilogue.row_scale != nullptr) throw internal_error("gemm: a per-row activation scale is W8A8's (gemm_w8a8)");
  switch (kernel) {
    case GemmKernel::kMma:
      launch_gemm_mma(ctx, a, lda, m, w, epilogue);
      return;
    case GemmKernel::kCublasLt:
    case GemmKernel::kCutlass:
      DFLASH_MUTATE(kernel_mutation(), kCutlassNeighbourScale, if (kernel == GemmKernel::kCutlass) { DeviceMatrixView planted = w; planted.scale = planted_neighbour_scales(w.scale); return gemm_library(kernel, ctx, a, lda, m, planted, epilogue); });
      gemm_library(kernel, ctx, a, lda, m, w, epilogue);
      return;
    case GemmKernel::kSimple:
      break;
  }
  float* raw = raw_scratch(kernel, ctx, m, w.n);
  launch_gemm_simple(ctx.stream, a, lda, m, w, raw);
  launch_gemm_epilogue(ctx.stream, raw, w.n, m, w, epilogue, ctx.epilogue_kernel, ctx.pdl);
}

namespace {
// W8A8 runs CUTLASS's FP8 GEMM where it is asked and the context has its workspace.
bool w8a8_on_cutlass(const GemmContext& ctx, GemmKernel requested) {
  return requested == GemmKernel::kCutlass && ctx.cutlass_workspace != nullptr;
}
}  // namespace

GemmKernel w8a8_gemm_kernel(const GemmContext& ctx, GemmKernel requested, int64_t m, int64_t lda,
                            const DeviceMatrixView& w) {
  if (requested == GemmKernel::kSimple) return GemmKernel::kSimple;
  if (w8a8_on_cutlass(ctx, requested)) return GemmKernel::kCutlass;
  return cublaslt_supports(ctx, m, w.n, w.k_pad, lda, w.k_pad, nullptr, CUDA_R_8F_E4M3) ? GemmKernel::kCublasLt
                                                                                        : GemmKernel::kSimple;
}

void gemm_w8a8(GemmKernel requested, const GemmContext& ctx, const uint8_t* a, int64_t lda, int64_t m,
               const DeviceMatrixView& w, const float* row_scale, const GemmEpilogue& epilogue) {
  if (m < 1) throw internal_error("gemm_w8a8: m must be >= 1");
  if (w.format != WeightFormat::kE4M3 || row_scale == nullptr) {
    throw internal_error("gemm_w8a8: needs E4M3 weights and the activations' row scales");
  }
  if (w8a8_on_cutlass(ctx, requested)) {
    // Both scales in CUTLASS's epilogue, in the epilogue kernel's order; the rest as gemm_library.
    const LibraryProduct product = library_product(GemmKernel::kCutlass, ctx, m, w, epilogue, true);
    launch_gemm_cutlass_w8a8(ctx.stream, a, lda, m, w, row_scale, product.data, product.ld, ctx.cutlass_workspace,
                             ctx.cutlass_workspace_bytes, gemm_cutlass_tile_rows(ctx.cutlass_tile_rows, m, w.n, ctx.sm_count));
    DeviceMatrixView finish = w;
    finish.scale = nullptr;  // applied, with the row scales
    finish_library_product(ctx, product, m, finish, epilogue);
    return;
  }
  float* raw = raw_scratch(GemmKernel::kSimple, ctx, m, w.n);
  // The library where it has an algorithm (one heuristic query, as w8a8_gemm_kernel's), else the plain kernel.
  if (requested == GemmKernel::kSimple || !cublaslt_matmul_e4m3(ctx, a, lda, m, w, raw, w.n)) {
    launch_gemm_simple_e4m3_activations(ctx.stream, a, lda, m, w, raw);
  }
  GemmEpilogue finish = epilogue;
  finish.row_scale = row_scale;
  launch_gemm_epilogue(ctx.stream, raw, w.n, m, w, finish, ctx.epilogue_kernel, ctx.pdl);
}

}  // namespace dflash
