#include "reference/linear.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include <Eigen/Core>

#include "core/dtype.h"
#include "core/error.h"
#include "core/fp8.h"

namespace dflash {
namespace {

// A chunk of W small enough to stay in a core's L2 while every activation row of a block passes
// over it; a multiple of 8 rows (Eigen's widest row group) between 8 and 256 rows.
constexpr int64_t kChunkBytes = 512 * 1024;
// Activation rows per pass, so that a block of x stays in the shared cache.
constexpr int64_t kActivationBlockBytes = 4 * 1024 * 1024;

int64_t chunk_rows_for(int64_t in_features, size_t element_size) {
  const int64_t fit = kChunkBytes / std::max<int64_t>(1, in_features * static_cast<int64_t>(element_size));
  return std::clamp<int64_t>(fit / 8 * 8, 8, 256);
}

}  // namespace

template <typename T>
Linear<T>::Linear(const Tensor& weight, const Tensor& bias, bool quantize_fp8, const std::string& name,
                  ThreadPool& pool, const Fp8Activations& activations)
    : name_(name), activations_(activations) {
  if (weight.shape.size() != 2) throw bad_input(name + ": weight must be 2-D, got " + shape_string(weight.shape));
  if (activations.quantize && !quantize_fp8) throw internal_error(name + ": w8a8 activations need fp8 weights");
  if (activations.input_scale && !(std::isfinite(*activations.input_scale) && *activations.input_scale > 0.0f)) {
    // check_weights_finite refuses such a checkpoint first, naming the tensor.
    throw internal_error(name + ": input_scale " + std::to_string(*activations.input_scale) + " is not finite and > 0");
  }
  out_ = weight.shape[0];
  in_ = weight.shape[1];
  if (!bias.values.empty() && bias.numel() != out_) {
    throw bad_input(name + ": bias has " + std::to_string(bias.numel()) + " values for " + std::to_string(out_) + " rows");
  }
  chunk_rows_ = chunk_rows_for(in_, sizeof(T));
  bias_.assign(bias.values.begin(), bias.values.end());
  if (!quantize_fp8 && std::is_same<T, float>::value) {
    weight_ = reinterpret_cast<const T*>(weight.values.data());
    return;
  }
  if (quantize_fp8 && !std::is_same<T, float>::value) throw internal_error(name + ": fp8 weights are emulated in fp32 only");
  owned_.resize(static_cast<size_t>(out_ * in_));
  if (quantize_fp8) scale_.resize(static_cast<size_t>(out_));
  constexpr int64_t kRowsPerTask = 1024;
  const int64_t tasks = (out_ + kRowsPerTask - 1) / kRowsPerTask;
  pool.run(static_cast<size_t>(tasks), [&](size_t task) {
    const int64_t begin = static_cast<int64_t>(task) * kRowsPerTask;
    const int64_t rows = std::min(kRowsPerTask, out_ - begin);
    const size_t first = static_cast<size_t>(begin * in_), count = static_cast<size_t>(rows * in_);
    if (!quantize_fp8) {  // float -> double is exact
      std::copy(weight.values.begin() + first, weight.values.begin() + first + count, owned_.begin() + first);
      return;
    }
    // core/fp8.h quantizes row by row, so a block of rows gives the same codes as the whole tensor.
    Tensor block({rows, in_}, std::vector<float>(weight.values.begin() + first, weight.values.begin() + first + count));
    const QuantizedRows q = quantize_rows_e4m3(block);
    for (size_t i = 0; i < count; ++i) owned_[first + i] = static_cast<T>(e4m3_to_float(q.codes[i]));
    std::copy(q.scales.begin(), q.scales.end(), scale_.begin() + begin);
  });
  weight_ = owned_.data();
}

template <typename T>
void Linear<T>::set_row_parallel(int shards, bool bf16_reduce) {
  if (shards < 1 || in_ % shards != 0) {
    throw internal_error(name_ + ": " + std::to_string(shards) + " row-parallel ranks for K = " + std::to_string(in_) +
                         " (HeadSettings::resolved refuses such a geometry first)");
  }
  if (bf16_reduce && !std::is_same<T, float>::value) throw internal_error(name_ + ": a bf16 reduction is emulated in fp32 only");
  shards_ = shards;
  bf16_reduce_ = bf16_reduce && shards > 1;  // §11 item 3: N = 1 never rounds
}

#ifdef DFLASH_FAULT_POINTS
template <typename T>
void Linear<T>::plant_fault(Fp8Fault fault, bool lm_head) {
  if (!quantized()) return;
  switch (fault) {
    case Fp8Fault::kNone: return;
    case Fp8Fault::kQuantizedDrafter: {
      if (!lm_head) return;
      constexpr float kStaleScale = 0x1p20f;  // the calibration scale, 2^20 times too large
      for (T& w : owned_) {
        w = static_cast<T>(e4m3_to_float(float_to_e4m3_satfinite(static_cast<float>(w) / kStaleScale)) * kStaleScale);
      }
      return;
    }
    case Fp8Fault::kNeighbourRowScale:
      std::rotate(scale_.begin(), scale_.begin() + 1, scale_.end());  // row n gets row n+1's scale
      return;
    case Fp8Fault::kSkippedKTile: {
      constexpr int64_t kTile = 64;  // the CUDA GEMM's k tile (cuda/kernels/gemm/gemm_tiles.cuh)
      const int64_t first = (in_ - 1) / kTile * kTile;
      for (int64_t n = 0; n < out_; ++n) std::fill(owned_.begin() + n * in_ + first, owned_.begin() + (n + 1) * in_, T(0));
      return;
    }
    case Fp8Fault::kUnscaledActivation:
      unscaled_activation_ = activations_.quantize;
      return;
  }
}
#endif

template <typename T>
void Linear<T>::quantize_rows(const AlignedMatrix<T>& x, int64_t rows, AlignedMatrix<T>* codes,
                              std::vector<T>* scales, ThreadPool& pool) const {
  if constexpr (!std::is_same<T, float>::value) {
    (void)x, (void)rows, (void)codes, (void)scales, (void)pool;
    throw internal_error(name_ + ": w8a8 activations are emulated in fp32 only");
  } else {
    codes->resize(rows, in_);
    scales->assign(static_cast<size_t>(rows), 0.0f);
    constexpr int64_t kRowsPerTask = 16;
    pool.run(static_cast<size_t>((rows + kRowsPerTask - 1) / kRowsPerTask), [&](size_t task) {
      std::vector<uint8_t> row_codes(static_cast<size_t>(in_));
      const int64_t end = std::min(rows, static_cast<int64_t>(task + 1) * kRowsPerTask);
      for (int64_t m = static_cast<int64_t>(task) * kRowsPerTask; m < end; ++m) {
        const float scale = activations_.input_scale ? *activations_.input_scale : activation_scale_e4m3(x.row(m), in_);
        float divisor = scale;
#ifdef DFLASH_FAULT_POINTS
        if (unscaled_activation_) divisor = 1.0f;  // the planted bug: codes of x, not of x / scale
#endif
        quantize_activation_e4m3(x.row(m), in_, divisor, row_codes.data());
        float* out = codes->row(m);
        for (int64_t k = 0; k < in_; ++k) out[k] = e4m3_to_float(row_codes[static_cast<size_t>(k)]);
        (*scales)[static_cast<size_t>(m)] = scale;
      }
    });
  }
}

template <typename T>
Linear<T> Linear<T>::decoded(std::vector<T> weight, int64_t out, int64_t in, std::vector<T> row_scale,
                             const std::string& name) {
  if (static_cast<int64_t>(weight.size()) != out * in || (!row_scale.empty() && static_cast<int64_t>(row_scale.size()) != out)) {
    throw internal_error(name + ": " + std::to_string(weight.size()) + " values and " + std::to_string(row_scale.size()) +
                         " row scales for [" + std::to_string(out) + ", " + std::to_string(in) + "]");
  }
  Linear l;
  l.name_ = name;
  l.out_ = out;
  l.in_ = in;
  l.chunk_rows_ = chunk_rows_for(in, sizeof(T));
  l.owned_ = std::move(weight);
  l.scale_ = std::move(row_scale);
  l.weight_ = l.owned_.data();
  return l;
}

template <typename T>
void Linear<T>::apply_chunk(const AlignedMatrix<T>& x, const T* act_scale, int64_t row_begin, int64_t row_end,
                            int64_t chunk, AlignedMatrix<T>* y, std::vector<AlignedMatrix<T>>* partials) const {
  using RowMajor = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using Vector = Eigen::Matrix<T, Eigen::Dynamic, 1>;
  const int64_t n0 = chunk * chunk_rows_;
  const int64_t n = std::min(chunk_rows_, out_ - n0);
  const Eigen::Map<const RowMajor> w(weight_ + n0 * in_, n, in_);
  // docs/spec/tensor-parallel.md §3-§4: rank r's partial is the GEMV over its slice [r·K/N, (r+1)·K/N)
  // with its own epilogue (scale, no bias). At N = 1 the one "partial" is the whole product.
  const int64_t slice = in_ / shards_;
  Vector partial(shards_ > 1 ? n : 0);
  for (int64_t m = row_begin; m < row_end; ++m) {
    const Eigen::Map<const Vector> xm(x.row(m), in_);
    T* out = y->row(m) + n0;
    bool reduce = true;
#ifdef DFLASH_FAULT_POINTS
    reduce = !missing_all_reduce_;  // the planted bug: rank 0's partial stands for the sum
#endif
    for (int r = 0; r < shards_; ++r) {
      T* pr = r == 0 ? out : partial.data();  // p_0 is where the sum starts
      Eigen::Map<Vector> pm(pr, n);
      if (shards_ == 1) {
        pm.noalias() = w * xm;
      } else {
        pm.noalias() = w.middleCols(r * slice, slice) * xm.segment(r * slice, slice);
      }
      if (!scale_.empty()) {
        for (int64_t j = 0; j < n; ++j) pr[j] = scale_[n0 + j] * pr[j];
      }
      if (act_scale != nullptr) {  // w8a8: act_scale[m] · (scale[n] · dot), as vLLM's scaled-mm epilogue
        for (int64_t j = 0; j < n; ++j) pr[j] = act_scale[m] * pr[j];
      }
      if (bf16_reduce_) {  // p_r = bf16(P_r): the partial as it travels
        for (int64_t j = 0; j < n; ++j) pr[j] = static_cast<T>(round_to_bf16(static_cast<float>(pr[j])));
      }
      if (partials != nullptr) std::copy_n(pr, n, (*partials)[static_cast<size_t>(r)].row(m) + n0);
      // s = p_0; s = fl32(s + p_r) for r = 1..N-1: linear, in rank order, from p_0 itself.
      if (r > 0 && reduce) {
        for (int64_t j = 0; j < n; ++j) out[j] = out[j] + pr[j];
      }
    }
    if (bf16_reduce_) {  // R = bf16(s): one rounding of the sum
      for (int64_t j = 0; j < n; ++j) out[j] = static_cast<T>(round_to_bf16(static_cast<float>(out[j])));
    }
    if (!bias_.empty()) {  // §4: the bias once, after the reduction, in the compute type
      for (int64_t j = 0; j < n; ++j) out[j] = out[j] + bias_[n0 + j];
    }
  }
}

template <typename T>
void Linear<T>::apply(const AlignedMatrix<T>& x, int64_t rows, AlignedMatrix<T>* y, ThreadPool& pool,
                      std::vector<AlignedMatrix<T>>* partials) const {
  if (x.cols() != in_ || x.rows() < rows || y->cols() != out_ || y->rows() < rows) {
    throw internal_error(name_ + ": GEMV shapes x [" + std::to_string(x.rows()) + ", " + std::to_string(x.cols()) +
                         "] y [" + std::to_string(y->rows()) + ", " + std::to_string(y->cols()) + "] for W [" +
                         std::to_string(out_) + ", " + std::to_string(in_) + "] and " + std::to_string(rows) + " rows");
  }
  if (partials != nullptr) {
    if (shards_ < 2) throw internal_error(name_ + ": partials asked of a product that is not row-parallel");
    partials->assign(static_cast<size_t>(shards_), AlignedMatrix<T>(y->rows(), out_));
  }
  if (rows == 0) return;
  // w8a8: the GEMV reads the rows' decoded E4M3 codes; each row's scale goes to the epilogue.
  AlignedMatrix<T> codes;
  std::vector<T> act_scale;
  if (activations_.quantize) quantize_rows(x, rows, &codes, &act_scale, pool);
  const AlignedMatrix<T>& in = activations_.quantize ? codes : x;
  const T* scales = activations_.quantize ? act_scale.data() : nullptr;
  const int64_t chunks = (out_ + chunk_rows_ - 1) / chunk_rows_;
  const int64_t block = std::max<int64_t>(1, kActivationBlockBytes / std::max<int64_t>(1, in_ * static_cast<int64_t>(sizeof(T))));
  for (int64_t begin = 0; begin < rows; begin += block) {
    const int64_t end = std::min(rows, begin + block);
    pool.run(static_cast<size_t>(chunks),
             [&](size_t chunk) { apply_chunk(in, scales, begin, end, static_cast<int64_t>(chunk), y, partials); });
  }
}

template class Linear<float>;
template class Linear<double>;

}  // namespace dflash
