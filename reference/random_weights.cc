#include "reference/random_weights.h"

#include <cmath>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "reference/thread_pool.h"

namespace dflash {
namespace {

// splitmix64: a fixed, portable generator (std distributions differ between libraries).
class Generator {
 public:
  explicit Generator(uint64_t seed) : state_(seed) {}
  uint64_t next_bits() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [-1, 1).
  float next() { return static_cast<float>(static_cast<double>(next_bits() >> 40) / static_cast<double>(1ull << 23) - 1.0); }

 private:
  uint64_t state_;
};

// One tensor to fill: shape and the interval [center - half_width, center + half_width).
struct Fill {
  Tensor* tensor;
  std::vector<int64_t> shape;
  float center, half_width;
};

}  // namespace

DrafterWeights make_random_drafter_weights(const DrafterConfig& c, uint64_t seed, int threads) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size, d = c.head_dim;
  const auto fan_in = [](int64_t in) { return 1.0f / std::sqrt(static_cast<float>(in)); };
  DrafterWeights w;
  w.layers.resize(static_cast<size_t>(c.num_layers));
  std::vector<Fill> fills = {{&w.fc, {H, c.ctx_feature_dim()}, 0.0f, fan_in(c.ctx_feature_dim())},
                             {&w.hidden_norm, {H}, 1.0f, 0.2f},
                             {&w.norm, {H}, 1.0f, 0.2f}};
  for (LayerWeights& L : w.layers) {
    fills.push_back({&L.input_layernorm, {H}, 1.0f, 0.2f});
    fills.push_back({&L.post_attention_layernorm, {H}, 1.0f, 0.2f});
    fills.push_back({&L.q_proj, {c.q_dim(), H}, 0.0f, fan_in(H)});
    fills.push_back({&L.k_proj, {c.kv_dim(), H}, 0.0f, fan_in(H)});
    fills.push_back({&L.v_proj, {c.kv_dim(), H}, 0.0f, fan_in(H)});
    fills.push_back({&L.o_proj, {H, c.q_dim()}, 0.0f, fan_in(c.q_dim())});
    if (c.attention_bias) {
      fills.push_back({&L.q_bias, {c.q_dim()}, 0.0f, 0.1f});
      fills.push_back({&L.k_bias, {c.kv_dim()}, 0.0f, 0.1f});
      fills.push_back({&L.v_bias, {c.kv_dim()}, 0.0f, 0.1f});
      fills.push_back({&L.o_bias, {H}, 0.0f, 0.1f});
    }
    fills.push_back({&L.q_norm, {d}, 1.0f, 0.2f});
    fills.push_back({&L.k_norm, {d}, 1.0f, 0.2f});
    fills.push_back({&L.gate_proj, {I, H}, 0.0f, fan_in(H)});
    fills.push_back({&L.up_proj, {I, H}, 0.0f, fan_in(H)});
    fills.push_back({&L.down_proj, {H, I}, 0.0f, fan_in(I)});
  }
  fills.push_back({&w.embed_tokens, {V, H}, 0.0f, 1.0f});
  if (!c.tie_word_embeddings) fills.push_back({&w.lm_head, {V, H}, 0.0f, 1.0f});

  ThreadPool pool(threads);
  pool.run(fills.size(), [&](size_t i) {
    const Fill& f = fills[i];
    Generator rng(Generator(seed ^ (0x632be59bd9b4e019ull * (i + 1))).next_bits());
    *f.tensor = Tensor::zeros(f.shape);
    for (float& v : f.tensor->values) v = round_to_bf16(f.center + f.half_width * rng.next());
  });
  if (c.tie_word_embeddings) w.lm_head = w.embed_tokens;
  return w;
}

}  // namespace dflash
