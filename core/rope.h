// RoPE frequencies (drafter.md §4), formed in fp32 exactly as upstream so that both drafters and
// the oracle rotate by the same angles: angle = float(position) · inv_freq[j], then cos/sin in
// fp32, times the attention factor (YaRN) in fp32.
#pragma once
#include <cstdint>
#include <vector>

#include "core/config.h"

namespace dflash {

struct RopeTable {
  std::vector<float> inv_freq;    // [d/2]
  float attention_scaling = 1.0f; // YaRN attention factor; 1 for default RoPE
};

RopeTable make_rope_table(const RopeConfig& rope, int head_dim);

// cos and sin of one position for each frequency j < d/2 (already scaled).
void rope_cos_sin(const RopeTable& table, int64_t position, float* cos_out, float* sin_out);

}  // namespace dflash
