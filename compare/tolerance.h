// The tolerance model (docs/tolerances.md), the one every comparison uses (the CLI's replay, the GPU
// tests, the properties): bounds DERIVED from the precisions of the two sides, never tuned. Each
// side's relative error against exact arithmetic is estimated from the unit roundoffs it uses, the
// roundings on the longest path from the inputs to a stage, for fp8 weights the quantization error
// measured on the weights at hand, and for w8a8 the E4M3 rounding of each GEMM's input rows; a
// pair's bound is the safety factor times the sum of its
// two sides' estimates. Two drafters that round at the same bf16 boundaries with the same weights
// (the emulating reference vs the CUDA drafter) are held to the tight bf16-boundary model instead.
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "compare/weight_quantization.h"
#include "compare/wire_rounding.h"
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
  int roundings = 0;         // roundings of values to the storage format in an engine that rounds every op
  int fp8_gemms = 0;         // GEMMs whose weights an fp8 drafter holds as per-row E4M3 (and whose
                             // input rows a w8a8 drafter quantizes)
  int64_t accumulation = 0;  // summed inner lengths of the dot products and reductions
  int boundaries = 0;        // bf16 storage boundaries of the drafters' bf16/fp8/w8a8 modes (reference-precision.md)
  double quantization = 0;   // sum of δ² over the fp8 GEMMs on the path (δ: relative weight error)
  double activation = 0;     // sum of ε_a² over the same GEMMs (ε_a: relative error of a w8a8 input row,
                             // activation_quantization_error)
  // The row-parallel reductions on the path, as the bf16 boundaries a side with a bf16 wire adds
  // (docs/spec/tensor-parallel.md §9.2): Σ_j (1 + ρ_j²) for the norm, Σ_j (1 + ρ∞_j) for the tail.
  double wire_rms = 0;
  double wire_tail = 0;
  // The attentions on the path: one bf16 rounding each for a side that stores the attention's
  // split partials as bf16 (ErrorModel::bf16_attention_partials).
  int attention_partials = 0;
};

// ε_a of a GEMM of inner length K whose input row a w8a8 drafter quantizes per token
// (docs/tolerances.md, "The activation term"): sqrt(u_e4m3² + K·(2^-10 / 448)²), the relative
// error of the quantized row's norm (normal values within u_e4m3 of themselves, subnormal ones
// within 2^-10 · scale = amax·2^-10/448), which a GEMM passes on to its output row.
double activation_quantization_error(int64_t inner);

// The path of every stage (docs/spec/drafter.md §7 names) of one propose. `window` is the number of context
// positions the block attends to, `block_width` the clamped width B. `measured`: the quantization
// error of each fp8 GEMM's weights (compare/weight_quantization.h); without it each fp8 GEMM counts
// the a-priori bound u_w = 2^-4 of one E4M3 rounding. Every fp8 GEMM also carries its ε_a², which
// only a w8a8 side counts. `wire`: ρ² and ρ∞ of each row-parallel reduction (1 without), which only
// a side with a bf16 wire counts. Besides the stages, each partial_family (core/stages.h):
// a rank's partial as it enters its reduction, one bf16 boundary (the wire's rounding of it; in fp32
// a bound that stays loose by that term) and none of its own reduction.
std::map<std::string, StagePath> stage_paths(const DrafterConfig& config, int64_t window, int block_width,
                                             const WeightQuantization* measured = nullptr,
                                             const WireRounding* wire = nullptr);

// paths.at(stage), with a rank's partial ("L{l}.o_proj.partial@r{rank}", docs/spec/tensor-parallel.md
// §7) on the path of its stage's partials.
StagePath stage_path(const std::map<std::string, StagePath>& paths, const std::string& stage);

// The path of the K (key = true) or V a drafter stores for a context row in any layer: ctx_proj,
// then k_proj, k_norm and RoPE (or v_proj).
StagePath context_kv_path(const DrafterConfig& config, bool key);

// How one side computed its numbers.
struct ErrorModel {
  std::string name;           // "fp64", "bf16-engine", ...
  double storage = 0;         // unit roundoff of stage storage and elementwise ops
  double accumulation = 0;    // unit roundoff of the accumulators
  // true: rounds to storage only at the drafters' bf16 boundaries (StagePath::boundaries); false:
  // after every op (StagePath::roundings), as a PyTorch engine does.
  bool rounds_at_boundaries = false;
  bool quantized_weights = false;  // holds per-row E4M3 weights (StagePath::quantization enters)
  double floor = 0;                // contract bound this side alone may use (fp64/fp32 fixtures)
  bool quantized_activations = false;  // w8a8: quantizes the GEMMs' input rows (StagePath::activation enters)
  // Rounds row-parallel partials and their sum to bf16 (tp_size > 1, tp_reduce_dtype bf16:
  // docs/spec/tensor-parallel.md §4): StagePath::wire_rms and wire_tail enter as boundaries.
  bool bf16_wire = false;
  // Stores the attention's split-KV partials as bf16, as engines' split-KV kernels do (a plugin
  // announces it): StagePath::attention_partials enter as boundaries (docs/tolerances.md §4).
  bool bf16_attention_partials = false;
};

