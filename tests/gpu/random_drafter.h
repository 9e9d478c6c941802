// Random drafters for the GPU tests and the benchmark: the real geometries of drafter.md §8 (and
// small ones), with bf16-valued weights drawn from a seeded counter-based generator (same seed,
// same weights, whatever the thread count).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/tensor.h"
#include "core/weights.h"

namespace dflash {

struct RandomGeometry {
  std::string name;
  int hidden = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0, intermediate = 0, vocab = 0, block = 0;
  std::vector<int> target_layer_ids;
  double theta = 10000.0, eps = 1e-6;
  bool bias = false;
  double yarn_factor = 0.0;  // 0: default RoPE
  int yarn_original = 0;
  int mask_token_id = 0;
};

// drafter.md §8.
RandomGeometry qwen3_8b_geometry();
RandomGeometry qwen3_4b_geometry();
RandomGeometry gpt_oss_20b_geometry();

DrafterConfig make_config(const RandomGeometry& g);

// Weights with unit-gain projections: U(-a, a), a = sqrt(3 / fan_in); norms U(0.5, 1.5); biases
// U(-0.1, 0.1); embed_tokens and lm_head U(-a, a) with fan_in H; all rounded to bf16.
std::shared_ptr<DrafterWeights> make_random_weights(const DrafterConfig& config, uint64_t seed);

// [rows, cols] of U(-2, 2) rounded to bf16.
Tensor make_random_context(int64_t rows, int64_t cols, uint64_t seed);

// Deterministic uniform value in [lo, hi) for (seed, stream, index), rounded to bf16.
float random_bf16(uint64_t seed, uint64_t stream, uint64_t index, float lo, float hi);

}  // namespace dflash
