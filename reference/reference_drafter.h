// The CPU reference drafter: drafter.md computed plainly, in fp64 or fp32, with emulation of the
// optimized drafter's bf16 storage and fp8 weights. The ground truth of the harness.
#pragma once
#include <memory>

#include "core/proposer.h"
#include "core/weights.h"

namespace dflash {

std::unique_ptr<DraftProposer> make_reference_drafter(const DrafterConfig& config,
                                                      std::shared_ptr<const DrafterWeights> weights,
                                                      const HeadSettings& settings);

}  // namespace dflash
