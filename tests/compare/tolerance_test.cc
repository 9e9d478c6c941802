// The tolerance model: the path counts and bounds against hand derivations, and for every pair of
// the model a value just past each bound fails while the largest value inside it passes.
#include "tests/support/harness_error.h"
#include "compare/tolerance.h"

#include <cmath>
#include <limits>
#include <string>

#include <gtest/gtest.h>

#include "compare/stage_check.h"
#include "core/error.h"
#include "fixtures/geometries.h"

namespace dflash {
namespace {

DrafterConfig hand_config() {
  DrafterConfig c;
  c.hidden_size = 8;
  c.num_layers = 1;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 4;
  c.intermediate_size = 16;
  c.vocab_size = 32;
  c.target_layer_ids = {1, 2};
  c.target_hidden_size = 8;
  c.block_size = 4;
  return c;
}

void expect_path(const StagePath& p, int roundings, int fp8_gemms, int64_t accumulation, int boundaries,
                 const std::string& stage) {
  EXPECT_EQ(p.roundings, roundings) << stage;
  EXPECT_EQ(p.fp8_gemms, fp8_gemms) << stage;
  EXPECT_EQ(p.accumulation, accumulation) << stage;
  EXPECT_EQ(p.boundaries, boundaries) << stage;
  // Without measured weights, each fp8 GEMM counts the a-priori E4M3 bound.
  EXPECT_DOUBLE_EQ(p.quantization, fp8_gemms * std::ldexp(1.0, -8)) << stage;
}

TEST(Tolerance, StagePathsOfAHandConfig) {
  // H 8, nh·d 8, nkv·d 4, I 16, nT·Ht 16, window 10, B 4. Counted by hand from the table in
  // docs/tolerances.md: fc(1) + RMSNorm(2); q/k = RMSNorm + proj(1) + q_norm(2) + RoPE(3); ...
  // Boundaries (docs/reference-precision.md): ctx_proj, attn_norm, q/k/v (each branch), attention
  // output, mlp_norm, the MLP activation, final_norm.
  const auto paths = stage_paths(hand_config(), 10, 4);
  expect_path(paths.at("ctx_proj"), 3, 0, 16 + 8, 1, "ctx_proj");
  expect_path(paths.at("embed"), 0, 0, 0, 0, "embed");
  expect_path(paths.at("L0.attn_norm"), 2, 0, 8, 1, "attn_norm");
  expect_path(paths.at("L0.q"), 8, 1, 8 + 8 + 4, 2, "q");
  expect_path(paths.at("L0.k"), 8, 1, 8 + 8 + 4, 2, "k");
  expect_path(paths.at("L0.v"), 3, 1, 8 + 8, 2, "v");
  // longest(attn_norm, ctx_proj) = (3, 0, 24, 1), + q (6, 1, 12, 1) + k (6, 1, 12, 1) + v (1, 1, 8, 1)
  // + attention (3, 0, 4 + 2·14, 1).
  expect_path(paths.at("L0.attn"), 19, 3, 24 + 12 + 12 + 8 + 32, 5, "attn");
  expect_path(paths.at("L0.o_proj"), 20, 4, 88 + 8, 5, "o_proj");
  expect_path(paths.at("L0.mlp_norm"), 23, 4, 96 + 8, 6, "mlp_norm");
  expect_path(paths.at("L0.mlp"), 28, 7, 104 + 8 + 8 + 16, 7, "mlp");
  expect_path(paths.at("L0.out"), 29, 7, 136, 7, "out");
  expect_path(paths.at("final_norm"), 31, 7, 144, 8, "final_norm");
  expect_path(paths.at("logits"), 32, 8, 152, 8, "logits");
  // A rank's partial: its stage's path before the reduction, plus the wire's rounding of it.
  expect_path(paths.at("L0.o_proj.partial"), 20, 4, 96, 6, "o_proj partial");
  expect_path(paths.at("L0.mlp.partial"), 28, 7, 136, 8, "mlp partial");
  EXPECT_EQ(paths.size(), 15u);
  const StagePath& rank3 = stage_path(paths, "L0.mlp.partial@r3");
  EXPECT_EQ(rank3.boundaries, 8);
  EXPECT_EQ(stage_path(paths, "L0.mlp").boundaries, 7);
}

TEST(Tolerance, BfloatWireCountsEachReductionOnThePath) {
  // docs/spec/tensor-parallel.md §9.2: reduction 2l at o_proj, 2l + 1 at down_proj, each adding
  // 1 + ρ² (norm) and 1 + ρ∞ (tail); ρ = 1 without measured partials. Two layers, by hand.
  DrafterConfig c = hand_config();
  c.num_layers = 2;
  c.target_layer_ids = {1, 2};
  const auto unmeasured = stage_paths(c, 10, 4);
  const std::pair<const char*, double> expect_uncorrelated[] = {
      {"L0.attn", 0}, {"L0.o_proj.partial", 0}, {"L0.o_proj", 2}, {"L0.mlp_norm", 2}, {"L0.mlp.partial", 2},
      {"L0.mlp", 4},  {"L0.out", 4},            {"L1.attn", 4},   {"L1.o_proj", 6},   {"L1.mlp", 8},
      {"final_norm", 8}, {"logits", 8}};
  for (const auto& [stage, wire] : expect_uncorrelated) {
    EXPECT_DOUBLE_EQ(unmeasured.at(stage).wire_rms, wire) << stage;
    EXPECT_DOUBLE_EQ(unmeasured.at(stage).wire_tail, wire) << stage;
  }
  const WireRounding measured{{3.0, 5.0, 0.5, 1.0}, {2.0, 4.0, 1.5, 1.0}};
  const auto paths = stage_paths(c, 10, 4, nullptr, &measured);
  EXPECT_DOUBLE_EQ(paths.at("L0.o_proj").wire_rms, 4.0);
  EXPECT_DOUBLE_EQ(paths.at("L0.o_proj").wire_tail, 3.0);
  EXPECT_DOUBLE_EQ(paths.at("L0.mlp").wire_rms, 4.0 + 6.0);
  EXPECT_DOUBLE_EQ(paths.at("L0.mlp").wire_tail, 3.0 + 5.0);
  EXPECT_DOUBLE_EQ(paths.at("L1.mlp.partial").wire_rms, 10.0 + 1.5);
  EXPECT_DOUBLE_EQ(paths.at("logits").wire_rms, 10.0 + 1.5 + 2.0);
  EXPECT_DOUBLE_EQ(paths.at("logits").wire_tail, 8.0 + 2.5 + 2.0);
  // Everything else on the path is unchanged by the measurement.
  EXPECT_EQ(paths.at("logits").boundaries, unmeasured.at("logits").boundaries);
  const WireRounding short_by_one{{1.0}, {1.0}};
  EXPECT_THROW(stage_paths(c, 10, 4, nullptr, &short_by_one), HarnessError);
}

TEST(Tolerance, EachAttentionOnThePathCountsItsPartials) {
  // One per attention the stage's path crosses: none before layer 0's attention output, one from
  // it on, two from layer 1's; Qwen3-8B's logits cross its five.
  const auto one = stage_paths(hand_config(), 10, 4);
  for (const char* stage : {"ctx_proj", "embed", "L0.attn_norm", "L0.q", "L0.k", "L0.v"}) {
    EXPECT_EQ(one.at(stage).attention_partials, 0) << stage;
  }
  for (const char* stage : {"L0.attn", "L0.o_proj", "L0.o_proj.partial", "L0.mlp", "L0.out", "final_norm", "logits"}) {
    EXPECT_EQ(one.at(stage).attention_partials, 1) << stage;
  }
  DrafterConfig c = hand_config();
  c.num_layers = 2;
  c.target_layer_ids = {1, 2};
  const auto two = stage_paths(c, 10, 4);
  EXPECT_EQ(two.at("L1.attn_norm").attention_partials, 1);
  EXPECT_EQ(two.at("L1.attn").attention_partials, 2);
  EXPECT_EQ(two.at("logits").attention_partials, 2);
  EXPECT_EQ(stage_paths(make_config(qwen3_8b_geometry()), 16, 16).at("logits").attention_partials, 5);
}

// The roundings one side takes past the drafters' bf16 boundaries (a bf16 wire, bf16 attention
// partials), on a path of b = 36 boundaries (Qwen3-8B's logits): `mark` sets them on a side; n_rms
// and n_tail are the boundary counts they make. The estimate of a side counts them only when it
// has them, and a same-rounding-points pair when either side has them (in the norm and the tail).
void expect_counted_on_their_side(const StagePath& path, void (*mark)(ErrorModel&), double n_rms, double n_tail) {
  const double u = std::ldexp(1.0, -8), u32 = std::ldexp(1.0, -24);
  const ErrorModel plain = error_model(Precision::kBf16);
  ErrorModel marked = plain;
  mark(marked);
  EXPECT_NEAR(relative_error_estimate(plain, path), std::sqrt(36 * u * u + u32 * u32), 1e-15);
  EXPECT_NEAR(relative_error_estimate(marked, path), std::sqrt(n_rms * u * u + u32 * u32), 1e-15);
  TolerancePair pair = cross_pair(Precision::kBf16, "reference-bf16", Precision::kBf16, "cuda-bf16");
  const double a = 2.0 * kSafetyFactor * u32;  // accumulation 0: A = S·2·u_fp32
  const StageBound neither = stage_bound(pair, path, 4096);
  EXPECT_NEAR(neither.rel_rms, 2.0 * std::sqrt(36.0) * u + a, 1e-15);
  EXPECT_NEAR(neither.max_rel, 2.0 * 36.0 * u + a, 1e-15);
  for (const bool expected_side : {false, true}) {
    TolerancePair one = pair;
    mark(one.actual);
    if (expected_side) mark(one.expected);
    const StageBound bound = stage_bound(one, path, 4096);
    EXPECT_NEAR(bound.rel_rms, 2.0 * std::sqrt(n_rms) * u + a, 1e-15);
    EXPECT_NEAR(bound.max_rel, 2.0 * n_tail * u + a, 1e-15);
  }
}

TEST(Tolerance, OnlyASideWithBf16AttentionPartialsCountsThem) {
  // Five attentions: n = 36 + 5 in the norm and the tail.
  StagePath path = {0, 0, 0, 36, 0.0};
  path.attention_partials = 5;
  expect_counted_on_their_side(path, [](ErrorModel& m) { m.bf16_attention_partials = true; }, 41, 41);
  // With a bf16 wire as well (ten reductions, ρ = 1): both add.
  path.wire_rms = 20;
  path.wire_tail = 20;
  expect_counted_on_their_side(
      path, [](ErrorModel& m) { m.bf16_attention_partials = m.bf16_wire = true; }, 61, 61);
}

TEST(Tolerance, OnlyABfloatWireSideCountsTheWire) {
  // The example of §9.2, Qwen3-8B's logits with ρ = 1 (b = 36, ten reductions): 2·sqrt(36)·2^-8
  // becomes 2·sqrt(56)·2^-8 ≈ 0.0585; the tail counts 1 + ρ∞ per reduction.
  StagePath path = {0, 0, 0, 36, 0.0};
  path.wire_rms = 20;
  path.wire_tail = 30;
  expect_counted_on_their_side(path, [](ErrorModel& m) { m.bf16_wire = true; }, 56, 66);
  EXPECT_NEAR(2.0 * std::sqrt(56.0) * std::ldexp(1.0, -8), 0.0585, 5e-4);
  // The path counts of that example (EveryPair shows the wider bounds fail just past them).
  const StagePath qwen = stage_paths(make_config(qwen3_8b_geometry()), 16, 16).at("logits");
  EXPECT_EQ(qwen.boundaries, 36);
  EXPECT_DOUBLE_EQ(qwen.wire_rms, 20.0);
}

TEST(Tolerance, MeasuredQuantizationFollowsTheGemmsOnThePath) {
  WeightQuantization q;
  q.layers = {{0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07}};  // q, k, v, o, gate, up, down
  q.lm_head = 0.08;
  const auto paths = stage_paths(hand_config(), 10, 4, &q);
  auto sq = [](double x) { return x * x; };
  EXPECT_DOUBLE_EQ(paths.at("ctx_proj").quantization, 0.0);  // fc stays bf16
  EXPECT_DOUBLE_EQ(paths.at("L0.q").quantization, sq(0.01));
  EXPECT_DOUBLE_EQ(paths.at("L0.k").quantization, sq(0.02));
  EXPECT_DOUBLE_EQ(paths.at("L0.v").quantization, sq(0.03));
  const double attn = sq(0.01) + sq(0.02) + sq(0.03);
  EXPECT_DOUBLE_EQ(paths.at("L0.attn").quantization, attn);
  EXPECT_DOUBLE_EQ(paths.at("L0.o_proj").quantization, attn + sq(0.04));
  const double mlp = attn + sq(0.04) + sq(0.05) + sq(0.06) + sq(0.07);
  EXPECT_DOUBLE_EQ(paths.at("L0.mlp").quantization, mlp);
  EXPECT_DOUBLE_EQ(paths.at("logits").quantization, mlp + sq(0.08));
  WeightQuantization wrong;
  EXPECT_THROW(stage_paths(hand_config(), 10, 4, &wrong), HarnessError);
}

TEST(Tolerance, ActivationTermFollowsTheGemmsOnThePath) {
  // ε_a(K)² = 2^-8 + K·(2^-10/448)², by hand: a subnormal code is off by at most 2^-10 in code units.
  auto eps2 = [](double k) { return std::ldexp(1.0, -8) + k * std::pow(std::ldexp(1.0, -10) / 448.0, 2); };
  EXPECT_DOUBLE_EQ(std::pow(activation_quantization_error(96), 2), eps2(96));
  EXPECT_NEAR(activation_quantization_error(16384), 0.0625, 1e-6);  // the subnormal term is negligible
  // H 8, q_dim 8, I 16: q/k/v and gate/up read H-wide rows, o_proj q_dim, down I, the lm_head H.
  const auto paths = stage_paths(hand_config(), 10, 4);
  EXPECT_EQ(paths.at("ctx_proj").activation, 0.0);  // fc stays bf16
  EXPECT_EQ(paths.at("L0.attn_norm").activation, 0.0);
  EXPECT_DOUBLE_EQ(paths.at("L0.q").activation, eps2(8));
  EXPECT_DOUBLE_EQ(paths.at("L0.v").activation, eps2(8));
  EXPECT_DOUBLE_EQ(paths.at("L0.attn").activation, 3 * eps2(8));
  EXPECT_DOUBLE_EQ(paths.at("L0.o_proj").activation, 3 * eps2(8) + eps2(8));
  const double mlp = 4 * eps2(8) + 2 * eps2(8) + eps2(16);
  EXPECT_DOUBLE_EQ(paths.at("L0.mlp").activation, mlp);
  EXPECT_DOUBLE_EQ(paths.at("logits").activation, mlp + eps2(8));
  EXPECT_DOUBLE_EQ(context_kv_path(hand_config(), true).activation, eps2(8));
}

TEST(Tolerance, OnlyAW8a8SideCountsTheActivationTerm) {
  const StagePath path = {0, 1, 0, 3, 0.01, 0.004};
  const double u32 = std::ldexp(1.0, -24), bf16 = 3 * std::ldexp(1.0, -16);
  EXPECT_NEAR(relative_error_estimate(error_model(Precision::kW8a8), path), std::sqrt(bf16 + 0.01 + 0.004 + u32 * u32),
              1e-15);
  EXPECT_NEAR(relative_error_estimate(error_model(Precision::kFp8), path), std::sqrt(bf16 + 0.01 + u32 * u32), 1e-15);
  EXPECT_NEAR(relative_error_estimate(error_model(Precision::kBf16), path), std::sqrt(bf16 + u32 * u32), 1e-15);
  // The w8a8 envelope: the bf16 reference against a w8a8 drafter, weights and activations counted.
  const StageBound envelope = stage_bound(cross_pair(Precision::kBf16, "reference-bf16", Precision::kW8a8, "cuda-w8a8"),
                                          path, 64);
  EXPECT_NEAR(envelope.rel_rms, 2 * (std::sqrt(bf16 + u32 * u32) + std::sqrt(bf16 + 0.014 + u32 * u32)), 1e-15);
  // fp8 and w8a8 hold the same E4M3 weights: against each other the weight term cancels.
  const TolerancePair mixed = cross_pair(Precision::kFp8, "reference-fp8", Precision::kW8a8, "cuda-w8a8");
  EXPECT_TRUE(mixed.shared_quantized_weights);
  EXPECT_FALSE(mixed.same_rounding_points);
  EXPECT_NEAR(stage_bound(mixed, path, 64).estimate,
              std::sqrt(bf16 + u32 * u32) + std::sqrt(bf16 + 0.004 + u32 * u32), 1e-15);
}

TEST(Tolerance, W8a8IsNoFixturePrecision) {
  const std::string message = testing::harness_error_message([] { fixture_error_model("w8a8"); });
  testing::expect_mentions(message, "provenance.expect_precision");
  testing::expect_mentions(message, "w8a8");
}

TEST(Tolerance, WeightQuantizationErrorByHand) {
  // Row [1, 0.53]: scale 1/448; 0.53·448 = 237.44 rounds to the E4M3 value 240 (steps of 16 in
  // [128, 256)), decoded 240/448. Row [2, 0]: both exact. δ = |err| / ||W||_F.
  const Tensor w({2, 2}, {1.0f, 0.53f, 2.0f, 0.0f});
  const float scale = 1.0f / 448.0f;
  const double err = static_cast<double>(scale) * 240.0 - static_cast<double>(0.53f);
  const double norm2 = 1.0 + static_cast<double>(0.53f) * 0.53f + 4.0;
  EXPECT_NEAR(weight_quantization_error(w, 1), std::fabs(err) / std::sqrt(norm2), 1e-12);
  EXPECT_EQ(weight_quantization_error(Tensor({1, 3}, {448.0f, -2.0f, 0.0f}), 1), 0.0);
  EXPECT_EQ(weight_quantization_error(Tensor::zeros({2, 3}), 1), 0.0);
  // Blocks of rows over threads: the same number whatever the count.
  std::vector<float> many(600 * 8);
  for (size_t i = 0; i < many.size(); ++i) many[i] = std::sin(0.37 * static_cast<double>(i));
  const Tensor big({600, 8}, many);
  EXPECT_EQ(weight_quantization_error(big, 1), weight_quantization_error(big, 3));
}

TEST(Tolerance, DrafterSidesRoundAtTheirBoundariesFixturesAtEveryOp) {
  // 100 roundings in a PyTorch engine, 4 bf16 boundaries in a drafter.
  const StagePath path = {100, 0, 0, 4, 0.0};
  const double u32 = std::ldexp(1.0, -24);
  const StageBound drafter = stage_bound(cross_pair(Precision::kFp64, "reference-fp64", Precision::kBf16, "cuda-bf16"),
                                         path, 64);
  const double fp64_side = std::sqrt(100 * std::ldexp(1.0, -106) + u32 * u32);
  EXPECT_NEAR(drafter.estimate, fp64_side + std::sqrt(4 * std::ldexp(1.0, -16) + u32 * u32), 1e-15);
  const StageBound engine = stage_bound(fixture_pair("bf16", Precision::kFp64, "reference-fp64"), path, 64);
  EXPECT_NEAR(engine.estimate, std::sqrt(100 * std::ldexp(1.0, -16) + u32 * u32) + fp64_side, 1e-15);
}

TEST(Tolerance, SamePrecisionPairsUseTheBoundaryModel) {
  // n = 9 boundaries, K = 99: rel_rms = 2·3·2^-8 + 2·2·sqrt(100)·2^-24, max_rel = 2·9·2^-8 + the same.
  const StagePath path = {40, 6, 99, 9, 0.5};
  const double accumulation = 2 * 2 * 10 * std::ldexp(1.0, -24);
  for (Precision p : {Precision::kBf16, Precision::kFp8}) {
    const TolerancePair pair = cross_pair(p, "reference", p, "cuda");
    EXPECT_TRUE(pair.same_rounding_points);
    const StageBound b = stage_bound(pair, path, 4096);
    EXPECT_NEAR(b.rel_rms, 6 * std::ldexp(1.0, -8) + accumulation, 1e-15);
    EXPECT_NEAR(b.max_rel, 18 * std::ldexp(1.0, -8) + accumulation, 1e-15);
  }
  EXPECT_FALSE(cross_pair(Precision::kBf16, "r", Precision::kFp8, "c").same_rounding_points);
  EXPECT_FALSE(cross_pair(Precision::kFp64, "r", Precision::kFp64, "c").same_rounding_points);
  // w8a8: each of the 6 quantized input rows may flip codes by one E4M3 ulp: in the norm
  // 2·sqrt(9·2^-16 + 0.02), per element 2·(9·2^-8 + 6·2^-4).
  const StagePath w8a8_path = {40, 6, 99, 9, 0.5, 0.02};
  const TolerancePair w8a8 = cross_pair(Precision::kW8a8, "reference", Precision::kW8a8, "cuda");
  EXPECT_TRUE(w8a8.same_rounding_points);
  EXPECT_TRUE(w8a8.shared_quantized_weights);
  const StageBound b = stage_bound(w8a8, w8a8_path, 4096);
  EXPECT_NEAR(b.rel_rms, 2 * std::sqrt(9 * std::ldexp(1.0, -16) + 0.02) + accumulation, 1e-15);
  EXPECT_NEAR(b.max_rel, 2 * (9 * std::ldexp(1.0, -8) + 6 * std::ldexp(1.0, -4)) + accumulation, 1e-15);
  EXPECT_TRUE(b.rounding_bias);
  // The fp8 pair on the same path ignores the activation term.
  const StageBound fp8 = stage_bound(cross_pair(Precision::kFp8, "r", Precision::kFp8, "c"), w8a8_path, 4096);
  EXPECT_NEAR(fp8.rel_rms, 6 * std::ldexp(1.0, -8) + accumulation, 1e-15);
}

TEST(Tolerance, ContractBoundsForFp64AndFp32Expectations) {
  const StagePath path = {32, 8, 152, 9, 8 * 0x1p-8};
  const StageBound fp64 = stage_bound(fixture_pair("fp64", Precision::kFp64, "reference-fp64"), path, 64);
  EXPECT_DOUBLE_EQ(fp64.rel_rms, 1e-6);
  EXPECT_DOUBLE_EQ(fp64.max_rel, 1e-6);
  const StageBound fp32 = stage_bound(fixture_pair("fp32", Precision::kFp64, "reference-fp64"), path, 64);
  EXPECT_DOUBLE_EQ(fp32.rel_rms, 1e-4);
  EXPECT_DOUBLE_EQ(fp32.max_rel, 1e-4);
}

TEST(Tolerance, Bf16BoundByHand) {
  // Four bf16 roundings and nothing else: E_bf16 = sqrt(4·2^-16 + 2^-48) ~ 2^-7, E_fp64 ~ 2^-24;
  // bound = 2·(E_bf16 + E_fp64); tail = bound·sqrt(2·ln(2·64)).
  const StagePath path = {4, 0, 0, 0, 0.0};
  const StageBound b = stage_bound(fixture_pair("bf16", Precision::kFp64, "reference-fp64"), path, 64);
  const double e_bf16 = std::sqrt(4 * std::ldexp(1.0, -16) + std::ldexp(1.0, -48));
  const double e_fp64 = std::sqrt(4 * std::ldexp(1.0, -106) + std::ldexp(1.0, -48));
  EXPECT_NEAR(b.rel_rms, 2 * (e_bf16 + e_fp64), 1e-15);
  EXPECT_NEAR(b.rel_rms, 0.015625, 1e-6);
  EXPECT_NEAR(b.max_rel, b.rel_rms * std::sqrt(2 * std::log(128.0)), 1e-15);
}

TEST(Tolerance, SharedQuantizedWeightsCancelAndTheEnvelopeKeepsThem) {
  const StagePath one_fp8_gemm = {0, 1, 0, 0, std::ldexp(1.0, -8)};
  const StageBound tight = stage_bound(cross_pair(Precision::kFp8, "reference-fp8", Precision::kFp8, "cuda-fp8"),
                                       one_fp8_gemm, 64);
  const StageBound bf16 = stage_bound(cross_pair(Precision::kBf16, "reference-bf16", Precision::kBf16, "cuda-bf16"),
                                      one_fp8_gemm, 64);
  const StageBound envelope = stage_bound(
      cross_pair(Precision::kBf16, "reference-bf16", Precision::kFp8, "cuda-fp8"), one_fp8_gemm, 64);
  EXPECT_DOUBLE_EQ(tight.rel_rms, bf16.rel_rms);  // only the fp32 storage terms: 2·2·2^-24
  EXPECT_NEAR(tight.rel_rms, 4 * std::ldexp(1.0, -24), 1e-20);
  EXPECT_NEAR(envelope.rel_rms, 2 * (std::ldexp(1.0, -24) + std::sqrt(std::ldexp(1.0, -8) + std::ldexp(1.0, -48))),
              1e-15);  // ~ 2·2^-4: one E4M3 rounding of every weight
}

TEST(Tolerance, UnknownExpectPrecisionIsBadInputNamingTheField) {
  const std::string message = testing::harness_error_message([] { fixture_error_model("int4"); });
  testing::expect_mentions(message, "provenance.expect_precision");
  testing::expect_mentions(message, "int4");
}

// The float closest above 1 whose distance from 1 exceeds `bound`, and the farthest within it.
float just_past(double bound) {
  float a = static_cast<float>(1.0 + bound);
  while (static_cast<double>(a) - 1.0 <= bound) a = std::nextafter(a, std::numeric_limits<float>::infinity());
  while (static_cast<double>(std::nextafter(a, 0.0f)) - 1.0 > bound) a = std::nextafter(a, 0.0f);
  return a;
}
float just_inside(double bound) {
  float a = just_past(bound);
  return std::nextafter(a, 0.0f);
}

struct PairCase {
  const char* name;
  TolerancePair pair;
};

// A side that stores the attention's split partials as bf16 (the CUDA drafter).
TolerancePair with_bf16_partials(TolerancePair pair) {
  pair.actual.bf16_attention_partials = true;
  return pair;
}

// A tensor-parallel side that reduces on a bf16 wire (docs/spec/tensor-parallel.md §9.2).
TolerancePair on_bf16_wire(TolerancePair pair, bool expected_side) {
  pair.actual.bf16_wire = true;
  pair.expected.bf16_wire = expected_side;
  return pair;
}

class EveryPair : public ::testing::TestWithParam<int> {};

std::vector<PairCase> pair_cases() {
  return {
      {"fixture fp64 vs reference fp64", fixture_pair("fp64", Precision::kFp64, "reference-fp64")},
      {"fixture fp32 vs reference fp64", fixture_pair("fp32", Precision::kFp64, "reference-fp64")},
      {"fixture bf16 vs reference fp64", fixture_pair("bf16", Precision::kFp64, "reference-fp64")},
      {"fixture fp8 vs reference fp64", fixture_pair("fp8", Precision::kFp64, "reference-fp64")},
      {"reference bf16 vs cuda bf16", cross_pair(Precision::kBf16, "reference-bf16", Precision::kBf16, "cuda-bf16")},
      {"reference bf16 vs cuda bf16, bf16 attention partials",
       with_bf16_partials(cross_pair(Precision::kBf16, "reference-bf16", Precision::kBf16, "cuda-bf16"))},
      {"fixture fp64 vs cuda fp8, bf16 attention partials",
       with_bf16_partials(fixture_pair("fp64", Precision::kFp8, "cuda-fp8"))},
      {"reference fp8 vs cuda fp8", cross_pair(Precision::kFp8, "reference-fp8", Precision::kFp8, "cuda-fp8")},
      {"reference bf16 vs cuda fp8", cross_pair(Precision::kBf16, "reference-bf16", Precision::kFp8, "cuda-fp8")},
      {"fixture fp64 vs reference w8a8", fixture_pair("fp64", Precision::kW8a8, "reference-w8a8")},
      {"reference w8a8 vs cuda w8a8", cross_pair(Precision::kW8a8, "reference-w8a8", Precision::kW8a8, "cuda-w8a8")},
      {"reference bf16 vs cuda w8a8", cross_pair(Precision::kBf16, "reference-bf16", Precision::kW8a8, "cuda-w8a8")},
      {"fixture fp64 vs reference bf16, bf16 wire",
       on_bf16_wire(fixture_pair("fp64", Precision::kBf16, "reference-bf16"), false)},
      {"reference bf16 vs cuda bf16, both on a bf16 wire",
       on_bf16_wire(cross_pair(Precision::kBf16, "reference-bf16", Precision::kBf16, "cuda-bf16"), true)},
  };
}

// Paths of the pair tests: a short one without fp8 GEMMs, and a long one whose 8 fp8 GEMMs carry
// the a-priori weight term and the activation term of K = 64, whose two reductions a bf16 wire
// rounds with ρ = 1, and whose one attention a side may store bf16 partials of.
const StagePath kShortPath = {3, 0, 24, 2, 0.0, 0.0};
const StagePath kLongPath = {32, 8, 152, 9, 8 * 0x1p-8, 8 * 0x1p-8, 4.0, 4.0, 1};

constexpr int64_t kCols = 64;

TEST_P(EveryPair, NormCriterionFailsJustPastAndPassesInside) {
  const PairCase c = pair_cases()[GetParam()];
  for (const StagePath& path : {kShortPath, kLongPath}) {
    const StageBound bound = stage_bound(c.pair, path, kCols);
    const Tensor expected({2, kCols}, std::vector<float>(2 * kCols, 1.0f));
    // Every element of row 1 off by the same relative amount: rel RMS = max rel = that amount;
    // half of them up and half down (exact: 2 - a), so that the tight pairs' rounding-bias check
    // (a mean of zero) leaves the norm criterion alone at stake.
    Tensor past = expected, inside = expected;
    for (int64_t j = 0; j < kCols; ++j) {
      past.row(1)[j] = j % 2 ? 2.0f - just_past(bound.rel_rms) : just_past(bound.rel_rms);
      inside.row(1)[j] = j % 2 ? 2.0f - just_inside(bound.rel_rms) : just_inside(bound.rel_rms);
    }
    const StageCheck fail = check_stage("L0.q", 3, expected, past, bound);
    EXPECT_FALSE(fail.passed) << c.name;
    EXPECT_EQ(fail.fail_criterion, "rel-rms") << c.name;
    EXPECT_EQ(fail.fail_row, 1) << c.name;
    EXPECT_GT(fail.ratio, 1.0) << c.name;
    const StageCheck pass = check_stage("L0.q", 3, expected, inside, bound);
    EXPECT_TRUE(pass.passed) << c.name << ": rel RMS " << pass.metrics.max_row_rel_rms << " bound " << bound.rel_rms;
    EXPECT_LE(pass.ratio, 1.0) << c.name;
  }
}

TEST_P(EveryPair, TailCriterionFailsJustPastAndPassesInside) {
  const PairCase c = pair_cases()[GetParam()];
  const StageBound bound = stage_bound(c.pair, kLongPath, kCols);
  ASSERT_LT(bound.max_rel / bound.rel_rms, std::sqrt(static_cast<double>(kCols)))
      << "one spike must stay inside the norm bound for this test to isolate the tail criterion";
  const Tensor expected({1, kCols}, std::vector<float>(kCols, 1.0f));
  Tensor past = expected, inside = expected;
  past.row(0)[17] = just_past(bound.max_rel);
  inside.row(0)[17] = just_inside(bound.max_rel);
  const StageCheck fail = check_stage("logits", 24, expected, past, bound);
  EXPECT_FALSE(fail.passed) << c.name;
  EXPECT_EQ(fail.fail_criterion, "max-rel") << c.name;
  EXPECT_EQ(fail.fail_col, 17) << c.name;
  EXPECT_DOUBLE_EQ(fail.fail_expected, 1.0);
  EXPECT_DOUBLE_EQ(fail.fail_actual, past.row(0)[17]);
  EXPECT_TRUE(check_stage("logits", 24, expected, inside, bound).passed) << c.name;
}

TEST_P(EveryPair, NanAlwaysFails) {
  const PairCase c = pair_cases()[GetParam()];
  const StageBound bound = stage_bound(c.pair, kLongPath, kCols);
  const Tensor expected({1, kCols}, std::vector<float>(kCols, 1.0f));
  Tensor actual = expected;
  actual.row(0)[5] = std::numeric_limits<float>::quiet_NaN();
  const StageCheck check = check_stage("logits", 24, expected, actual, bound);
  EXPECT_FALSE(check.passed);
  EXPECT_EQ(check.fail_criterion, "non-finite");
  EXPECT_EQ(check.fail_col, 5);
  EXPECT_TRUE(std::isinf(check.ratio));
}

INSTANTIATE_TEST_SUITE_P(Pairs, EveryPair, ::testing::Range(0, static_cast<int>(pair_cases().size())));

TEST(Tolerance, ShapeFaultFails) {
  const StageBound bound = stage_bound(fixture_pair("bf16", Precision::kFp64, "r"), StagePath{3, 0, 24, 2, 0.0}, 4);
  const StageCheck check = check_stage("L0.k", 4, Tensor::zeros({2, 4}), Tensor::zeros({2, 8}), bound);
  EXPECT_FALSE(check.passed);
  EXPECT_FALSE(check.shape_ok);
  EXPECT_EQ(check.fail_criterion, "shape");
  EXPECT_NE(check.shape_detail.find("[2, 8]"), std::string::npos);
}

}  // namespace
}  // namespace dflash
