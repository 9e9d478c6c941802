// Tiny drafter geometries, their configs and seeded bf16-valued weights, and the context rows a
// trace feeds: everything a property needs to build a proposer, as pure functions of a few
// numbers so any counterexample can be rebuilt from what RapidCheck prints.
#pragma once
#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/weights.h"
#include "fixtures/geometries.h"

namespace dflash::prop {

// SplitMix64: a fixed, portable generator (std:: distributions differ between libraries).
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next();
  // Uniform in [lo, hi), from the top 24 bits (exact in float).
  float uniform(float lo, float hi);

 private:
  uint64_t state_;
};

// The smallest drafter the properties start from: H 8, one head of 4, one layer, I 8, V 16, one
// captured target layer (id 1), block 4, mask token 0, 2^16 positions. Generated geometries
// (scenario.h) take their numbers from here and change them; captured layers are 1, 5, 9, ...
DrafterGeometry tiny_geometry();
// The geometry's numbers on one line, for a counterexample.
std::string describe_geometry(const DrafterGeometry& g);

// Which values a backend's kernels accept; the reference takes anything.
struct GeometryLimits {
  std::vector<int> head_dims{2, 4, 6, 8, 16};
  std::vector<int> hidden_sizes{4, 6, 8, 12, 16, 24, 32};
  std::vector<int> intermediate_sizes{4, 8, 12, 20, 32, 48};
  int min_vocab = 8;
  int max_vocab = 80;
  int max_heads = 4;
  int max_layers = 2;
  int max_captured_layers = 3;
};

// How the lm_head is built. kRandom: independent rows. kDuplicateRows: random rows, some copied to
// far-away rows (ties happen when a copied row wins). kAllEqual: every row the same vector, so
// every logit of a row ties. kSignedCopies: rows a, b = +u and c, d = -u, all others u/2, so the
// maximum is always an exact tie between two far-apart rows (a, b when hf·u > 0, c, d when < 0).
enum class LmHead { kRandom, kDuplicateRows, kAllEqual, kSignedCopies };
struct LmHeadPlan {
  LmHead kind = LmHead::kRandom;
  int a = 0, b = 0, c = 0, d = 0;  // kSignedCopies' rows; kDuplicateRows copies a->b and c->d
};
std::ostream& operator<<(std::ostream& os, const LmHeadPlan& plan);

// Seeded weights from the shared generator (fixtures/random_drafter.h), every value a bf16 value,
// scaled so that activations stay O(1): projections U(-a, a) with a = sqrt(3 / fan_in), norms
// 1 ± 1/4, biases ± 1/4, embed_tokens U(-1, 1); then the lm_head plan applied.
std::shared_ptr<DrafterWeights> make_weights(const DrafterConfig& config, uint64_t seed,
                                             const LmHeadPlan& lm_head = {});

// The target hidden-state row of (stream, position): nT·Ht bf16 values (random_bf16 of the shared
// generator, seeded by the stream, indexed by channel), a pure function of both,
// with every 7th channel four times larger (targets have outlier channels).
void context_row(uint64_t stream, int64_t position, int64_t features, float* out);

}  // namespace dflash::prop
