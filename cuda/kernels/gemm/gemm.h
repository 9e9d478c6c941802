// The drafter's GEMMs: C[m, n] = A[m, k] · W[n, k]ᵀ with bf16 activations, fp32 accumulation and
// an fp32 epilogue (per-row E4M3 scale, bias, then store / residual add / SwiGLU / argmax partials).
//
// Kernels (resolved once per drafter from CudaOptions, docs/cuda-drafter.md):
//  - kMma: our weight-only tensor-core kernel (bf16 or E4M3 weights, converted to bf16 in registers,
//    mma.sync m16n8k16, 16-byte weight loads). Every output element is reduced in the same fixed
//    order whatever m is: batch invariant bit for bit.
//  - kCublasLt: cuBLASLt for bf16 weights (E4M3 weights through an exact bf16 copy of the codes);
//    the epilogue runs as a separate kernel. Its algorithm may change with m: invariant only within
//    a rounding bound.
//  - kCutlass: E4M3 weights only, through CUTLASS's mixed-input Hopper GEMM (gemm_cutlass_mixed.h:
//    wgmma, stream-K, scale in its epilogue) for blocks of many rows; the rest of the epilogue runs
//    as the fallbacks' kernel. Its reduction order may change with m: invariant only within a
//    rounding bound.
//  - kSimple: one thread per output, a plain k loop (for bisecting one kernel at a time).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

