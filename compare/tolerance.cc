#include "compare/tolerance.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/stages.h"

namespace dflash {
namespace {

StagePath operator+(const StagePath& a, const StagePath& b) {
  return {a.roundings + b.roundings, a.fp8_gemms + b.fp8_gemms,   a.accumulation + b.accumulation,
          a.boundaries + b.boundaries, a.quantization + b.quantization, a.activation + b.activation,
          a.wire_rms + b.wire_rms,     a.wire_tail + b.wire_tail,        a.attention_partials + b.attention_partials};
}

// Where two paths join, the longer one (component by component, an upper bound of either).
StagePath longest(const StagePath& a, const StagePath& b) {
  return {std::max(a.roundings, b.roundings), std::max(a.fp8_gemms, b.fp8_gemms),
          std::max(a.accumulation, b.accumulation), std::max(a.boundaries, b.boundaries),
          std::max(a.quantization, b.quantization), std::max(a.activation, b.activation),
          std::max(a.wire_rms, b.wire_rms), std::max(a.wire_tail, b.wire_tail),
          std::max(a.attention_partials, b.attention_partials)};
}

// The steps of one stage, as a bf16 engine (PyTorch on a GPU, docs/spec/drafter.md §3) computes them, with
// the drafters' bf16 boundaries (docs/reference-precision.md) where they fall. Each entry:
// {roundings, fp8 GEMMs, accumulation length, boundaries, quantization}.
StagePath gemm(int64_t inner) { return {1, 0, inner, 0, 0.0}; }
// A GEMM on per-row E4M3 weights whose relative error is `delta` (and, in w8a8, on E4M3 input rows).
StagePath fp8_gemm(int64_t inner, double delta) {
  const double epsilon = activation_quantization_error(inner);
  return {1, 1, inner, 0, delta * delta, epsilon * epsilon};
}
// RMSNorm: the normalized value is rounded, then its product with the weight (K = H for mean(x²)).
StagePath rms_norm(int64_t width) { return {2, 0, width, 0, 0.0}; }
// RoPE: cos/sin rounded to the activation type, two products, one sum.
const StagePath kRope = {3, 0, 0, 0, 0.0};
const StagePath kElementwise = {1, 0, 0, 0, 0.0};  // one rounded elementwise op (residual add, silu, product)
const StagePath kBoundary = {0, 0, 0, 1, 0.0};     // a drafter stores the value as bf16
// An attention's split partials, which a side with bf16_attention_partials rounds to bf16.
const StagePath kAttentionPartials = {0, 0, 0, 0, 0.0, 0.0, 0.0, 0.0, 1};
// Row-parallel reduction j (2l: o_proj, 2l + 1: down_proj): N partials and their sum that a bf16
// wire rounds (docs/spec/tensor-parallel.md §9.2).
StagePath reduction(const WireRounding& wire, int j) {
  const size_t at = static_cast<size_t>(j);
  return {0, 0, 0, 0, 0.0, 0.0, 1.0 + wire.rho2.at(at), 1.0 + wire.rho_inf.at(at)};
}

// δ of each fp8 GEMM: measured, or the a-priori bound of one E4M3 rounding.
struct GemmErrors {
  const WeightQuantization* measured;
  double layer(int l, double WeightQuantization::Layer::*gemm) const {
    return measured ? measured->layers[static_cast<size_t>(l)].*gemm : kUnitRoundoffE4M3;
  }
  double lm_head() const { return measured ? measured->lm_head : kUnitRoundoffE4M3; }
};

}  // namespace

double activation_quantization_error(int64_t inner) {
  // A subnormal code is within 2^-10 of its value in code units: 2^-10 · scale = amax·2^-10/448.
  const double subnormal = 0x1p-10 / 448.0;
  return std::sqrt(kUnitRoundoffE4M3 * kUnitRoundoffE4M3 + static_cast<double>(inner) * subnormal * subnormal);
}

std::map<std::string, StagePath> stage_paths(const DrafterConfig& config, int64_t window, int block_width,
                                             const WeightQuantization* measured, const WireRounding* wire) {
  if (measured != nullptr && measured->layers.size() != static_cast<size_t>(config.num_layers)) {
    throw internal_error("stage_paths: quantization measured for " + std::to_string(measured->layers.size()) +
                         " layers of a " + std::to_string(config.num_layers) + "-layer drafter");
  }
  const WireRounding rho = wire != nullptr ? *wire : uncorrelated_wire(config.num_layers);
  const size_t reductions = static_cast<size_t>(2 * config.num_layers);
  if (rho.rho2.size() != reductions || rho.rho_inf.size() != reductions) {
    throw internal_error("stage_paths: the bf16 wire measured for " + std::to_string(rho.rho2.size()) + " reductions of a " +
                         std::to_string(config.num_layers) + "-layer drafter");
  }
  const GemmErrors delta{measured};
  using L = WeightQuantization::Layer;
  const int64_t H = config.hidden_size, d = config.head_dim, I = config.intermediate_size;
  std::map<std::string, StagePath> paths;
  // Context rows and the embedding row are bf16 inputs, exact.
  const StagePath ctx_proj = gemm(config.ctx_feature_dim()) + rms_norm(H) + kBoundary;  // fc stays bf16
  paths[stage_name(StageKind::kCtxProj)] = ctx_proj;
  StagePath h = {};
  paths[stage_name(StageKind::kEmbed)] = h;
  for (int l = 0; l < config.num_layers; ++l) {
    const StagePath attn_norm_out = h + rms_norm(H) + kBoundary;
    paths[stage_name(StageKind::kAttnNorm, l)] = attn_norm_out;
    // DFlash2 prepare (docs/spec/dflash2.md §3.1): kernel_projection (bf16 in fp8 mode), stored
    // as bf16 by both drafters, then k taps of (base + coefficient) · x summed, stored as bf16
    // (q/k/v, or gate/up, read it); finish is the same sum, kept fp32. Each term is a product of
    // a coefficient and an input, whose relative errors add: both paths enter (`+`, not `longest`,
    // which is for sums such as the residual adds).
    const int64_t taps = config.dflash2.conv_kernel_size;
    const StagePath conv_own = {2 * static_cast<int>(taps) + 1, 0, taps, 0, 0.0};
    const StagePath prepare_own = conv_own + kBoundary;
    const StagePath attn_coef = attn_norm_out + gemm(H) + kBoundary;
    const StagePath attn_norm = config.dflash2.enabled ? attn_coef + attn_norm_out + prepare_own : attn_norm_out;
    if (config.dflash2.enabled) {
      paths[stage_name(StageKind::kAttnConvCoef, l)] = attn_coef;
      paths[stage_name(StageKind::kAttnConvIn, l)] = attn_norm;
    }
    // projection, q/k_norm, RoPE, stored as bf16 (the context K/V in the cache alike)
    const StagePath q_own = fp8_gemm(H, delta.layer(l, &L::q)) + rms_norm(d) + kRope + kBoundary;
    const StagePath k_own = fp8_gemm(H, delta.layer(l, &L::k)) + rms_norm(d) + kRope + kBoundary;
    const StagePath v_own = fp8_gemm(H, delta.layer(l, &L::v)) + kBoundary;
    paths[stage_name(StageKind::kQ, l)] = attn_norm + q_own;
    paths[stage_name(StageKind::kK, l)] = attn_norm + k_own;
    paths[stage_name(StageKind::kV, l)] = attn_norm + v_own;
    // Scores (K = d), probabilities (normalizing sum over window + B), P·V (K = window + B), the
    // output stored as bf16. The q, k and v branches carry independent errors, so all three enter,
    // on top of the longer of the block rows' and the context rows' inputs.
    const StagePath attention_own = StagePath{3, 0, d + 2 * (window + block_width), 0, 0.0} + kAttentionPartials + kBoundary;
    const StagePath attn = longest(attn_norm, ctx_proj) + q_own + k_own + v_own + attention_own;
    paths[stage_name(StageKind::kAttn, l)] = attn;
    const StagePath o_partial = attn + fp8_gemm(config.q_dim(), delta.layer(l, &L::o));
    paths[partial_family(StageKind::kOProj, l)] = o_partial + kBoundary;
    const StagePath o_proj_out = o_partial + reduction(rho, 2 * l);
    paths[stage_name(StageKind::kOProj, l)] = o_proj_out;
    const StagePath o_proj = config.dflash2.enabled ? o_proj_out + attn_coef + conv_own : o_proj_out;
    if (config.dflash2.enabled) paths[stage_name(StageKind::kAttnConvOut, l)] = o_proj;
    const StagePath h_mid = longest(h, o_proj) + kElementwise;  // residual add
    const StagePath mlp_norm_out = h_mid + rms_norm(H) + kBoundary;
    paths[stage_name(StageKind::kMlpNorm, l)] = mlp_norm_out;
    const StagePath mlp_coef = mlp_norm_out + gemm(H) + kBoundary;
    const StagePath mlp_norm = config.dflash2.enabled ? mlp_coef + mlp_norm_out + prepare_own : mlp_norm_out;
    if (config.dflash2.enabled) {
      paths[stage_name(StageKind::kMlpConvCoef, l)] = mlp_coef;
      paths[stage_name(StageKind::kMlpConvIn, l)] = mlp_norm;
    }
    // gate and up (independent branches), silu, product stored as bf16, down.
    const StagePath mlp_partial = mlp_norm + fp8_gemm(H, delta.layer(l, &L::gate)) +
                                  fp8_gemm(H, delta.layer(l, &L::up)) + kElementwise + kElementwise + kBoundary +
                                  fp8_gemm(I, delta.layer(l, &L::down));
    paths[partial_family(StageKind::kMlp, l)] = mlp_partial + kBoundary;
    const StagePath mlp_out = mlp_partial + reduction(rho, 2 * l + 1);
    paths[stage_name(StageKind::kMlp, l)] = mlp_out;
    const StagePath mlp = config.dflash2.enabled ? mlp_out + mlp_coef + conv_own : mlp_out;
    if (config.dflash2.enabled) paths[stage_name(StageKind::kMlpConvOut, l)] = mlp;
    h = longest(h_mid, mlp) + kElementwise;  // residual add
    paths[stage_name(StageKind::kOut, l)] = h;
  }
  const StagePath final_norm = h + rms_norm(H) + kBoundary;
  const StagePath logits = final_norm + fp8_gemm(H, delta.lm_head());  // the lm_head is quantized in fp8 mode
  paths[stage_name(StageKind::kFinalNorm)] = final_norm;
  paths[stage_name(StageKind::kLogits)] = logits;
  if (config.dflash2.enabled) {
    // Selector (docs/spec/dflash2.md §3.4, §5): values gathered from the logits, the unary's
    // multiply and softcap, the hidden projection (bf16 in fp8 mode), one r-long sum per edge.
    // topk_ids carry no rounding: any difference in them is a real difference in the candidate set.
    paths[stage_name(StageKind::kSelTopkIds)] = {};
    paths[stage_name(StageKind::kSelTopkValues)] = logits;
    const StagePath unary = logits + kElementwise + kElementwise;
    paths[stage_name(StageKind::kSelUnary)] = unary;
    const StagePath hidden_proj = final_norm + gemm(H);
    paths[stage_name(StageKind::kSelHiddenProj)] = hidden_proj;
    const StagePath edges =
        longest(unary, hidden_proj + StagePath{2, 0, config.dflash2.selector_rank, 0, 0.0}) + kElementwise;
    paths[stage_name(StageKind::kSelEdgeScores)] = edges;
    paths[stage_name(StageKind::kSelWalkScores)] = edges;
  }
  return paths;
}

StagePath stage_path(const std::map<std::string, StagePath>& paths, const std::string& stage) {
  const std::string family = partial_family_of(stage);  // every rank's partial has the one path
  return paths.at(family.empty() ? stage : family);
}

StagePath context_kv_path(const DrafterConfig& config, bool key) {
  const int64_t H = config.hidden_size;
  // fc stays bf16; k_proj/v_proj are fp8 GEMMs in fp8 mode (the a-priori E4M3 rounding: this path is
  // judged per stored row, without the weights' measured quantization); the cache stores bf16.
  const StagePath ctx_proj = gemm(config.ctx_feature_dim()) + rms_norm(H) + kBoundary;
  const StagePath projection = fp8_gemm(H, kUnitRoundoffE4M3);
  return key ? ctx_proj + projection + rms_norm(config.head_dim) + kRope + kBoundary
             : ctx_proj + projection + kBoundary;
}

ErrorModel error_model(Precision precision) {
  switch (precision) {
    case Precision::kFp64: return {"fp64", kUnitRoundoffFp64, kUnitRoundoffFp64, false, false, 0};
    // The fp32 drafter also carries the fp32 contract bound as its floor: the roundoff estimate
    // alone leaves out the amplification of norms and softmax, and random geometries exceeded it by
    // up to 5x against fp64 (tests/properties, property 9); 1e-4 is the fp32 contract bound.
    case Precision::kFp32: return {"fp32", kUnitRoundoffFp32, kUnitRoundoffFp32, false, false, kFp32ExpectationBound};
    // The drafters' bf16 and fp8 modes round to bf16 at their storage boundaries only.
    case Precision::kBf16: return {"bf16-drafter", kUnitRoundoffBf16, kUnitRoundoffFp32, true, false, 0};
    case Precision::kFp8: return {"fp8-drafter", kUnitRoundoffBf16, kUnitRoundoffFp32, true, true, 0};
    case Precision::kW8a8: return {"w8a8-drafter", kUnitRoundoffBf16, kUnitRoundoffFp32, true, true, 0, true};
  }
  throw internal_error("error_model: unknown precision");
}

ErrorModel fixture_error_model(const std::string& expect_precision) {
  Precision precision;
  // The fixture format has no w8a8 expectations (docs/spec/fixture-format.md).
  if (!parse_precision(expect_precision, &precision) || precision == Precision::kW8a8) {
    throw bad_input("provenance.expect_precision: '" + expect_precision + "' is not one of fp64, fp32, bf16, fp8");
  }
  ErrorModel model = error_model(precision);
  model.name = "fixture-" + expect_precision;
  model.rounds_at_boundaries = false;  // an engine (PyTorch) rounds after every op
  if (precision == Precision::kFp64) model.floor = kFp64ExpectationBound;
  if (precision == Precision::kFp32) model.floor = kFp32ExpectationBound;
  return model;
}

double relative_error_estimate(const ErrorModel& model, const StagePath& path, bool count_weights) {
  const double storage_roundings = (model.rounds_at_boundaries ? path.boundaries : path.roundings) +
                                   (model.bf16_wire ? path.wire_rms : 0.0) +
                                   (model.bf16_attention_partials ? path.attention_partials : 0);
  const double quantization = count_weights && model.quantized_weights ? path.quantization : 0.0;
  const double activation = model.quantized_activations ? path.activation : 0.0;
  const double variance = storage_roundings * model.storage * model.storage + quantization + activation +
                          static_cast<double>(path.accumulation) * model.accumulation * model.accumulation +
                          kUnitRoundoffFp32 * kUnitRoundoffFp32;
  return std::sqrt(variance);
}

TolerancePair fixture_pair(const std::string& expect_precision, Precision actual, const std::string& actual_name) {
  TolerancePair pair;
  pair.expected = fixture_error_model(expect_precision);
  pair.actual = error_model(actual);
  pair.label = "fixture(" + expect_precision + ") vs " + actual_name;
  return pair;
}

TolerancePair cross_pair(Precision reference, const std::string& reference_name, Precision candidate,
                         const std::string& candidate_name) {
  TolerancePair pair;
  pair.expected = error_model(reference);
  pair.actual = error_model(candidate);
  // fp8 and w8a8 hold the same E4M3 weights (core/fp8.h).
  pair.shared_quantized_weights = pair.expected.quantized_weights && pair.actual.quantized_weights;
  pair.same_rounding_points = reference == candidate && pair.expected.rounds_at_boundaries;
  pair.label = reference_name + " vs " + candidate_name;
  return pair;
}

StageBound stage_bound(const TolerancePair& pair, const StagePath& path, int64_t cols) {
  StageBound bound;
  if (pair.same_rounding_points) {
    const double u = kUnitRoundoffBf16;
    const bool wire = pair.expected.bf16_wire || pair.actual.bf16_wire;
    const bool partials = pair.expected.bf16_attention_partials || pair.actual.bf16_attention_partials;
    const double extra = partials ? path.attention_partials : 0;  // the one side's rounding of them
    const double n = path.boundaries + (wire ? path.wire_rms : 0.0) + extra;
    const double n_tail = path.boundaries + (wire ? path.wire_tail : 0.0) + extra;
    const double accumulation = 2.0 * std::sqrt(static_cast<double>(path.accumulation) * kUnitRoundoffFp32 *
                                                    kUnitRoundoffFp32 + kUnitRoundoffFp32 * kUnitRoundoffFp32);
    // w8a8: each quantized input row may take codes one E4M3 ulp apart where the two sides' bf16
    // inputs differ (2·ε_a of the row's norm, 2·u_e4m3 of its largest element).
    const bool activations = pair.expected.quantized_activations && pair.actual.quantized_activations;
    const double flips = activations ? path.activation : 0.0;
    const double flips_max = activations ? path.fp8_gemms * kUnitRoundoffE4M3 : 0.0;
    bound.estimate = std::sqrt(n * u * u + flips) + accumulation;
    bound.rel_rms = 2.0 * std::sqrt(n * u * u + flips) + kSafetyFactor * accumulation;
    bound.max_rel = 2.0 * (n_tail * u + flips_max) + kSafetyFactor * accumulation;
    // A path without roundings (the embedding's copies, the selector's ids) has no rounding to bias.
    bound.rounding_bias = path.boundaries > 0 || path.roundings > 0;
    return bound;
  }
  const bool count_weights = !pair.shared_quantized_weights;
  bound.estimate = relative_error_estimate(pair.expected, path, count_weights) +
                   relative_error_estimate(pair.actual, path, count_weights);
  const double floor = pair.expected.floor + pair.actual.floor;
  const double tail_factor = std::sqrt(2.0 * std::log(2.0 * static_cast<double>(std::max<int64_t>(cols, 1))));
  bound.rel_rms = std::max(floor, kSafetyFactor * bound.estimate);
  bound.max_rel = std::max(floor, kSafetyFactor * bound.estimate * tail_factor);
  return bound;
}

}  // namespace dflash
