// cuBLASLt for the GEMMs it can serve: bf16 × bf16 → fp32 with fp32 compute. Row-major C[m, n] =
// A[m, k]·W[n, k]ᵀ is the column-major product Cᵀ[n, m] = W·Aᵀ: W is a k×n column-major matrix
// used transposed, A a k×m column-major matrix used as is. Algorithms that reduce with atomics
// (CUBLASLT_REDUCTION_SCHEME_INPLACE) are excluded so that the same shape gives the same bits.
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda/runtime/cuda_check.h"
#include "cuda/kernels/gemm/gemm.h"

namespace dflash {
namespace {

class LtDescriptors {
 public:
  // `input`: both operands' type, bf16 or E4M3 (the latter with per-tensor scales of 1).
  LtDescriptors(int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldw, int64_t ld_out,
                cudaDataType_t input = CUDA_R_16BF) {
    DFLASH_CUDA_CHECK(cublasLtMatmulDescCreate(&op_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
    DFLASH_CUDA_CHECK(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof transpose));
    DFLASH_CUDA_CHECK(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof keep));
    DFLASH_CUDA_CHECK(cublasLtMatrixLayoutCreate(&w_, input, static_cast<uint64_t>(k), static_cast<uint64_t>(n), ldw));
    DFLASH_CUDA_CHECK(cublasLtMatrixLayoutCreate(&a_, input, static_cast<uint64_t>(k), static_cast<uint64_t>(m), lda));
    DFLASH_CUDA_CHECK(cublasLtMatrixLayoutCreate(&c_, CUDA_R_32F, static_cast<uint64_t>(n), static_cast<uint64_t>(m), ld_out));
    DFLASH_CUDA_CHECK(cublasLtMatmulPreferenceCreate(&preference_));
  }
  ~LtDescriptors() {
    cublasLtMatmulPreferenceDestroy(preference_);
    cublasLtMatrixLayoutDestroy(c_);
    cublasLtMatrixLayoutDestroy(a_);
    cublasLtMatrixLayoutDestroy(w_);
    cublasLtMatmulDescDestroy(op_);
  }
  LtDescriptors(const LtDescriptors&) = delete;
  LtDescriptors& operator=(const LtDescriptors&) = delete;

  // The heuristic's first algorithm, or false.
  bool pick(cublasLtHandle_t lt, size_t workspace_bytes, cublasLtMatmulAlgo_t* algo) {
    cublasLtMatmulHeuristicResult_t result{};
    if (candidates(lt, workspace_bytes, 1, &result) < 1) return false;
    *algo = result.algo;
    return true;
  }

  // Up to `count` of the heuristic's algorithms, best first, into results; how many were found.
  int candidates(cublasLtHandle_t lt, size_t workspace_bytes, int count, cublasLtMatmulHeuristicResult_t* results) {
    DFLASH_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(preference_, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                           &workspace_bytes, sizeof workspace_bytes));
    const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE |
                             CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
    DFLASH_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(preference_, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                           &schemes, sizeof schemes));
    // Our buffers are 16-byte aligned (row views of fused weights need not be 256-byte aligned).
    const uint32_t alignment = 16;
    for (cublasLtMatmulPreferenceAttributes_t attribute :
         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
      DFLASH_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(preference_, attribute, &alignment, sizeof alignment));
    }
    int found = 0;
    const cublasStatus_t status =
        cublasLtMatmulAlgoGetHeuristic(lt, op_, w_, a_, c_, c_, preference_, count, results, &found);
    return status == CUBLAS_STATUS_SUCCESS ? found : 0;
  }

  cublasLtMatmulDesc_t op_ = nullptr;
  cublasLtMatrixLayout_t w_ = nullptr, a_ = nullptr, c_ = nullptr;
  cublasLtMatmulPreference_t preference_ = nullptr;
};

// The heuristic's first algorithm for d, or kUnsupported naming the shape.
cublasLtMatmulAlgo_t pick_or_throw(const GemmContext& ctx, LtDescriptors& d, int64_t m, const DeviceMatrixView& w) {
  cublasLtMatmulAlgo_t algo;
  if (!d.pick(ctx.lt, ctx.lt_workspace_bytes, &algo)) {
    throw unsupported("cuBLASLt has no algorithm for m " + std::to_string(m) + ", n " + std::to_string(w.n) + ", k " +
                      std::to_string(w.k));
  }
  return algo;
}

}  // namespace

bool cublaslt_supports(const GemmContext& ctx, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldw,
                       std::string* why, cudaDataType_t input) {
  if (ctx.lt == nullptr) {
    if (why) *why = "no cuBLASLt handle";
    return false;
  }
  LtDescriptors d(m, n, k, lda, ldw, n, input);
  cublasLtMatmulAlgo_t algo;
  if (!d.pick(ctx.lt, ctx.lt_workspace_bytes, &algo)) {
    if (why) *why = "cuBLASLt has no algorithm for m " + std::to_string(m) + ", n " + std::to_string(n) + ", k " +
                    std::to_string(k);
    return false;
  }
  return true;
}

