// The tolerance model (docs/tolerances.md): bounds DERIVED from the precisions of the two sides of
// a comparison, never tuned. Each side's relative error against exact arithmetic is estimated from
// the unit roundoffs it uses and the number of roundings on the longest path from the inputs to a
// stage; a pair's bound is the safety factor times the sum of its two sides' estimates.
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "core/config.h"
#include "core/proposer.h"

namespace dflash {

// Unit roundoffs: half the gap between 1 and the next representable number.
constexpr double kUnitRoundoffFp64 = 0x1p-53;
constexpr double kUnitRoundoffFp32 = 0x1p-24;
constexpr double kUnitRoundoffBf16 = 0x1p-8;
constexpr double kUnitRoundoffE4M3 = 0x1p-4;

// The one safety factor of the model (why 2: docs/tolerances.md, "Safety factor").
constexpr double kSafetyFactor = 2.0;

// Contract values for fixtures computed in fp64 / fp32 (relative to the row's largest magnitude).
constexpr double kFp64ExpectationBound = 1e-6;
constexpr double kFp32ExpectationBound = 1e-4;

// The error sources on the longest path from the drafter's inputs (bf16 weights, context rows, the
// anchor's embedding row) to one stage's output.
struct StagePath {
  int roundings = 0;         // roundings of values to the storage format (bf16 in a bf16 engine)
  int fp8_gemms = 0;         // GEMMs whose weights an fp8 drafter holds as per-row E4M3
  int64_t accumulation = 0;  // summed inner lengths of the dot products and reductions
};

// The path of every stage (drafter.md §7 names) of one propose. `window` is the number of context
// positions the block attends to, `block_width` the clamped width B.
std::map<std::string, StagePath> stage_paths(const DrafterConfig& config, int64_t window, int block_width);

// The path of the K (key = true) or V a drafter stores for a context row in any layer: ctx_proj,
// then k_proj, k_norm and RoPE (or v_proj).
StagePath context_kv_path(const DrafterConfig& config, bool key);

// How one side computed its numbers.
struct ErrorModel {
  std::string name;           // "fp64", "bf16-engine", ...
  double storage = 0;         // unit roundoff of stage storage and elementwise ops
  double accumulation = 0;    // unit roundoff of the accumulators
  double weights = 0;         // relative error of each weight (E4M3 quantization), 0 = exact bf16
  double floor = 0;           // contract bound this side alone may use (fp64/fp32 fixtures)
};

// The drafter precisions (core/proposer.h). Their outputs are float tensors, so each model also
// carries one fp32 rounding of the result.
ErrorModel error_model(Precision precision);
// A fixture's provenance.expect_precision: "fp64", "fp32", "bf16" or "fp8" (anything else is
// kBadInput naming the field). Expectations are stored as F32: one fp32 rounding on top.
ErrorModel fixture_error_model(const std::string& expect_precision);

// Estimated relative RMS error of one side at a stage:
//   sqrt(roundings·u_s² + fp8_gemms·u_w² + accumulation·u_a² + u_fp32²)
// (independent roundings add in variance; the last term is the fp32 storage of the result).
double relative_error_estimate(const ErrorModel& model, const StagePath& path, bool count_weights = true);

// Two sides of a comparison.
struct TolerancePair {
  std::string label;       // "fixture(bf16) vs reference-fp64"
  ErrorModel expected;     // the side errors are measured relative to
  ErrorModel actual;
  // Both sides hold the same E4M3 weights (the fp8-emulating reference vs the CUDA fp8 drafter):
  // the quantization error is common to both and cancels, so it is left out of the bound.
  bool shared_quantized_weights = false;
};

// The fixture's expectations vs a drafter (the actual side).
TolerancePair fixture_pair(const std::string& expect_precision, Precision actual, const std::string& actual_name);
// Reference drafter (expected side) vs another drafter, e.g. the CUDA one.
TolerancePair cross_pair(Precision reference, const std::string& reference_name, Precision candidate,
                         const std::string& candidate_name);

// The bounds for one stage, over rows of `cols` elements.
struct StageBound {
  double rel_rms = 0;   // per row: ||a - e|| / ||e|| <= rel_rms (the norm criterion)
  double max_rel = 0;   // per element: |a - e| / max_j |e[row, j]| <= max_rel (the tail criterion)
  double estimate = 0;  // E_expected + E_actual, before the safety factor
};
//   rel_rms = max(floor, S·E),  max_rel = max(floor, S·E·sqrt(2·ln(2·cols)))
// with floor = the sum of both sides' floors. sqrt(2 ln 2m) bounds the largest of m Gaussian
// errors in units of their standard deviation (see docs/tolerances.md, "Tail criterion").
StageBound stage_bound(const TolerancePair& pair, const StagePath& path, int64_t cols);

}  // namespace dflash
