#include "core/rope.h"

#include <sleef.h>

#include <algorithm>
#include <cmath>

namespace dflash {
namespace {

// Hugging Face's find_correction_dim and get_mscale: Python floats (double), same order of operations.
double correction_dim(double rotations, int dim, double base, double max_positions) {
  return (dim * std::log(max_positions / (rotations * 2.0 * M_PI))) / (2.0 * std::log(base));
}
double yarn_mscale(double scale, double mscale) { return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

// The nearest float to cos or sin from its double result (within ~1 double ulp): the correctly
// rounded fp32 value unless the exact one lies within ~2^-28 fp32 ulp of a rounding midpoint.
// Upstream's fp32 cos/sin are within 1 ulp of it.
float nearest_float(double x) { return static_cast<float>(x); }

// base ** (arange(0, d, 2).float() / d): the exponent is an fp32 division, the base (a Python
// float) is converted to fp32 by torch.pow, and the power is torch's fp32 pow, which on the CPU is
// SLEEF's powf (1-ulp class) for whole vectors: it is not always the nearest float (theta 150000,
// d 64, j 10 is one below it), and at position p one ulp of inv_freq moves the angle by ~p ulp.
std::vector<float> pos_freqs(double theta, int head_dim) {
  const int half = head_dim / 2;
  const float base = static_cast<float>(theta);
  std::vector<float> out(static_cast<size_t>(half));
  for (int j = 0; j < half; ++j) {
    const float exponent = static_cast<float>(2 * j) / static_cast<float>(head_dim);
    out[static_cast<size_t>(j)] = Sleef_powf_u10(base, exponent);
  }
  return out;
}

}  // namespace

RopeTable make_rope_table(const RopeConfig& rope, int head_dim) {
  RopeTable table;
  const size_t half = static_cast<size_t>(head_dim / 2);
  const std::vector<float> pos = pos_freqs(rope.theta, head_dim);
  table.inv_freq.resize(half);
  if (rope.type == RopeConfig::Type::kDefault) {
    // 1.0 / tensor is tensor.reciprocal() * 1.0: one fp32 division.
    for (size_t j = 0; j < half; ++j) table.inv_freq[j] = 1.0f / pos[j];
    table.attention_scaling = 1.0f;
    return table;
  }
  // YaRN: the correction range in Python floats, then fp32 tensor operations, each rounded.
  double low = correction_dim(rope.beta_fast, head_dim, rope.theta, rope.original_max_position_embeddings);
  double high = correction_dim(rope.beta_slow, head_dim, rope.theta, rope.original_max_position_embeddings);
  if (rope.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(head_dim - 1));
  if (low == high) high += 0.001;
  // (arange(d/2).float() - low) / (high - low): low converted to fp32 for the subtraction; the
  // divisor is the Python difference converted to fp32 (not the difference of two fp32 values).
  const float ramp_low = static_cast<float>(low);
  const float ramp_width = static_cast<float>(high - low);
  const float factor = static_cast<float>(rope.factor);  // factor * tensor: factor converted to fp32
  for (size_t j = 0; j < half; ++j) {
    const float extrapolation = 1.0f / pos[j];
    const float interpolation = 1.0f / (factor * pos[j]);
    const float ramp = std::clamp((static_cast<float>(j) - ramp_low) / ramp_width, 0.0f, 1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    // Two products and a sum, each rounded (no fused multiply-add: this file is built without contraction).
    const float interpolated = interpolation * (1.0f - extrapolation_factor);
    const float extrapolated = extrapolation * extrapolation_factor;
    table.inv_freq[j] = interpolated + extrapolated;
  }
  double attention = 1.0;
  if (rope.has_attention_factor) {
    attention = rope.attention_factor;
  } else if (rope.mscale != 0.0 && rope.mscale_all_dim != 0.0) {
    attention = yarn_mscale(rope.factor, rope.mscale) / yarn_mscale(rope.factor, rope.mscale_all_dim);
  } else {
    attention = yarn_mscale(rope.factor, 1.0);
  }
  // cos * attention_scaling (a Python float) multiplies by the factor converted to fp32.
  table.attention_scaling = static_cast<float>(attention);
  return table;
}

float rope_angle(const RopeTable& table, int64_t position, size_t j) {
  // inv_freq.float() @ position_ids.float(): an inner dimension of 1, so one fp32 product.
  return static_cast<float>(position) * table.inv_freq[j];
}

float rope_cos(float angle) { return nearest_float(std::cos(static_cast<double>(angle))); }
float rope_sin(float angle) { return nearest_float(std::sin(static_cast<double>(angle))); }

void rope_cos_sin(const RopeTable& table, int64_t position, float* cos_out, float* sin_out) {
  for (size_t j = 0; j < table.inv_freq.size(); ++j) {
    const float angle = rope_angle(table, position, j);
    cos_out[j] = rope_cos(angle) * table.attention_scaling;
    sin_out[j] = rope_sin(angle) * table.attention_scaling;
  }
}

}  // namespace dflash
