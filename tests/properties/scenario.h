// One generated case: a geometry and its seeded weights, head settings and a trace, drawn within a
// backend's limits. RapidCheck prints it whole for a counterexample, so a failure can be rebuilt.
#pragma once
#include <cstdint>
#include <memory>
#include <ostream>
#include <vector>

#include <rapidcheck.h>

#include "core/proposer.h"
#include "tests/properties/backends.h"
#include "tests/properties/random_model.h"
#include "tests/properties/trace.h"

namespace dflash::prop {

struct ScenarioOptions {
  int max_sequences = 1;      // distinct sequence ids over the trace
  int min_max_batch = 1;      // smallest max_batch drawn
  int max_steps = 6;
  bool releases = true;
  // Pools from just enough to exhausted, with more sequences active than fit.
  bool small_pools = false;
  std::vector<LmHead> lm_heads{LmHead::kRandom};
  int min_vocab = 0;          // 0: the backend's limits
  // Draw each trace's widths from this many values (0: any), so batch shapes repeat (graph replay).
  int distinct_widths = 0;
};

struct Scenario {
  DrafterGeometry geometry;
  LmHeadPlan lm_head;
  uint64_t weight_seed = 0;
  DrafterConfig config;
  std::shared_ptr<const DrafterWeights> weights;
  HeadSettings settings;
  Trace trace;

  std::unique_ptr<DraftProposer> build(const Backend& backend) const;
  std::unique_ptr<DraftProposer> build(const Backend& backend, const HeadSettings& altered) const;
  int gamma() const;  // the gamma in force (settings, else the config's block_size)
};
void showValue(const Scenario& scenario, std::ostream& os);
std::ostream& operator<<(std::ostream& os, const HeadSettings& settings);

rc::Gen<DrafterGeometry> gen_geometry(const GeometryLimits& limits);
rc::Gen<Scenario> gen_scenario(const Backend& backend, const ScenarioOptions& options);

}  // namespace dflash::prop
