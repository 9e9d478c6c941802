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
    // At TP = N the largest δ over the N contiguous column slices of o_proj and down_proj, each
    // measured with the full rows' scales (docs/spec/tensor-parallel.md §2): a rank's partial moves
    // by its slice's δ. At TP = 1 they equal o and down.
    double o_slice = 0, down_slice = 0;
  };
  std::vector<Layer> layers;
  double lm_head = 0;
};

// Quantizes every fp8 GEMM weight once (blocks of rows over `threads` threads, 0: all cores; the
// result does not depend on the count). An all-zero weight has δ = 0. `tp_size` N divides the
// inner dimensions of o_proj and down_proj (tools refuse other N first).
WeightQuantization measure_weight_quantization(const DrafterWeights& weights, int threads = 0, int tp_size = 1);

// δ of one weight [N, K].
double weight_quantization_error(const Tensor& weight, int threads = 0);
// δ of each of `slices` contiguous column slices of one weight [N, K] (slices divides K), the rows
// quantized whole.
std::vector<double> weight_quantization_error_slices(const Tensor& weight, int slices, int threads = 0);

}  // namespace dflash
