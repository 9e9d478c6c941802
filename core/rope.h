// RoPE frequencies and angles (docs/spec/drafter.md §4), formed as upstream (Hugging Face transformers'
// rotary embedding) forms them, operation for operation, so that both drafters and the oracle
// rotate by the same fp32 angles. docs/reference-precision.md ("RoPE") gives the formulas.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/config.h"

namespace dflash {

struct RopeTable {
  std::vector<float> inv_freq;    // [d/2], fp32 as upstream's inv_freq buffer holds it
  float attention_scaling = 1.0f; // YaRN attention factor as fp32; 1 for default RoPE
};

RopeTable make_rope_table(const RopeConfig& rope, int head_dim);

// fp32 angle of frequency j at `position`: float(position) · inv_freq[j], one fp32 rounding.
float rope_angle(const RopeTable& table, int64_t position, size_t j);

// The nearest float to cos / sin of an fp32 angle (upstream's fp32 cos/sin are within 1 ulp of it).
float rope_cos(float angle);
float rope_sin(float angle);

// cos and sin of one position for each frequency j < d/2, times the attention factor in fp32.
void rope_cos_sin(const RopeTable& table, int64_t position, float* cos_out, float* sin_out);

}  // namespace dflash
