// Seeded random drafter weights for the reference's tests and timing, drawn by the one generator
// (fixtures/random_drafter.h): same config and seed, same bits, whatever the thread count.
#pragma once
#include <cstdint>

#include "core/config.h"
#include "core/weights.h"
#include "fixtures/random_drafter.h"

namespace dflash {

// The reference tests' ranges: projections U(±1/sqrt(fan_in)) (projection gain 1), norms 1 ± 0.2,
// biases ±0.1, embed_tokens and lm_head U(±1).
inline RandomWeightRanges reference_weight_ranges() {
  return {1.0, 0.2f, 0.1f, RandomWeightRanges::Table::kUnitRange, RandomWeightRanges::Table::kUnitRange};
}

// lm_head is a separate tensor unless config.tie_word_embeddings.
inline DrafterWeights make_random_drafter_weights(const DrafterConfig& config, uint64_t seed, int threads = 1) {
  return make_random_drafter_weights(config, seed, reference_weight_ranges(), threads);
}

}  // namespace dflash
