#include "compare/weight_quantization.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <thread>

#include "core/fp8.h"

namespace dflash {
namespace {

// Rows per block: each block is quantized on its own (core/fp8.h works row by row, so a block gives
// the same codes as the whole tensor) and its sums are added in block order, whatever the threads.
constexpr int64_t kRowsPerBlock = 256;

struct Sums {
  double error2 = 0, norm2 = 0;
};

Sums block_sums(const Tensor& weight, int64_t begin, int64_t rows) {
  const int64_t cols = weight.cols();
  const auto first = weight.values.begin() + begin * cols;
  const Tensor block({rows, cols}, std::vector<float>(first, first + rows * cols));
  const QuantizedRows q = quantize_rows_e4m3(block);
  Sums s;
  for (int64_t r = 0; r < rows; ++r) {
    const double scale = q.scales[static_cast<size_t>(r)];
    for (int64_t c = 0; c < cols; ++c) {
      const double w = block.row(r)[c];
      const double d = scale * e4m3_to_float(q.codes[static_cast<size_t>(r * cols + c)]) - w;
      s.error2 += d * d;
      s.norm2 += w * w;
    }
  }
  return s;
}

}  // namespace

double weight_quantization_error(const Tensor& weight, int threads) {
  const int64_t rows = weight.rows();
  const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  std::vector<Sums> sums(static_cast<size_t>(blocks));
  const int workers = static_cast<int>(std::clamp<int64_t>(
      threads > 0 ? threads : static_cast<int64_t>(std::thread::hardware_concurrency()), 1, std::max<int64_t>(blocks, 1)));
  std::atomic<int64_t> next{0};
  auto work = [&] {
    for (int64_t b = next++; b < blocks; b = next++) {
      const int64_t begin = b * kRowsPerBlock;
      sums[static_cast<size_t>(b)] = block_sums(weight, begin, std::min(kRowsPerBlock, rows - begin));
    }
  };
  std::vector<std::thread> pool;
  for (int w = 1; w < workers; ++w) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  Sums total;
  for (const Sums& s : sums) {
    total.error2 += s.error2;
    total.norm2 += s.norm2;
  }
  return total.norm2 > 0 ? std::sqrt(total.error2 / total.norm2) : 0.0;
}

WeightQuantization measure_weight_quantization(const DrafterWeights& weights, int threads) {
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
    q.layers.push_back(m);
  }
  // A target NVFP4 head is used as it is in every mode (docs/spec/nvfp4-lm-head.md): nothing quantized.
  q.lm_head = weights.nvfp4_head() ? 0.0 : weight_quantization_error(weights.lm_head, threads);
  return q;
}

}  // namespace dflash
