#include "compare/weight_quantization.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <thread>

#include "core/error.h"
#include "core/fp8.h"

namespace dflash {
namespace {

// Rows per block: each block is quantized on its own (core/fp8.h works row by row, so a block gives
// the same codes as the whole tensor) and its sums are added in block order, whatever the threads.
constexpr int64_t kRowsPerBlock = 256;

struct Sums {
  double error2 = 0, norm2 = 0;
};

// Per column slice, over one block of rows.
std::vector<Sums> block_sums(const Tensor& weight, int64_t begin, int64_t rows, int slices) {
  const int64_t cols = weight.cols(), width = cols / slices;
  const auto first = weight.values.begin() + begin * cols;
  const Tensor block({rows, cols}, std::vector<float>(first, first + rows * cols));
  const QuantizedRows q = quantize_rows_e4m3(block);
  std::vector<Sums> s(static_cast<size_t>(slices));
  for (int64_t r = 0; r < rows; ++r) {
    const double scale = q.scales[static_cast<size_t>(r)];
    for (int64_t c = 0; c < cols; ++c) {
      const double w = block.row(r)[c];
      const double d = scale * e4m3_to_float(q.codes[static_cast<size_t>(r * cols + c)]) - w;
      Sums& slice = s[static_cast<size_t>(c / width)];
      slice.error2 += d * d;
      slice.norm2 += w * w;
    }
  }
  return s;
}

}  // namespace

std::vector<double> weight_quantization_error_slices(const Tensor& weight, int slices, int threads) {
  if (slices < 1 || weight.cols() % slices != 0) {
    throw internal_error("weight_quantization_error_slices: " + std::to_string(slices) + " slices of " +
                         std::to_string(weight.cols()) + " columns");
  }
  const int64_t rows = weight.rows();
  const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  std::vector<std::vector<Sums>> sums(static_cast<size_t>(blocks));
  const int workers = static_cast<int>(std::clamp<int64_t>(
      threads > 0 ? threads : static_cast<int64_t>(std::thread::hardware_concurrency()), 1, std::max<int64_t>(blocks, 1)));
  std::atomic<int64_t> next{0};
  auto work = [&] {
    for (int64_t b = next++; b < blocks; b = next++) {
      const int64_t begin = b * kRowsPerBlock;
      sums[static_cast<size_t>(b)] = block_sums(weight, begin, std::min(kRowsPerBlock, rows - begin), slices);
    }
  };
  std::vector<std::thread> pool;
  for (int w = 1; w < workers; ++w) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  std::vector<double> delta(static_cast<size_t>(slices));
  for (size_t i = 0; i < delta.size(); ++i) {
    Sums total;
    for (const std::vector<Sums>& block : sums) {
      total.error2 += block[i].error2;
      total.norm2 += block[i].norm2;
    }
    delta[i] = total.norm2 > 0 ? std::sqrt(total.error2 / total.norm2) : 0.0;
  }
  return delta;
}

double weight_quantization_error(const Tensor& weight, int threads) {
  return weight_quantization_error_slices(weight, 1, threads).front();
}

WeightQuantization measure_weight_quantization(const DrafterWeights& weights, int threads, int tp_size) {
  const auto largest_slice = [&](const Tensor& w, double whole) {
    if (tp_size < 2) return whole;
    const std::vector<double> d = weight_quantization_error_slices(w, tp_size, threads);
    return *std::max_element(d.begin(), d.end());
  };
  WeightQuantization q;
  for (const LayerWeights& l : weights.layers) {
    WeightQuantization::Layer m;
    m.q = weight_quantization_error(l.q_proj, threads);
    m.k = weight_quantization_error(l.k_proj, threads);
    m.v = weight_quantization_error(l.v_proj, threads);
    m.o = weight_quantization_error(l.o_proj, threads);
    m.gate = weight_quantization_error(l.gate_proj, threads);
    m.up = weight_quantization_error(l.up_proj, threads);
    m.down = weight_quantization_error(l.down_proj, threads);
    m.o_slice = largest_slice(l.o_proj, m.o);
    m.down_slice = largest_slice(l.down_proj, m.down);
    q.layers.push_back(m);
  }
  // A target NVFP4 head is used as it is in every mode (docs/spec/nvfp4-lm-head.md): nothing quantized.
  q.lm_head = weights.nvfp4_head() ? 0.0 : weight_quantization_error(weights.lm_head, threads);
  return q;
}

}  // namespace dflash
