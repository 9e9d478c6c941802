// How far the per-row E4M3 quantization of docs/spec/drafter.md §6 moves each fp8 GEMM's weights, measured on
// the weights at hand: the input of the fp8 envelope (docs/tolerances.md, "The fp8 envelope").
#pragma once
#include <vector>

#include "core/weights.h"

namespace dflash {

// δ = ||scale ⊙ decode(Q(W)) − W||_F / ||W||_F per quantized weight (core/fp8.h's quantization, the
// bytes both drafters hold). For activations without a preferred direction, a GEMM's output row
// moves by δ of its norm. fc is never quantized and has no entry.
struct WeightQuantization {
  struct Layer {
    double q = 0, k = 0, v = 0, o = 0, gate = 0, up = 0, down = 0;
  };
  std::vector<Layer> layers;
  double lm_head = 0;
};

// Quantizes every fp8 GEMM weight once (blocks of rows over `threads` threads, 0: all cores; the
// result does not depend on the count). An all-zero weight has δ = 0.
WeightQuantization measure_weight_quantization(const DrafterWeights& weights, int threads = 0);

// δ of one weight [N, K].
double weight_quantization_error(const Tensor& weight, int threads = 0);

}  // namespace dflash
