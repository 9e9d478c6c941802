#include "tests/properties/backends.h"

#include <utility>

#include "tests/properties/toy_proposer.h"

namespace dflash::prop {

std::unique_ptr<DraftProposer> Backend::build(const DrafterConfig& config,
                                              std::shared_ptr<const DrafterWeights> weights, HeadSettings settings,
                                              Precision precision) const {
  settings.precision = precision;
  return make(config, std::move(weights), settings);
}

Backend toy_backend() {
  Backend b;
  b.name = "toy";
  b.make = make_toy_proposer;
  b.precisions = {Precision::kFp32};
  b.taps = false;
  return b;
}

Backend wrapped(const Backend& backend, const std::string& name, WrappingFactory make) {
  Backend b = backend;
  b.name = name;
  const ProposerFactory inner = backend.make;
  b.make = [inner, make](const DrafterConfig& config, std::shared_ptr<const DrafterWeights> weights,
                         const HeadSettings& settings) { return make(inner, config, std::move(weights), settings); };
  return b;
}

}  // namespace dflash::prop
