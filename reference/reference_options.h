// Settings of the CPU reference that are not part of the head (HeadSettings): how many threads
// run its GEMVs and attention. Results are bit-identical for any thread count.
#pragma once
#include <memory>

#include "core/proposer.h"
#include "core/weights.h"

namespace dflash {

struct ReferenceOptions {
  int threads = 1;  // >= 1
};

// DFLASH_REF_THREADS when set (a positive integer; anything else is a bad_input naming the
// variable), else 1.
int reference_threads_from_env();

// make_reference_drafter with explicit options (the plain factory takes threads from the
// environment).
std::unique_ptr<DraftProposer> make_reference_drafter(const DrafterConfig& config,
                                                      std::shared_ptr<const DrafterWeights> weights,
                                                      const HeadSettings& settings, const ReferenceOptions& options);

}  // namespace dflash