namespace dflash {

enum class WeightFormat { kBf16, kE4M3 };

// K is padded to a multiple of this in every weight and activation buffer (zeros past k).
constexpr int64_t kGemmKAlign = 64;
// Columns per argmax partial (one per 32-column block of the output).
constexpr int64_t kArgmaxBlock = 32;

inline int64_t pad_k(int64_t k) { return (k + kGemmKAlign - 1) / kGemmKAlign * kGemmKAlign; }
inline int64_t argmax_blocks(int64_t n) { return (n + kArgmaxBlock - 1) / kArgmaxBlock; }

// One weight matrix [n, k] as the GEMMs read it: row-major, rows padded to k_pad with zeros.
struct DeviceMatrixView {
  WeightFormat format = WeightFormat::kBf16;
  int64_t n = 0, k = 0, k_pad = 0;
  const void* data = nullptr;         // [n, k_pad] bf16 bits or E4M3 codes
  const float* scale = nullptr;       // [n] per-row scale, E4M3 only
  const float* bias = nullptr;        // [n] or null
  const uint16_t* decoded = nullptr;  // [n, k_pad] E4M3 codes as bf16 (unscaled, exact); only when
                                      // cuBLASLt serves an E4M3 weight
  // Rows [first, first + count): a contiguous part of a fused weight (e.g. k and v of q|k|v).
  DeviceMatrixView rows(int64_t first, int64_t count) const;
};

// What happens to each finished value v = acc · scale[col] + bias[col] (fp32, in that order; W8A8:
// v = row_scale[row] · (acc · scale[col]) + bias[col]).
struct GemmEpilogue {
  const float* row_scale = nullptr;  // [m] per-row activation scale (W8A8, gemm_w8a8 only)
  float* out = nullptr;  // [m, ld_out]: out = v
  int64_t ld_out = 0;
  float* residual = nullptr;  // [m, ld_residual]: residual = residual + v
  int64_t ld_residual = 0;
  uint16_t* swiglu_out = nullptr;  // [m, ld_swiglu] bf16: silu(v[2i]) · v[2i+1] (interleaved gate|up)
  int64_t ld_swiglu = 0;
  float* argmax_value = nullptr;    // [m, ld_argmax]: best value of each 32-column block
  int32_t* argmax_index = nullptr;  // its column (NaN ranks highest, then lowest index on ties)
  int64_t ld_argmax = 0;
};

enum class GemmKernel { kMma, kCublasLt, kSimple, kCutlass };

const char* gemm_kernel_name(GemmKernel kernel);  // "mma", "cublaslt", "simple", "cutlass"
// The kernels a whole forward can use (mma, cublaslt, simple): kCutlass serves E4M3 weights only.
bool parse_gemm_kernel(const std::string& name, GemmKernel* out);

// The kernel that finishes the fallbacks' and libraries' fp32 products (the epilogue above). Both
// give every output the same bits.
//  - kVector: four columns per thread, 16-byte accesses (the default);
//  - kWarp: one column per lane, a warp per 32-column block (the plain form, for bisecting).
enum class EpilogueKernel { kVector, kWarp };

// Device resources the GEMMs use; owned by the caller.
struct GemmContext {
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;        // needed for kCublasLt
  void* lt_workspace = nullptr;         // fixed workspace, so that graph capture allocates nothing
  size_t lt_workspace_bytes = 0;
  void* cutlass_workspace = nullptr;    // for kCutlass, sized at construction
  size_t cutlass_workspace_bytes = 0;
  float* raw = nullptr;                 // [raw_capacity] fp32 scratch for the fallbacks' accumulators
  size_t raw_capacity = 0;
  int mma_columns = 0;  // kMma at m <= 16: CTA width 32 or 64 columns; 0 = by shape (gemm_mma_columns)
  int mma_columns_m64 = 0;  // kMma at m > 16 (64-row tiles): CTA width 32 or 64; 0 = by shape (gemm_mma_columns_m64)
  EpilogueKernel epilogue_kernel = EpilogueKernel::kVector;
  int cutlass_tile_rows = 0;  // kCutlass: activation rows per tile, 128 or 256; 0 = by shape (gemm_cutlass_tile_rows)
  int sm_count = 0;     // the device's SMs: for mma_columns = 0 and the m <= 16 kernel's solo layout
  bool pdl = false;     // launch with programmatic dependent launch (cuda/runtime/launch.cuh)
};

// The CTA width the kMma kernel uses for m rows of an [n, *] weight: 32 above m = 16 (where
// gemm_mma_columns_m64 decides); at m <= 16 the requested width (32 or 64; others are an internal
// error), or with requested = 0 the width of 32 and 64 that gives the busiest of `sm_count` SMs the
// fewest weight rows (ties: 64 for E4M3, 32 for bf16 weights). The width never changes any
// element's reduction order (bits are equal).
int gemm_mma_columns(int requested, int64_t m, int64_t n, WeightFormat format, int sm_count);

// The activation rows per tile of the kCutlass GEMM for m rows of an [n, *] weight: the requested
// 128 or 256, or with requested = 0 256 where m > 128 (up to 256 rows, one wide tile wastes no more
// than two of 128) and either its tiles (128 weight rows × 256) still number at least two per SM or
// the 128-row tiles number between one and two per SM, else 128. Wider tiles convert each E4M3
// weight tile once for twice the products (lm_head and gate|up at m = 512: 11-15 % faster), but
// leave SMs idle where they are few (o and down at m = 512: 7-24 % slower). Where 128-row tiles
// would spill a partial second wave (q|k|v at m = 512: 192 tiles), the wide ones fill under one
// wave without stream-K's split and its workspace clear (docs/benchmarks.md).
int gemm_cutlass_tile_rows(int requested, int64_t m, int64_t n, int sm_count);

// The CTA width of the kMma kernel's 64-row tiles (m > 16), for m rows of an [n, *] weight. bf16
// weights: always 32 (two ring stages of 64 bf16 columns do not fit in shared memory). E4M3: the
// requested 32 or 64, or with requested = 0 the width whose busiest SM (one CTA per SM either way)
// streams the fewest bytes per k-tile: 64 columns read their 64 activation rows once per 64 weight
// columns instead of per 32 (half the activations' L2 traffic), unless that halves the CTAs below
// the SM count. The width never changes any element's reduction order (bits are equal).
int gemm_mma_columns_m64(int requested, int64_t m, int64_t n, WeightFormat format, int sm_count);

// Enqueues C = A·Wᵀ with the epilogue on ctx.stream. A: [m, lda] bf16 bits, 16-byte aligned,
// lda >= w.k_pad and a multiple of 8, columns [w.k, w.k_pad) zero. m >= 1.
void gemm(GemmKernel kernel, const GemmContext& ctx, const uint16_t* a, int64_t lda, int64_t m,
          const DeviceMatrixView& w, const GemmEpilogue& epilogue);

// cuBLASLt can serve this shape (an algorithm exists); used to resolve choices at construction.
bool cublaslt_supports(const GemmContext& ctx, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldw,
                       std::string* why, cudaDataType_t input = CUDA_R_16BF);

// W8A8 (docs/spec/drafter.md §6): C = row_scale[m] · (A8·W8ᵀ · scale[n]) (+ bias) with the epilogue,
// where A8 is E4M3 codes [m, lda] (zeros past w.k, launch_quantize_activations_e4m3) and
// row_scale their per-row scales. Each product of two E4M3 values is exact in fp32; the sums are the
// only roundings. Kernels: kSimple (one thread per output, k order), kCutlass (CUTLASS's FP8 × FP8
// GEMM with both scales in its epilogue, gemm_cutlass_mixed.h; where the context has its
// workspace) or kCublasLt (E4M3 tensor cores, per-tensor scales of 1, over k_pad); any other
// request runs cuBLASLt where it serves the shape (w8a8_gemm_kernel), the plain kernel elsewhere.
// The epilogue kernel finishes them (for CUTLASS only what is more than a scaled store).
GemmKernel w8a8_gemm_kernel(const GemmContext& ctx, GemmKernel requested, int64_t m, int64_t lda,
                            const DeviceMatrixView& w);
void gemm_w8a8(GemmKernel requested, const GemmContext& ctx, const uint8_t* a, int64_t lda, int64_t m,
               const DeviceMatrixView& w, const float* row_scale, const GemmEpilogue& epilogue);

// Sets the mma kernels' shared-memory limits once, outside any graph capture.
void prepare_gemm_kernels();
void prepare_gemm_fallback_kernels();

// Internal launchers (gemm.cc dispatches to them).
void launch_gemm_mma(const GemmContext& ctx, const uint16_t* a, int64_t lda, int64_t m, const DeviceMatrixView& w,
                     const GemmEpilogue& epilogue);
// raw[m, n] = Σ_k a·w (unscaled, no bias), one thread per output.
void launch_gemm_simple(cudaStream_t stream, const uint16_t* a, int64_t lda, int64_t m, const DeviceMatrixView& w,
                        float* raw);
// raw[m, n] = Σ_k a·w over E4M3 activation codes and E4M3 weights, one thread per output.
void launch_gemm_simple_e4m3_activations(cudaStream_t stream, const uint8_t* a, int64_t lda, int64_t m,
                                         const DeviceMatrixView& w, float* raw);
// Applies scale, bias and the epilogue to raw[m, n] (leading dimension ld_raw >= n). kVector runs
// the warp form where n, a leading dimension or a pointer is not aligned to four floats. pdl: with
// programmatic dependent launch (cuda/runtime/launch.cuh).
void launch_gemm_epilogue(cudaStream_t stream, const float* raw, int64_t ld_raw, int64_t m, const DeviceMatrixView& w,
                          const GemmEpilogue& epilogue, EpilogueKernel kernel, bool pdl = false);
// raw[m, n] = A·Wᵀ through cuBLASLt (bf16 weights, or the decoded copy of E4M3 ones).
void cublaslt_matmul(const GemmContext& ctx, const uint16_t* a, int64_t lda, int64_t m, const DeviceMatrixView& w,
                     float* raw, int64_t ld_raw);
// inout[m, n] += A·Wᵀ through cuBLASLt (bf16 weights; beta = 1, in place): fp32(acc + inout), the
// fallbacks' residual add. Returns false, launching nothing, when the algorithm cuBLASLt picks
// splits k (its partial sums could meet C in another order).
bool cublaslt_matmul_add(const GemmContext& ctx, const uint16_t* a, int64_t lda, int64_t m, const DeviceMatrixView& w,
                         float* inout, int64_t ld);
// raw[m, n] = A·Wᵀ through cuBLASLt with E4M3 activations too (per-tensor scales of 1, over k_pad):
// W8A8's library path (gemm_w8a8) and the benchmarks' E4M3 tensor-core peak. Returns false, launching
// nothing, when cuBLASLt has no algorithm for the shape (or there is no handle).
// `algo`: this algorithm instead of the heuristic's first (the GEMM benchmark's survey).
bool cublaslt_matmul_e4m3(const GemmContext& ctx, const uint8_t* a, int64_t lda, int64_t m, const DeviceMatrixView& w,
                          float* raw, int64_t ld_raw, const cublasLtMatmulAlgo_t* algo = nullptr);
// Up to `count` of the heuristic's algorithms for that product (ld_raw = n), best first, each with
// its configuration in words: what the GEMM benchmark's survey times.
struct LtAlgorithm {
  cublasLtMatmulAlgo_t algo;
  std::string description;  // "algo A tile T stages S split-k K reduction R swizzle W cluster C" (cublasLt.h ids)
  float waves = 0.0f;       // the heuristic's estimate of waves over the SMs
};
std::vector<LtAlgorithm> cublaslt_e4m3_algorithms(const GemmContext& ctx, int64_t m, int64_t lda,
                                                  const DeviceMatrixView& w, int count);

}  // namespace dflash
