#include "compare/tolerance.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/stages.h"

namespace dflash {
namespace {

StagePath operator+(const StagePath& a, const StagePath& b) {
  return {a.roundings + b.roundings, a.fp8_gemms + b.fp8_gemms, a.accumulation + b.accumulation};
}

// Where two paths join, the longer one (component by component, an upper bound of either).
StagePath longest(const StagePath& a, const StagePath& b) {
  return {std::max(a.roundings, b.roundings), std::max(a.fp8_gemms, b.fp8_gemms),
          std::max(a.accumulation, b.accumulation)};
}

// The steps of one stage, as a bf16 engine (PyTorch on a GPU, drafter.md §3) computes them. Each
// entry: {roundings, fp8 GEMMs, accumulation length}.
StagePath gemm(int64_t inner, bool quantized_in_fp8) { return {1, quantized_in_fp8 ? 1 : 0, inner}; }
// RMSNorm: the normalized value is rounded, then its product with the weight (K = H for mean(x²)).
StagePath rms_norm(int64_t width) { return {2, 0, width}; }
// RoPE: cos/sin rounded to the activation type, two products, one sum.
const StagePath kRope = {3, 0, 0};
const StagePath kElementwise = {1, 0, 0};  // one rounded elementwise op (residual add, silu, product)

}  // namespace

std::map<std::string, StagePath> stage_paths(const DrafterConfig& config, int64_t window, int block_width) {
  const int64_t H = config.hidden_size, d = config.head_dim, I = config.intermediate_size;
  std::map<std::string, StagePath> paths;
  // Context rows and the embedding row are bf16 inputs, exact.
  const StagePath ctx_proj = gemm(config.ctx_feature_dim(), false) + rms_norm(H);  // fc stays bf16
  paths[stage_name(StageKind::kCtxProj)] = ctx_proj;
  StagePath h = {};
  paths[stage_name(StageKind::kEmbed)] = h;
  for (int l = 0; l < config.num_layers; ++l) {
    const StagePath attn_norm = h + rms_norm(H);
    const StagePath qk_own = gemm(H, true) + rms_norm(d) + kRope;  // projection, q/k_norm, RoPE
    const StagePath v_own = gemm(H, true);
    paths[stage_name(StageKind::kAttnNorm, l)] = attn_norm;
    paths[stage_name(StageKind::kQ, l)] = attn_norm + qk_own;
    paths[stage_name(StageKind::kK, l)] = attn_norm + qk_own;
    paths[stage_name(StageKind::kV, l)] = attn_norm + v_own;
    // Scores (K = d), probabilities (normalizing sum over window + B), P·V (K = window + B). The
    // q, k and v branches carry independent errors, so all three enter, on top of the longer of the
    // block rows' and the context rows' inputs.
    const StagePath attention_own = {3, 0, d + 2 * (window + block_width)};
    const StagePath attn = longest(attn_norm, ctx_proj) + qk_own + qk_own + v_own + attention_own;
    paths[stage_name(StageKind::kAttn, l)] = attn;
    const StagePath o_proj = attn + gemm(config.q_dim(), true);
    paths[stage_name(StageKind::kOProj, l)] = o_proj;
    const StagePath h_mid = longest(h, o_proj) + kElementwise;  // residual add
    const StagePath mlp_norm = h_mid + rms_norm(H);
    paths[stage_name(StageKind::kMlpNorm, l)] = mlp_norm;
    // gate and up (independent branches), silu, product, down.
    const StagePath mlp = mlp_norm + gemm(H, true) + gemm(H, true) + kElementwise + kElementwise + gemm(I, true);
    paths[stage_name(StageKind::kMlp, l)] = mlp;
    h = longest(h_mid, mlp) + kElementwise;  // residual add
    paths[stage_name(StageKind::kOut, l)] = h;
  }
  const StagePath final_norm = h + rms_norm(H);
  paths[stage_name(StageKind::kFinalNorm)] = final_norm;
  paths[stage_name(StageKind::kLogits)] = final_norm + gemm(H, true);  // the lm_head is quantized in fp8 mode
  return paths;
}

StagePath context_kv_path(const DrafterConfig& config, bool key) {
  const int64_t H = config.hidden_size;
  const StagePath ctx_proj = gemm(config.ctx_feature_dim(), false) + rms_norm(H);
  return key ? ctx_proj + gemm(H, true) + rms_norm(config.head_dim) + kRope : ctx_proj + gemm(H, true);
}

ErrorModel error_model(Precision precision) {
  switch (precision) {
    case Precision::kFp64: return {"fp64", kUnitRoundoffFp64, kUnitRoundoffFp64, 0, 0};
    // The fp32 drafter also carries the fp32 contract bound as its floor: the roundoff estimate
    // alone leaves out the amplification of norms and softmax, and random geometries exceeded it by
    // up to 5x against fp64 (tests/properties, property 9); 1e-4 is the bound issue 3 states.
    case Precision::kFp32: return {"fp32", kUnitRoundoffFp32, kUnitRoundoffFp32, 0, kFp32ExpectationBound};
    case Precision::kBf16: return {"bf16-engine", kUnitRoundoffBf16, kUnitRoundoffFp32, 0, 0};
    case Precision::kFp8: return {"fp8-engine", kUnitRoundoffBf16, kUnitRoundoffFp32, kUnitRoundoffE4M3, 0};
  }
  throw internal_error("error_model: unknown precision");
}

ErrorModel fixture_error_model(const std::string& expect_precision) {
  Precision precision;
  if (!parse_precision(expect_precision, &precision)) {
    throw bad_input("provenance.expect_precision: '" + expect_precision + "' is not one of fp64, fp32, bf16, fp8");
  }
  ErrorModel model = error_model(precision);
  model.name = "fixture-" + expect_precision;
  if (precision == Precision::kFp64) model.floor = kFp64ExpectationBound;
  if (precision == Precision::kFp32) model.floor = kFp32ExpectationBound;
  return model;
}

double relative_error_estimate(const ErrorModel& model, const StagePath& path, bool count_weights) {
  const double weights = count_weights ? model.weights : 0.0;
  const double variance = path.roundings * model.storage * model.storage + path.fp8_gemms * weights * weights +
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
  pair.shared_quantized_weights = reference == Precision::kFp8 && candidate == Precision::kFp8;
  pair.label = reference_name + " vs " + candidate_name;
  return pair;
}

StageBound stage_bound(const TolerancePair& pair, const StagePath& path, int64_t cols) {
  const bool count_weights = !pair.shared_quantized_weights;
  StageBound bound;
  bound.estimate = relative_error_estimate(pair.expected, path, count_weights) +
                   relative_error_estimate(pair.actual, path, count_weights);
  const double floor = pair.expected.floor + pair.actual.floor;
  const double tail_factor = std::sqrt(2.0 * std::log(2.0 * static_cast<double>(std::max<int64_t>(cols, 1))));
  bound.rel_rms = std::max(floor, kSafetyFactor * bound.estimate);
  bound.max_rel = std::max(floor, kSafetyFactor * bound.estimate * tail_factor);
  return bound;
}

}  // namespace dflash
