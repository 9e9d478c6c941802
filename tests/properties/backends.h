// The proposers the properties run on, each behind the same factory so that one property body
// serves them all: the CPU reference in CI, the CUDA drafter when built with CUDA and a device is
// present, and the toy double (tests/properties/toy_proposer.h).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/proposer.h"
#include "core/weights.h"
#include "tests/properties/random_model.h"

namespace dflash::prop {

using ProposerFactory = std::function<std::unique_ptr<DraftProposer>(
    const DrafterConfig& config, std::shared_ptr<const DrafterWeights> weights, const HeadSettings& settings)>;

struct Backend {
  std::string name;
  ProposerFactory make;
  std::vector<Precision> precisions;  // the modes properties draw from
  GeometryLimits limits;              // geometries its kernels take
  bool taps = true;                   // exposes the taps of docs/spec/drafter.md §7
  std::string unavailable;            // non-empty: why properties on it skip
  int default_cases = 100;            // cases per property unless DFLASH_PROP_CASES / RC_PARAMS say
  // >= 0: the proposer captures a graph per (width, batch) after this many eager passes and
  // reports ForwardPath modes, which property 8 checks; -1: no graphs.
  int graph_warmup = -1;
  // The reference's K/V of context rows (make_reference_context_kv), for the kv-stored check of the
  // stored state; empty: that check is not run. Its presence also turns on the debug mode that
  // poisons freed pages (HeadSettings::poison_freed_pages).
  std::function<ContextKvFunction(const DrafterConfig&, std::shared_ptr<const DrafterWeights>, Precision,
                                  int64_t max_rows)>
      kv_oracle;

  // A proposer with `settings` at `precision`.
  std::unique_ptr<DraftProposer> build(const DrafterConfig& config, std::shared_ptr<const DrafterWeights> weights,
                                       HeadSettings settings, Precision precision) const;
};

// Every precision mode of the CPU reference.
Backend reference_backend();
// One precision of the CPU reference (a fixed mode, e.g. for fp32-vs-fp64).
Backend reference_backend(Precision precision);
Backend toy_backend();
// The CUDA drafter with graphs on or off; `unavailable` says why when this build or machine
// cannot run it.
Backend cuda_backend(bool graphs);

// A backend whose factory is `make(inner factory, config, weights, settings)`: broken variants wrap
// a working proposer, some after building it with altered settings.
using WrappingFactory = std::function<std::unique_ptr<DraftProposer>(
    const ProposerFactory& inner, const DrafterConfig& config, std::shared_ptr<const DrafterWeights> weights,
    const HeadSettings& settings)>;
Backend wrapped(const Backend& backend, const std::string& name, WrappingFactory make);

}  // namespace dflash::prop