// The drafter precisions (core/proposer.h): the reference in that mode, or the CUDA drafter. Their
// outputs are float tensors, so each model also carries one fp32 rounding of the result.
ErrorModel error_model(Precision precision);
// A fixture's provenance.expect_precision: "fp64", "fp32", "bf16" or "fp8" (anything else, w8a8
// included, is kBadInput naming the field); bf16 and fp8 are engines that round after every op.
// Expectations are stored as F32: one fp32 rounding on top.
ErrorModel fixture_error_model(const std::string& expect_precision);

// Estimated relative RMS error of one side at a stage:
//   sqrt(n·u_s² + quantization + activation + accumulation·u_a² + u_fp32²)
// with n the path's boundaries or roundings (ErrorModel::rounds_at_boundaries), plus wire_rms for a
// side with a bf16 wire, the quantization
// term only for quantized weights and the activation term only for quantized activations
// (independent errors add in variance; the last term is the fp32 storage of the result).
double relative_error_estimate(const ErrorModel& model, const StagePath& path, bool count_weights = true);

// Two sides of a comparison.
struct TolerancePair {
  std::string label;       // "fixture(bf16) vs reference-fp64"
  ErrorModel expected;     // the side errors are measured relative to
  ErrorModel actual;
  // Both sides hold the same E4M3 weights (the fp8- or w8a8-emulating reference vs a drafter in
  // either mode): the quantization error is common to both and cancels, so it is left out of the bound.
  bool shared_quantized_weights = false;
  // Both sides round at the same bf16 boundaries from the same weights (a drafter mode against the
  // reference emulating it: bf16/bf16, fp8/fp8 or w8a8/w8a8): the tight bf16-boundary model.
  bool same_rounding_points = false;
};

// The fixture's expectations vs a drafter (the actual side).
TolerancePair fixture_pair(const std::string& expect_precision, Precision actual, const std::string& actual_name);
// Reference drafter (expected side) vs another drafter, e.g. the CUDA one. The same bf16, fp8 or
// w8a8 mode on both sides is a same-precision pair (tight); the bf16 reference against an fp8 or
// w8a8 drafter is that mode's envelope.
TolerancePair cross_pair(Precision reference, const std::string& reference_name, Precision candidate,
                         const std::string& candidate_name);

// The bounds for one stage, over rows of `cols` elements.
struct StageBound {
  double rel_rms = 0;   // per row: ||a - e|| / ||e|| <= rel_rms (the norm criterion)
  double max_rel = 0;   // per element: |a - e| / max_j |e[row, j]| <= max_rel (the tail criterion)
  double estimate = 0;  // E_expected + E_actual, before the safety factor
  // Same rounding points and a path that rounds: the stage's mean signed error in bf16 ulps is also
  // held to its bound (compare/rounding_bias.h).
  bool rounding_bias = false;
};
//   rel_rms = max(floor, S·E),  max_rel = max(floor, S·E·sqrt(2·ln(2·cols)))
// with floor = the sum of both sides' floors. sqrt(2 ln 2m) bounds the largest of m Gaussian
// errors in units of their standard deviation (see docs/tolerances.md, "Tail criterion").
// Same-precision pairs, n = path.boundaries, A = S·2·sqrt(accumulation·u_a² + u_fp32²):
//   rel_rms = 2·sqrt(n)·u_bf16 + A,  max_rel = 2·n·u_bf16 + A
// where a side has a bf16 wire, n is n + wire_rms in rel_rms and n + wire_tail in max_rel
// (a boundary rounds two values that differ only by fp32 reordering to bf16 values at most one
// ulp apart: independent over the row for the norm, aligned for the element); and where the path
// rounds at all, the rounding-bias check (rounding_bias = true). w8a8 pairs add each quantized
// input row as a boundary whose codes may lie one E4M3 ulp apart, g = path.fp8_gemms:
//   rel_rms = 2·sqrt(n·u_bf16² + activation) + A,  max_rel = 2·(n·u_bf16 + g·u_e4m3) + A
StageBound stage_bound(const TolerancePair& pair, const StagePath& path, int64_t cols);

}  // namespace dflash
