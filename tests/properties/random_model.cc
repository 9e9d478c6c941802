#include "tests/properties/random_model.h"

#include <cmath>

#include "core/dtype.h"

namespace dflash::prop {

uint64_t SplitMix64::next() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

float SplitMix64::uniform(float lo, float hi) {
  const float unit = static_cast<float>(next() >> 40) * (1.0f / 16777216.0f);  // [0, 1)
  return lo + (hi - lo) * unit;
}

std::ostream& operator<<(std::ostream& os, const Geometry& g) {
  return os << "{H " << g.hidden << ", nh/nkv " << g.heads << "/" << g.kv_heads << ", d " << g.head_dim << ", L "
            << g.layers << ", I " << g.intermediate << ", V " << g.vocab << ", nT " << g.captured_layers
            << ", block " << g.block_size << ", mask " << g.mask_token << ", bias " << g.bias << ", theta "
            << g.rope_theta << (g.yarn ? ", yarn x" + std::to_string(g.yarn_factor) + " from " +
                                             std::to_string(g.yarn_original_positions)
                                       : std::string())
            << ", eps " << g.eps << "}";
}

std::ostream& operator<<(std::ostream& os, const LmHeadPlan& plan) {
  static const char* names[] = {"random", "duplicate-rows", "all-equal", "signed-copies"};
  os << names[static_cast<int>(plan.kind)];
  if (plan.kind == LmHead::kDuplicateRows || plan.kind == LmHead::kSignedCopies) {
    os << " (a " << plan.a << ", b " << plan.b << ", c " << plan.c << ", d " << plan.d << ")";
  }
  return os;
}

DrafterConfig make_config(const Geometry& g) {
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
  c.rope.theta = g.rope_theta;
  if (g.yarn) {
    c.rope.type = RopeConfig::Type::kYarn;
    c.rope.factor = g.yarn_factor;
    c.rope.original_max_position_embeddings = g.yarn_original_positions;
  }
  c.block_size = g.block_size;
  for (int i = 0; i < g.captured_layers; ++i) c.target_layer_ids.push_back(1 + 4 * i);
  c.mask_token_id = g.mask_token;
  c.target_hidden_size = g.hidden;
  c.max_position_embeddings = 1 << 16;
  return c;
}

namespace {

Tensor random_tensor(std::vector<int64_t> shape, float center, float half_width, SplitMix64& rng) {
  Tensor t = Tensor::zeros(std::move(shape));
  for (float& v : t.values) v = round_to_bf16(center + rng.uniform(-half_width, half_width));
  return t;
}

// U(-a, a) with a = sqrt(3 / fan_in): unit variance outputs for unit variance inputs.
Tensor projection(int64_t out, int64_t in, SplitMix64& rng) {
  return random_tensor({out, in}, 0.0f, std::sqrt(3.0f / static_cast<float>(in)), rng);
}

void copy_row(Tensor& t, int from, int to) {
  for (int64_t k = 0; k < t.cols(); ++k) t.row(to)[k] = t.row(from)[k];
}

}  // namespace

std::shared_ptr<DrafterWeights> make_weights(const DrafterConfig& c, uint64_t seed, const LmHeadPlan& lm_head) {
  SplitMix64 rng(seed);
  auto w = std::make_shared<DrafterWeights>();
  const int64_t h = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), inter = c.intermediate_size;
  w->fc = projection(h, c.ctx_feature_dim(), rng);
  w->hidden_norm = random_tensor({h}, 1.0f, 0.25f, rng);
  w->norm = random_tensor({h}, 1.0f, 0.25f, rng);
  for (int l = 0; l < c.num_layers; ++l) {
    LayerWeights layer;
    layer.input_layernorm = random_tensor({h}, 1.0f, 0.25f, rng);
    layer.post_attention_layernorm = random_tensor({h}, 1.0f, 0.25f, rng);
    layer.q_proj = projection(q, h, rng);
    layer.k_proj = projection(kv, h, rng);
    layer.v_proj = projection(kv, h, rng);
    layer.o_proj = projection(h, q, rng);
    if (c.attention_bias) {
      layer.q_bias = random_tensor({q}, 0.0f, 0.25f, rng);
      layer.k_bias = random_tensor({kv}, 0.0f, 0.25f, rng);
      layer.v_bias = random_tensor({kv}, 0.0f, 0.25f, rng);
      layer.o_bias = random_tensor({h}, 0.0f, 0.25f, rng);
    }
    layer.q_norm = random_tensor({c.head_dim}, 1.0f, 0.25f, rng);
    layer.k_norm = random_tensor({c.head_dim}, 1.0f, 0.25f, rng);
    layer.gate_proj = projection(inter, h, rng);
    layer.up_proj = projection(inter, h, rng);
    layer.down_proj = projection(h, inter, rng);
    w->layers.push_back(std::move(layer));
  }
  w->embed_tokens = random_tensor({c.vocab_size, h}, 0.0f, 1.0f, rng);
  w->lm_head = projection(c.vocab_size, h, rng);
  switch (lm_head.kind) {
    case LmHead::kRandom:
      break;
    case LmHead::kDuplicateRows:
      copy_row(w->lm_head, lm_head.a, lm_head.b);
      copy_row(w->lm_head, lm_head.c, lm_head.d);
      break;
    case LmHead::kAllEqual:
      for (int v = 1; v < c.vocab_size; ++v) copy_row(w->lm_head, 0, v);
      break;
    case LmHead::kSignedCopies: {
      // Every row a bf16-exact multiple of row 0's vector u: +-1 and 1/2 keep every product exact.
      const std::vector<float> u(w->lm_head.row(0), w->lm_head.row(0) + h);
      for (int v = 0; v < c.vocab_size; ++v) {
        const float factor = (v == lm_head.a || v == lm_head.b) ? 1.0f : (v == lm_head.c || v == lm_head.d) ? -1.0f : 0.5f;
        for (int64_t k = 0; k < h; ++k) w->lm_head.row(v)[k] = factor * u[k];
      }
      break;
    }
  }
  return w;
}

void context_row(uint64_t stream, int64_t position, int64_t features, float* out) {
  SplitMix64 rng(stream * 0x9e3779b97f4a7c15ull ^ (static_cast<uint64_t>(position) + 0x632be59bd9b4e019ull));
  for (int64_t j = 0; j < features; ++j) {
    const float scale = j % 7 == 3 ? 4.0f : 1.0f;
    out[j] = round_to_bf16(scale * rng.uniform(-1.0f, 1.0f));
  }
}

}  // namespace dflash::prop
