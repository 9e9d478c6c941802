// Settings of the CPU reference that are not part of the head (HeadSettings): how many threads
// run its GEMVs and attention. Results are bit-identical for any thread count.
#pragma once
#include <memory>

#include "core/proposer.h"
#include "core/weights.h"
#include "reference/stage_policy.h"

namespace dflash {

struct ReferenceOptions {
  int threads = 1;  // >= 1
#ifdef DFLASH_FAULT_POINTS  // negative controls (testing/reference_faults.h)
  PlantedFault fault = PlantedFault::kNone;
  // A planted fp8 GEMM bug (fp8 and w8a8 modes; kUnscaledActivation w8a8 only; kBadInput in other
  // modes): a negative control, never a drafter to trust. The drafter's name and describe() say which.
  Fp8Fault fp8_fault = Fp8Fault::kNone;
  // A planted DFlash2 bug (DFlash2 drafters only; kBadInput otherwise): a negative control. The
  // drafter's name and describe() say which.
  Dflash2Fault dflash2_fault = Dflash2Fault::kNone;
  // A planted rounding bug (bf16, fp8 and w8a8 modes only; kBadInput in others): a negative control of
  // the rounding-bias check. The drafter's name and describe() say which.
  RoundingFault rounding_fault = RoundingFault::kNone;
  // A planted TP bug (tp_size > 1 only; kBadInput otherwise): a negative control. The drafter's
  // name and describe() say which.
  TpFault tp_fault = TpFault::kNone;
#endif
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
