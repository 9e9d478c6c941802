// Which drafters a replay runs on, and how they are compared: --backend reference | cuda | both.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "compare/replay.h"
#include "core/proposer.h"
#include "fixtures/fixture.h"

namespace dflash {

// The --backend choice (the drafters themselves are DraftProposers).
enum class BackendChoice { kReference, kCuda, kBoth };

// "reference", "cuda", "both"; kBadInput otherwise.
BackendChoice parse_backend(const std::string& name);

// The drafters of one replay and the comparisons to make.
struct DrafterSet {
  std::vector<std::unique_ptr<DraftProposer>> drafters;
  std::vector<ReplayLane> lanes;
  std::vector<CrossCheck> cross_checks;
};

// The default precision: fp64 for the reference, fp8 for cuda and both (docs/cli.md).
Precision resolve_precision(BackendChoice backend, const std::optional<std::string>& precision);

// Throws kUnsupported when the backend needs the CUDA drafter and this build or machine has none,
// and kBadInput for a precision the CUDA drafter does not run (it runs bf16 and fp8).
void check_backend_runs_here(BackendChoice backend, Precision precision);

// reference: the reference at `precision`, compared with the fixture.
// cuda: the CUDA drafter at `precision`, compared with the fixture.
// both: the reference in fp64 compared with the fixture, the reference emulating the CUDA mode
//       (`precision`) compared with the CUDA drafter (the tight same-precision model), and in fp8
//       the bf16 reference compared with the CUDA drafter (the fp8 envelope).
// The CUDA drafter runs as shipped (CudaOptions' defaults and the environment) except for
// `cuda_warmup`, the eager passes before a graph is captured.
DrafterSet make_drafters(Fixture& fixture, BackendChoice backend, Precision precision, int cuda_warmup);

}  // namespace dflash
