#include "tests/properties/random_model.h"

#include <sstream>

#include <cmath>

#include "fixtures/geometries.h"
#include "fixtures/random_drafter.h"

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

DrafterGeometry tiny_geometry() {
  DrafterGeometry g;
  g.name = "tiny";
  g.hidden = 8, g.heads = 1, g.kv_heads = 1, g.head_dim = 4, g.layers = 1, g.intermediate = 8, g.vocab = 16;
  g.block = 4;
  g.target_layer_ids = {1};
  g.mask_token_id = 0;
  g.max_position_embeddings = 1 << 16;
  return g;
}

std::string describe_geometry(const DrafterGeometry& g) {
  std::ostringstream os;
  os << "{H " << g.hidden << ", nh/nkv " << g.heads << "/" << g.kv_heads << ", d " << g.head_dim << ", L " << g.layers
     << ", I " << g.intermediate << ", V " << g.vocab << ", nT " << g.target_layer_ids.size() << ", block " << g.block
     << ", mask " << g.mask_token_id << ", bias " << g.bias << ", theta " << g.theta
     << (g.yarn_factor > 0 ? ", yarn x" + std::to_string(g.yarn_factor) + " from " + std::to_string(g.yarn_original)
                           : std::string())
     << ", eps " << g.eps << "}";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const LmHeadPlan& plan) {
  static const char* names[] = {"random", "duplicate-rows", "all-equal", "signed-copies"};
  os << names[static_cast<int>(plan.kind)];
  if (plan.kind == LmHead::kDuplicateRows || plan.kind == LmHead::kSignedCopies) {
    os << " (a " << plan.a << ", b " << plan.b << ", c " << plan.c << ", d " << plan.d << ")";
  }
  return os;
}

namespace {

void copy_row(Tensor& t, int from, int to) {
  for (int64_t k = 0; k < t.cols(); ++k) t.row(to)[k] = t.row(from)[k];
}

}  // namespace

std::shared_ptr<DrafterWeights> make_weights(const DrafterConfig& c, uint64_t seed, const LmHeadPlan& lm_head) {
  // Projections unit-gain, norms 1 +- 1/4, biases +-1/4, embed_tokens U(-1, 1), lm_head like a projection.
  const RandomWeightRanges ranges = {3.0, 0.25f, 0.25f, RandomWeightRanges::Table::kUnitRange,
                                     RandomWeightRanges::Table::kLikeProjection};
  auto w = std::make_shared<DrafterWeights>(make_random_drafter_weights(c, seed, ranges, /*threads=*/1));
  const int64_t h = c.hidden_size;
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
  for (int64_t j = 0; j < features; ++j) {
    // x4 is exact on a bf16 value.
    const float scale = j % 7 == 3 ? 4.0f : 1.0f;
    out[j] = scale * random_bf16(stream, static_cast<uint64_t>(position), static_cast<uint64_t>(j), -1.0f, 1.0f);
  }
}

}  // namespace dflash::prop
