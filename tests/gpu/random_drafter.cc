#include "tests/gpu/random_drafter.h"

#include <algorithm>
#include <cmath>
#include <thread>

#include "core/dtype.h"

namespace dflash {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Fills t with U(lo, hi) bf16 values on all cores; the value of element i depends on (seed, stream, i) only.
void fill(Tensor& t, std::vector<int64_t> shape, uint64_t seed, uint64_t stream, float lo, float hi) {
  t = Tensor::zeros(std::move(shape));
  const int64_t count = t.numel();
  const int64_t threads = std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, 32);
  const int64_t per = (count + threads - 1) / threads;
  std::vector<std::thread> workers;
  for (int64_t w = 0; w < threads; ++w) {
    const int64_t begin = w * per, end = std::min(count, begin + per);
    if (begin >= end) break;
    workers.emplace_back([&, begin, end] {
      for (int64_t i = begin; i < end; ++i) t.values[static_cast<size_t>(i)] = random_bf16(seed, stream, static_cast<uint64_t>(i), lo, hi);
    });
  }
  for (auto& w : workers) w.join();
}

}  // namespace

float random_bf16(uint64_t seed, uint64_t stream, uint64_t index, float lo, float hi) {
  const uint64_t bits = splitmix64(splitmix64(seed * 0x100000001b3ull + stream) ^ index);
  const double u = static_cast<double>(bits >> 11) * 0x1p-53;
  return round_to_bf16(static_cast<float>(lo + (hi - lo) * u));
}

RandomGeometry qwen3_8b_geometry() {
  RandomGeometry g;
  g.name = "Qwen3-8B-DFlash-b16";
  g.hidden = 4096, g.layers = 5, g.heads = 32, g.kv_heads = 8, g.head_dim = 128, g.intermediate = 12288;
  g.vocab = 151936, g.block = 16, g.target_layer_ids = {1, 9, 17, 25, 33}, g.theta = 1e6, g.eps = 1e-6;
  g.mask_token_id = 151669;
  return g;
}

RandomGeometry qwen3_4b_geometry() {
  RandomGeometry g = qwen3_8b_geometry();
  g.name = "Qwen3-4B-DFlash-b16";
  g.hidden = 2560, g.intermediate = 9728;
  return g;
}

RandomGeometry gpt_oss_20b_geometry() {
  RandomGeometry g;
  g.name = "gpt-oss-20b-DFlash";
  g.hidden = 2880, g.layers = 8, g.heads = 64, g.kv_heads = 8, g.head_dim = 64, g.intermediate = 7680;
  g.vocab = 201088, g.block = 8, g.target_layer_ids = {1, 6, 11, 16, 21}, g.theta = 150000, g.eps = 1e-5;
  g.bias = true, g.yarn_factor = 32, g.yarn_original = 4096, g.mask_token_id = 200000;
  return g;
}

DrafterConfig make_config(const RandomGeometry& g) {
  DrafterConfig c;
  c.hidden_size = g.hidden;
  c.num_layers = g.layers;
  c.num_heads = g.heads;
  c.num_kv_heads = g.kv_heads;
  c.head_dim = g.head_dim;
  c.intermediate_size = g.intermediate;
  c.vocab_size = g.vocab;
  c.rms_norm_eps = g.eps;
  c.attention_bias = g.bias;
  c.rope.theta = g.theta;
  if (g.yarn_factor > 0) {
    c.rope.type = RopeConfig::Type::kYarn;
    c.rope.factor = g.yarn_factor;
    c.rope.original_max_position_embeddings = g.yarn_original;
  }
  c.block_size = g.block;
  c.target_layer_ids = g.target_layer_ids;
  c.mask_token_id = g.mask_token_id;
  c.target_hidden_size = g.hidden;
  c.max_position_embeddings = 131072;
  return c;
}

std::shared_ptr<DrafterWeights> make_random_weights(const DrafterConfig& c, uint64_t seed) {
  auto w = std::make_shared<DrafterWeights>();
  uint64_t stream = 0;
  auto linear = [&](Tensor& t, int64_t out, int64_t in) {
    const float a = static_cast<float>(std::sqrt(3.0 / static_cast<double>(in)));
    fill(t, {out, in}, seed, stream++, -a, a);
  };
  auto norm = [&](Tensor& t, int64_t n) { fill(t, {n}, seed, stream++, 0.5f, 1.5f); };
  auto bias = [&](Tensor& t, int64_t n) { fill(t, {n}, seed, stream++, -0.1f, 0.1f); };
  const int64_t h = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), inter = c.intermediate_size;
  linear(w->fc, h, c.ctx_feature_dim());
  norm(w->hidden_norm, h);
  norm(w->norm, h);
  w->layers.resize(static_cast<size_t>(c.num_layers));
  for (LayerWeights& l : w->layers) {
    norm(l.input_layernorm, h);
    norm(l.post_attention_layernorm, h);
    linear(l.q_proj, q, h);
    linear(l.k_proj, kv, h);
    linear(l.v_proj, kv, h);
    linear(l.o_proj, h, q);
    if (c.attention_bias) {
      bias(l.q_bias, q);
      bias(l.k_bias, kv);
      bias(l.v_bias, kv);
      bias(l.o_bias, h);
    }
    norm(l.q_norm, c.head_dim);
    norm(l.k_norm, c.head_dim);
    linear(l.gate_proj, inter, h);
    linear(l.up_proj, inter, h);
    linear(l.down_proj, h, inter);
  }
  linear(w->embed_tokens, c.vocab_size, h);
  linear(w->lm_head, c.vocab_size, h);
  return w;
}

Tensor make_random_context(int64_t rows, int64_t cols, uint64_t seed) {
  Tensor t;
  fill(t, {rows, cols}, seed, 0xc0ffee, -2.0f, 2.0f);
  return t;
}

}  // namespace dflash
