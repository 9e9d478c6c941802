// The CPU reference drafter: docs/spec/drafter.md computed plainly, in fp64 or fp32, with emulation of the
// optimized drafter's bf16 storage and fp8 weights. The ground truth of the harness.
#pragma once
#include <memory>

#include "core/proposer.h"
#include "core/weights.h"

namespace dflash {

std::unique_ptr<DraftProposer> make_reference_drafter(const DrafterConfig& config,
                                                      std::shared_ptr<const DrafterWeights> weights,
                                                      const HeadSettings& settings);

// ContextKvFunction (core/proposer.h) computed by the reference at `precision` from the rows alone
// (fc, hidden_norm, k_proj/v_proj, k_norm, RoPE). One engine of max_rows slots serves every call
// (longer row sets go through it in chunks).
ContextKvFunction make_reference_context_kv(const DrafterConfig& config, std::shared_ptr<const DrafterWeights> weights,
                                            Precision precision, int64_t max_rows);

}  // namespace dflash
