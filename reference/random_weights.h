// Seeded random drafter weights (bf16-representable values) for unit tests and for timing the
// reference at real geometries without a checkpoint. Same config and seed, same bits, whatever
// the thread count (each tensor draws from its own stream, seeded by the seed and its index).
#pragma once
#include <cstdint>

#include "core/config.h"
#include "core/weights.h"

namespace dflash {

// Projections uniform in ±1/sqrt(fan_in), norm weights in [0.8, 1.2], embed/lm_head in ±1,
// biases in ±0.1 when attention_bias; all rounded to bf16. lm_head is a separate tensor unless
// config.tie_word_embeddings.
DrafterWeights make_random_drafter_weights(const DrafterConfig& config, uint64_t seed, int threads = 1);

}  // namespace dflash
