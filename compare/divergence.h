// First divergence: the earliest stage, in forward order, that breaks its bound, with the row and
// column where it does, both values and the bound. Bisection for one propose of one sequence.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "compare/stage_check.h"

namespace dflash {

struct Divergence {
  std::string pair;  // which comparison, e.g. "fixture(bf16) vs reference-fp64"
  int step = -1, seq = -1;
  std::string stage;
  int layer = -1;              // -1 for stages outside the layers
  int64_t row = -1, col = -1;  // row of the stage's 2-D view, column within it (-1 for shape faults)
  double expected = 0, actual = 0;
  // "non-finite", "rel-rms", "max-rel", "shape", "draft-token", "invariant"; at stage "distribution"
  // (compare/distribution.h) "tv", "kl" or "top1-gap"
  std::string criterion;
  double value = 0, bound = 0;
  std::string detail;          // free text for shape faults, token rows, invariants
  // At TP = N (compare/tp_attribution.h): the ranks whose column slice, or whose tokens, differ;
  // empty otherwise.
  std::string ranks;
};

// The first failing check of one (step, sequence) in forward order, or nothing when all pass.
// `stages` may come in any order; `num_layers` resolves the layer of per-layer stages.
std::optional<Divergence> first_divergence(const std::vector<StageCheck>& stages, int num_layers);

// "step 0, sequence 0: first divergence at L0.q (layer 0), row 3, column 17: expected 0.1234,
//  actual -0.5, rel-rms 0.89 > bound 0.022"
std::string describe_divergence(const Divergence& divergence);

}  // namespace dflash
