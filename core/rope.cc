#include "core/rope.h"

#include <algorithm>
#include <cmath>

namespace dflash {
namespace {

// Hugging Face's find_correction_dim / get_mscale, in double as Python computes them.
double correction_dim(double rotations, int dim, double base, double max_positions) {
  return (dim * std::log(max_positions / (rotations * 2.0 * M_PI))) / (2.0 * std::log(base));
}
double yarn_mscale(double scale, double mscale) { return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

}  // namespace

RopeTable make_rope_table(const RopeConfig& rope, int head_dim) {
  RopeTable table;
  const int half = head_dim / 2;
  table.inv_freq.resize(half);
  // base ** (2j / d) with the exponent formed in fp32 and the power rounded to fp32.
  std::vector<float> pos_freqs(half);
  for (int j = 0; j < half; ++j) {
    const float exponent = static_cast<float>(2 * j) / static_cast<float>(head_dim);
    pos_freqs[j] = static_cast<float>(std::pow(static_cast<double>(static_cast<float>(rope.theta)),
                                               static_cast<double>(exponent)));
  }
  if (rope.type == RopeConfig::Type::kDefault) {
    for (int j = 0; j < half; ++j) table.inv_freq[j] = 1.0f / pos_freqs[j];
    table.attention_scaling = 1.0f;
    return table;
  }
  // YaRN: blend interpolated and extrapolated frequencies over the correction range.
  const float factor = static_cast<float>(rope.factor);
  double low = correction_dim(rope.beta_fast, head_dim, rope.theta, rope.original_max_position_embeddings);
  double high = correction_dim(rope.beta_slow, head_dim, rope.theta, rope.original_max_position_embeddings);
  if (rope.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(head_dim - 1));
  if (low == high) high += 0.001;
  for (int j = 0; j < half; ++j) {
    const float extrapolation = 1.0f / pos_freqs[j];
    const float interpolation = 1.0f / (factor * pos_freqs[j]);
    const float ramp = std::clamp((static_cast<float>(j) - static_cast<float>(low)) /
                                      (static_cast<float>(high) - static_cast<float>(low)),
                                  0.0f, 1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    table.inv_freq[j] = interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
  double attention = 1.0;
  if (rope.has_attention_factor) {
    attention = rope.attention_factor;
  } else if (rope.mscale != 0.0 && rope.mscale_all_dim != 0.0) {
    attention = yarn_mscale(rope.factor, rope.mscale) / yarn_mscale(rope.factor, rope.mscale_all_dim);
  } else {
    attention = yarn_mscale(rope.factor, 1.0);
  }
  table.attention_scaling = static_cast<float>(attention);
  return table;
}

void rope_cos_sin(const RopeTable& table, int64_t position, float* cos_out, float* sin_out) {
  const float p = static_cast<float>(position);
  for (size_t j = 0; j < table.inv_freq.size(); ++j) {
    const float angle = p * table.inv_freq[j];
    cos_out[j] = std::cos(angle) * table.attention_scaling;
    sin_out[j] = std::sin(angle) * table.attention_scaling;
  }
}

}  // namespace dflash