void cublaslt_matmul(const GemmContext& ctx, const uint16_t* a, int64_t lda, int64_t m, const DeviceMatrixView& w,
                     float* raw, int64_t ld_raw) {
  const void* weights = w.format == WeightFormat::kE4M3 ? static_cast<const void*>(w.decoded) : w.data;
  if (weights == nullptr) throw internal_error("cublaslt: the E4M3 weight has no decoded bf16 copy");
  LtDescriptors d(m, w.n, w.k, lda, w.k_pad, ld_raw);
  const cublasLtMatmulAlgo_t algo = pick_or_throw(ctx, d, m, w);
  const float alpha = 1.0f, beta = 0.0f;
  DFLASH_CUDA_CHECK(cublasLtMatmul(ctx.lt, d.op_, &alpha, weights, d.w_, a, d.a_, &beta, raw, d.c_, raw, d.c_, &algo,
                                   ctx.lt_workspace, ctx.lt_workspace_bytes, ctx.stream));
}

bool cublaslt_matmul_add(const GemmContext& ctx, const uint16_t* a, int64_t lda, int64_t m, const DeviceMatrixView& w,
                         float* inout, int64_t ld) {
  if (w.format != WeightFormat::kBf16) throw internal_error("cublaslt_matmul_add: the weight is not bf16");
  LtDescriptors d(m, w.n, w.k, lda, w.k_pad, ld);
  const cublasLtMatmulAlgo_t algo = pick_or_throw(ctx, d, m, w);
  // A split k range may add C to one partial sum before the others: only unsplit algorithms
  // give exactly fp32(acc + C).
  int32_t splits = 1;
  size_t written = 0;
  DFLASH_CUDA_CHECK(cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof splits,
                                                         &written));
  if (splits > 1) return false;
  const float alpha = 1.0f, beta = 1.0f;
  DFLASH_CUDA_CHECK(cublasLtMatmul(ctx.lt, d.op_, &alpha, w.data, d.w_, a, d.a_, &beta, inout, d.c_, inout, d.c_, &algo,
                                   ctx.lt_workspace, ctx.lt_workspace_bytes, ctx.stream));
  return true;
}

std::vector<LtAlgorithm> cublaslt_e4m3_algorithms(const GemmContext& ctx, int64_t m, int64_t lda,
                                                  const DeviceMatrixView& w, int count) {
  if (ctx.lt == nullptr || count < 1) return {};
  LtDescriptors d(m, w.n, w.k_pad, lda, w.k_pad, w.n, CUDA_R_8F_E4M3);
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(count));
  const int found = d.candidates(ctx.lt, ctx.lt_workspace_bytes, count, results.data());
  std::vector<LtAlgorithm> algorithms;
  for (int i = 0; i < found; ++i) {
    auto config = [&](cublasLtMatmulAlgoConfigAttributes_t attribute) {
      uint32_t value = 0;  // every attribute read here is 32 bits or narrower
      size_t written = 0;
      cublasLtMatmulAlgoConfigGetAttribute(&results[i].algo, attribute, &value, sizeof value, &written);
      return value;
    };
    LtAlgorithm a;
    a.algo = results[i].algo;
    a.waves = results[i].wavesCount;
    a.description = "algo " + std::to_string(config(CUBLASLT_ALGO_CONFIG_ID)) + " tile " +
                    std::to_string(config(CUBLASLT_ALGO_CONFIG_TILE_ID)) + " stages " +
                    std::to_string(config(CUBLASLT_ALGO_CONFIG_STAGES_ID)) + " split-k " +
                    std::to_string(config(CUBLASLT_ALGO_CONFIG_SPLITK_NUM)) + " reduction " +
                    std::to_string(config(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME)) + " swizzle " +
                    std::to_string(config(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING)) + " cluster " +
                    std::to_string(config(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID));
    algorithms.push_back(a);
  }
  return algorithms;
}

bool cublaslt_matmul_e4m3(const GemmContext& ctx, const uint8_t* a, int64_t lda, int64_t m, const DeviceMatrixView& w,
                          float* raw, int64_t ld_raw, const cublasLtMatmulAlgo_t* chosen) {
  if (w.format != WeightFormat::kE4M3) throw internal_error("cublaslt_matmul_e4m3: the weight is not E4M3");
  // Over k_pad: both operands are zero past k, and a multiple of 64 meets E4M3's alignment rules.
  LtDescriptors d(m, w.n, w.k_pad, lda, w.k_pad, ld_raw, CUDA_R_8F_E4M3);
  cublasLtMatmulAlgo_t algo;
  if (ctx.lt == nullptr) return false;
  if (chosen != nullptr) {
    algo = *chosen;
  } else if (!d.pick(ctx.lt, ctx.lt_workspace_bytes, &algo)) {
    return false;
  }
  const float alpha = 1.0f, beta = 0.0f;
  DFLASH_CUDA_CHECK(cublasLtMatmul(ctx.lt, d.op_, &alpha, w.data, d.w_, a, d.a_, &beta, raw, d.c_, raw, d.c_, &algo,
                                   ctx.lt_workspace, ctx.lt_workspace_bytes, ctx.stream));
  return true;
}

}  // namespace dflash
