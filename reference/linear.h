// y = x·Wᵀ (+ b) for the reference drafter, on Eigen GEMVs laid out for batch invariance
// (docs/spec/drafter.md §5): every output element y[m, n] is one Eigen row-major GEMV of a FIXED chunk of W's
// rows (chunk boundaries depend only on W's shape) with the single activation row x[m]. Its
// reduction order therefore does not depend on how many rows x has, which other sequences share
// the product, or which thread ran the chunk.
//
// fp8 (docs/spec/drafter.md §6, T = float only): W is quantized per output row with core/fp8.h; the GEMV uses
// the decoded E4M3 codes (exact in float) and y[m, n] = scale[n] · dot (+ b[n]). A decoded weight
// (Linear::decoded) uses the same form with the scales it is given.
//
// w8a8 (fp8 weights plus Fp8Activations): each input row x[m] is first quantized on its own with
// core/fp8.h (per token, or with the static input scale), the GEMV runs on its decoded codes, and
// y[m, n] = act_scale[m] · (scale[n] · dot) (+ b[n]). A product of two E4M3 values has at most 8
// significant bits and a magnitude of 0 or in [2^-18, 2^18), so it is exact in float: the dot
// product's only roundings are its fp32 additions, in the same Eigen order as every other mode.
//
// Row-parallel (docs/spec/tensor-parallel.md §3-§4, set_row_parallel): K is cut into N contiguous
// slices, one per rank; each rank's partial P_r = scale[n]·dot_r (no bias) is a GEMV over its slice,
// in bf16 when the reduction travels in bf16; the partials are summed linearly in rank order
// starting from p_0, the sum rounded once to bf16 in that setting, then the bias is added once.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "reference/aligned_matrix.h"
#include "reference/stage_policy.h"
#include "reference/thread_pool.h"

namespace dflash {

// W8A8: the input rows are quantized to E4M3 too (docs/spec/drafter.md §6).
struct Fp8Activations {
  bool quantize = false;
  std::optional<float> input_scale;  // static per-tensor scale; absent: per token, dynamic
};

template <typename T>
class Linear {
 public:
  Linear() = default;
  // weight [N, K] (bf16 values), bias [N] or empty. With a float T and no quantization the weight
  // is used in place, so `weight` must outlive this object; otherwise it is converted and owned.
  // Conversion and quantization run over `pool` in blocks of rows (each row is quantized on its
  // own, so the bytes do not depend on the thread count). Quantized activations need quantized
  // weights and a float T.
  Linear(const Tensor& weight, const Tensor& bias, bool quantize_fp8, const std::string& name, ThreadPool& pool,
         const Fp8Activations& activations = {});

  // A weight already in its compute form (the NVFP4 head): [out, in] values, owned, and per output
  // row a scale that multiplies the dot product (empty: none).
  static Linear decoded(std::vector<T> weight, int64_t out, int64_t in, std::vector<T> row_scale,
                        const std::string& name);

  int64_t out_features() const { return out_; }
  int64_t in_features() const { return in_; }
  int64_t chunk_rows() const { return chunk_rows_; }
  bool quantized() const { return !scale_.empty(); }
  const Fp8Activations& activations() const { return activations_; }
  const std::string& name() const { return name_; }

  // Computes the product as N ranks of a row-parallel layer would (docs/spec/tensor-parallel.md §4);
  // N = 1 is the plain product. N must divide K. `bf16_reduce`: tp_reduce_dtype bf16 (float T).
  void set_row_parallel(int shards, bool bf16_reduce);
  int row_parallel_shards() const { return shards_; }

  // y.row(m)[0, N) = x.row(m)[0, K) · Wᵀ (+ b) for m < rows. y must have >= rows rows and N cols.
  // partials (row-parallel, N > 1 ranks): also each rank's p_r as it enters the reduction (after the
  // bf16 rounding of a bf16 wire), partials[r] of y's shape.
  void apply(const AlignedMatrix<T>& x, int64_t rows, AlignedMatrix<T>* y, ThreadPool& pool,
             std::vector<AlignedMatrix<T>>* partials = nullptr) const;

#ifdef DFLASH_FAULT_POINTS
  // Plants an fp8 GEMM bug (testing/reference_faults.h) in the quantized weights or activations:
  // negative controls. kQuantizedDrafter is a fault of the head alone: planted only where `lm_head`
  // is true; kUnscaledActivation only where the activations are quantized.
  void plant_fault(Fp8Fault fault, bool lm_head = false);
  // TpFault::kMissingAllReduce: the reduction keeps rank 0's partial only (row-parallel only).
  void plant_missing_all_reduce() { missing_all_reduce_ = true; }
#endif

 private:
  // x's rows [0, rows) quantized per row: the decoded codes into *codes, the scales into *scales.
  void quantize_rows(const AlignedMatrix<T>& x, int64_t rows, AlignedMatrix<T>* codes, std::vector<T>* scales,
                     ThreadPool& pool) const;
  // act_scale: one per row of x (w8a8), or nullptr.
  void apply_chunk(const AlignedMatrix<T>& x, const T* act_scale, int64_t row_begin, int64_t row_end, int64_t chunk,
                   AlignedMatrix<T>* y, std::vector<AlignedMatrix<T>>* partials) const;

  std::string name_;
  int64_t out_ = 0, in_ = 0;
  int64_t chunk_rows_ = 0;
  const T* weight_ = nullptr;  // [N, K] row-major: into the source tensor or into owned_
  std::vector<T> owned_;
  std::vector<T> scale_;       // fp8: one per output row
  std::vector<T> bias_;        // empty without bias
  Fp8Activations activations_;
  int shards_ = 1;             // row-parallel ranks N
  bool bf16_reduce_ = false;   // partials and their sum rounded to bf16
#ifdef DFLASH_FAULT_POINTS
  bool missing_all_reduce_ = false;   // TpFault::kMissingAllReduce planted
  bool unscaled_activation_ = false;  // Fp8Fault::kUnscaledActivation planted
#endif
};

}  // namespace dflash
