// Pre-quantized FP8 drafter checkpoints (core/fp8_checkpoint.h, docs/spec/fp8-checkpoints.md): what is
// exact, how the declarations match modules, every scheme loaded as fixtures/fp8_checkpoint_writer.h wrote
// it, and the bundled fixtures holding what their README says. The refusals are rows of the malformed
// table (tests/io/fp8_checkpoint_cases.cc).
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "core/fp8.h"
#include "core/fp8_checkpoint.h"
#include "fixtures/checkpoint_writer.h"
#include "fixtures/fixture.h"
#include "fixtures/fp8_checkpoint_writer.h"
#include "tests/io/io_test_util.h"

namespace dflash {
namespace {

using nlohmann::json;
using testing::TempDir;
namespace fs = std::filesystem;

bool is_nan_code(int code) { return (code & 0x7f) == 0x7f; }

// p = code · scale in fp64 is exact: the fma residual of the product is zero.
bool exact_in_double(double code, double scale) {
  const double p = code * scale;
  return std::fma(code, scale, -p) == 0.0;
}

bool exact_in_float(double code, float scale) {
  const double p = code * static_cast<double>(scale);
  return std::isfinite(static_cast<float>(p)) && static_cast<double>(static_cast<float>(p)) == p;
}

// BF16 scales: at most 8 + 4 significant bits and a lowest bit >= 2^-142, so every product is a float
// unless it overflows (scale > FLT_MAX / 448, which loading refuses).
TEST(Fp8Checkpoint, EveryCodeTimesEveryBf16ScaleIsAFloatShortOfOverflow) {
  int64_t checked = 0, inexact = 0, overflow = 0;
  for (uint32_t bits = 1; bits < 0x7f80; ++bits) {
    const float scale = bf16_bits_to_float(static_cast<uint16_t>(bits));
    for (int code = 0; code < 256; ++code) {
      if (is_nan_code(code)) continue;
      const double c = e4m3_to_float(static_cast<uint8_t>(code));
      ++checked;
      if (!std::isfinite(static_cast<float>(c * scale))) {
        overflow += 1;
        EXPECT_GT(scale, FLT_MAX / 448.0f);
        continue;
      }
      inexact += !exact_in_float(c, scale);
    }
  }
  EXPECT_EQ(inexact, 0) << "of " << checked;
  EXPECT_GT(overflow, 0);
}

// F16 scales: at most 11 + 4 bits, the lowest >= 2^-33, the largest product 65504 · 448: always a float.
TEST(Fp8Checkpoint, EveryCodeTimesEveryF16ScaleIsAFloat) {
  int64_t inexact = 0;
  for (uint32_t bits = 1; bits < 0x7c00; ++bits) {
    const float scale = f16_bits_to_float(static_cast<uint16_t>(bits));
    for (int code = 0; code < 256; ++code) {
      if (!is_nan_code(code)) inexact += !exact_in_float(e4m3_to_float(static_cast<uint8_t>(code)), scale);
    }
  }
  EXPECT_EQ(inexact, 0);
}

// F32 scales: up to 24 + 4 bits. Exact in fp64 always; in fp32 for a scale of at most 20 significant bits
// (>= 2^-117), and otherwise not in general (amax / 448 in fp32 is such a scale).
TEST(Fp8Checkpoint, F32ScaledCodesAreExactInDoubleNotAlwaysInFloat) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<uint32_t> any_bits(1, 0x7f7fffff);
  int64_t double_inexact = 0, float_inexact = 0, short_inexact = 0;
  for (int i = 0; i < 20000; ++i) {
    uint32_t bits = any_bits(rng);
    float scale, short_scale;
    std::memcpy(&scale, &bits, 4);
    bits &= ~0xfu;  // 20 significant bits
    std::memcpy(&short_scale, &bits, 4);
    for (int code = 0; code < 256; ++code) {
      if (is_nan_code(code)) continue;
      const double c = e4m3_to_float(static_cast<uint8_t>(code));
      double_inexact += !exact_in_double(c, scale);
      if (scale < FLT_MAX / 448.0f) float_inexact += !exact_in_float(c, scale);
      if (short_scale >= 0x1p-117f && short_scale < FLT_MAX / 448.0f) short_inexact += !exact_in_float(c, short_scale);
    }
  }
  EXPECT_EQ(double_inexact, 0);
  EXPECT_EQ(short_inexact, 0);
  EXPECT_GT(float_inexact, 0);
  const float one_over_448 = 1.0f / 448.0f;
  bool some_code_inexact = false;
  for (int code = 0; code < 256; ++code) {
    if (!is_nan_code(code)) some_code_inexact |= !exact_in_float(e4m3_to_float(static_cast<uint8_t>(code)), one_over_448);
  }
  EXPECT_TRUE(some_code_inexact);
}

// ---- declarations ----

json ct_scheme(json targets) {
  const json weights = {{"num_bits", 8}, {"type", "float"}, {"strategy", "channel"}, {"symmetric", true}, {"dynamic", false}};
  return {{"targets", std::move(targets)}, {"weights", weights}};
}

json ct_config(json targets, json ignore) {
  return {{"quant_method", "compressed-tensors"},
          {"format", "float-quantized"},
          {"config_groups", {{"group_0", ct_scheme(std::move(targets))}}},
          {"ignore", std::move(ignore)}};
}

bool quantized(const Fp8Declaration& d, const std::string& module) { return d.scheme_of(module).quantized; }

TEST(Fp8Checkpoint, CompressedTensorsPatternsMatchAsVllmDoes) {
  // "re:" is anchored at the start (Python's re.match), not at the end.
  const Fp8Declaration anchored = fp8_declaration_from_quantization_config(ct_config({"re:self_attn"}, json::array()), "qc");
  EXPECT_FALSE(quantized(anchored, "layers.0.self_attn.q_proj"));
  const Fp8Declaration prefix = fp8_declaration_from_quantization_config(ct_config({"re:.*self_attn"}, json::array()), "qc");
  EXPECT_TRUE(quantized(prefix, "layers.0.self_attn.q_proj"));
  EXPECT_FALSE(quantized(prefix, "layers.0.mlp.up_proj"));
  // A class target: contained in "Linear", case aside.
  const Fp8Declaration linear = fp8_declaration_from_quantization_config(ct_config({"linear"}, {"fc"}), "qc");
  EXPECT_TRUE(quantized(linear, "layers.1.mlp.down_proj"));
  EXPECT_FALSE(quantized(linear, "fc"));
  EXPECT_NE(linear.scheme_of("fc").why.find("ignore pattern 'fc'"), std::string::npos) << linear.scheme_of("fc").why;
  // Names match with or without the "model." prefix.
  const Fp8Declaration named = fp8_declaration_from_quantization_config(
      ct_config({"Linear"}, {"model.layers.0.mlp.up_proj", "re:.*down_proj$"}), "qc");
  EXPECT_FALSE(quantized(named, "layers.0.mlp.up_proj"));
  EXPECT_FALSE(quantized(named, "model.layers.3.mlp.down_proj"));
  EXPECT_TRUE(quantized(named, "model.layers.0.mlp.gate_proj"));
  const Fp8ModuleScheme s = named.scheme_of("layers.0.mlp.gate_proj");
  EXPECT_TRUE(s.per_channel);
  EXPECT_EQ(s.activation, Fp8Activation::kNone);  // no input_activations: weight-only
}

// Patterns are matched in time linear in the name: a pattern that backtracks exponentially elsewhere
// decides at once here (a hang would time the test out).
TEST(Fp8Checkpoint, PatternsMatchWithoutBacktracking) {
  const std::string name = "layers.0." + std::string(60, 'a');
  const Fp8Declaration ct =
      fp8_declaration_from_quantization_config(ct_config({"Linear"}, {"re:layers\\.0\\.(a|a)*(a|a)*c"}), "qc");
  EXPECT_TRUE(quantized(ct, name));
  const json mo = {{"quant_method", "modelopt"}, {"quant_algo", "FP8"}, {"ignore", {"*a*a*a*a*a*a*a*a*a*a*a*a*c"}}};
  EXPECT_TRUE(quantized(fp8_declaration_from_quantization_config(mo, "qc"), name));
}

TEST(Fp8Checkpoint, ModelOptWildcardsAndAlgorithms) {
  const json qc = {{"quant_method", "modelopt"}, {"quant_algo", "fp8"}, {"ignore", {"lm_head", "fc", "*.mlp.up_*"}}};
  const Fp8Declaration d = fp8_declaration_from_quantization_config(qc, "qc");
  EXPECT_EQ(d.layout, Fp8Layout::kModelOpt);
  EXPECT_FALSE(quantized(d, "fc"));
  EXPECT_FALSE(quantized(d, "layers.2.mlp.up_proj"));
  // fnmatch's '?', classes and negated classes.
  const json classes = {{"quant_method", "modelopt"},
                        {"quant_algo", "FP8"},
                        {"ignore", {"layers.?.self_attn.[qk]_proj", "layers.1[!0-9].mlp.*"}}};
  const Fp8Declaration c = fp8_declaration_from_quantization_config(classes, "qc");
  EXPECT_FALSE(quantized(c, "layers.3.self_attn.k_proj"));
  EXPECT_TRUE(quantized(c, "layers.3.self_attn.v_proj"));
  EXPECT_TRUE(quantized(c, "layers.13.self_attn.q_proj"));
  EXPECT_TRUE(quantized(c, "layers.12.mlp.up_proj"));
  EXPECT_FALSE(quantized(c, "layers.1x.mlp.up_proj"));
  const Fp8ModuleScheme q = d.scheme_of("layers.2.self_attn.q_proj");
  EXPECT_TRUE(q.quantized);
  EXPECT_FALSE(q.per_channel);
  EXPECT_EQ(q.activation, Fp8Activation::kStaticPerTensor);
  const json pc = {{"quantization", {{"quant_algo", "FP8_PER_CHANNEL_PER_TOKEN"}, {"exclude_modules", {"lm_head"}}}}};
  const Fp8ModuleScheme p = fp8_declaration_from_hf_quant_config(pc, "hf").scheme_of("fc");
  EXPECT_TRUE(p.quantized && p.per_channel);
  EXPECT_EQ(p.activation, Fp8Activation::kDynamicPerToken);
  EXPECT_BAD_INPUT(fp8_declaration_from_quantization_config(
                       {{"quant_method", "modelopt"}, {"quant_algo", "FP8"}, {"ignore", {"fc"}}, {"exclude_modules", {"lm_head"}}},
                       "qc"),
                   "qc: 'ignore' and 'exclude_modules' list different modules");
  EXPECT_BAD_INPUT(fp8_declaration_from_quantization_config({{"quant_method", "fp8"}, {"activation_scheme", "dynamic"}}, "qc"),
                   "qc.quant_method is 'fp8'; a quantized drafter is read as FP8 in the 'compressed-tensors' or 'modelopt'");
}

// config.json and hf_quant_config.json: either alone declares; both must agree; neither is no declaration.
TEST(Fp8Checkpoint, DrafterDirectoryDeclarations) {
  TempDir tmp;
  auto write = [](const fs::path& path, const json& j) { std::ofstream(path) << j.dump(1); };
  const json qc = {{"quant_method", "modelopt"}, {"quant_algo", "FP8"}, {"kv_cache_quant_algo", nullptr}, {"ignore", {"fc"}}};
  const json hf = {{"producer", {{"name", "modelopt"}}},
                   {"quantization", {{"quant_algo", "FP8"}, {"kv_cache_quant_algo", nullptr}, {"exclude_modules", {"fc"}}}}};
  const fs::path dir = tmp.path();
  write(dir / "config.json", {{"hidden_size", 8}});
  EXPECT_FALSE(read_drafter_fp8_declaration(dir.string()).has_value());
  write(dir / "hf_quant_config.json", hf);
  ASSERT_TRUE(read_drafter_fp8_declaration(dir.string()).has_value());
  write(dir / "config.json", {{"hidden_size", 8}, {"quantization_config", qc}});
  const auto both = read_drafter_fp8_declaration(dir.string());
  ASSERT_TRUE(both.has_value());
  EXPECT_NE(both->source.find("config.json: quantization_config"), std::string::npos);
  json other = hf;
  other["quantization"]["exclude_modules"] = {"fc", "lm_head"};
  write(dir / "hf_quant_config.json", other);
  EXPECT_BAD_INPUT(read_drafter_fp8_declaration(dir.string()), "declare different quantization");
  EXPECT_FALSE(read_drafter_fp8_declaration((dir / "config.json").string()).has_value());  // a file has none
}

// ---- loading ----

// The seven projections of a layer with their stored codes.
std::vector<std::pair<const Tensor*, const std::optional<Fp8Stored>*>> projections(const LayerWeights& L) {
  return {{&L.q_proj, &L.q_proj_fp8},     {&L.k_proj, &L.k_proj_fp8},   {&L.v_proj, &L.v_proj_fp8},
          {&L.o_proj, &L.o_proj_fp8},     {&L.gate_proj, &L.gate_proj_fp8}, {&L.up_proj, &L.up_proj_fp8},
          {&L.down_proj, &L.down_proj_fp8}};
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape == b.shape && a.values.size() == b.values.size() &&
         std::memcmp(a.values.data(), b.values.data(), a.values.size() * sizeof(float)) == 0;
}

// Every scheme, with and without biases: the loader gives back the writer's codes, scales, input scales
// and float weights bit for bit (the writer's dequantizer is its own).
TEST(Fp8Checkpoint, EverySchemeLoadsAsItWasWritten) {
  for (const bool bias : {false, true}) {
    for (const std::string& scheme : fp8_checkpoint_scheme_names()) {
      SCOPED_TRACE(scheme + (bias ? " with biases" : ""));
      const json config_json = testing::small_config(bias);
      const DrafterConfig c = parse_drafter_config(config_json, "small");
      const DrafterWeights made = quantize_fp8_checkpoint(c, testing::make_weights(c), scheme, 7);
      TempDir tmp;
      write_fp8_drafter_checkpoint(tmp / "drafter", config_json, made, scheme);
      write_target_file(tmp / "target.safetensors", made);
      TargetSource target;
      target.path = tmp / "target.safetensors";
      const DrafterWeights loaded = load_drafter_weights(c, tmp / "drafter", target);
      const auto made_list = drafter_tensor_list(c, made), loaded_list = drafter_tensor_list(c, loaded);
      for (size_t i = 0; i < made_list.size(); ++i) {
        EXPECT_TRUE(same_bits(*made_list[i].tensor, *loaded_list[i].tensor)) << made_list[i].name;
      }
      int quantized = 0;
      for (size_t l = 0; l < made.layers.size(); ++l) {
        const auto a = projections(made.layers[l]), b = projections(loaded.layers[l]);
        for (size_t p = 0; p < a.size(); ++p) {
          ASSERT_EQ(a[p].second->has_value(), b[p].second->has_value()) << "layer " << l << " projection " << p;
          if (!a[p].second->has_value()) continue;
          ++quantized;
          const Fp8Stored &x = **a[p].second, &y = **b[p].second;
          EXPECT_EQ(x.rows, y.rows);
          EXPECT_EQ(x.cols, y.cols);
          EXPECT_EQ(x.codes, y.codes);
          EXPECT_EQ(x.scales, y.scales);
          EXPECT_EQ(x.per_tensor_scale, y.per_tensor_scale);
          EXPECT_EQ(x.activation, y.activation);
          EXPECT_EQ(x.input_scale, y.input_scale);
        }
      }
      EXPECT_EQ(quantized, scheme == "modelopt-per-channel" ? 14 : 13);
    }
  }
}

// The bundled fixtures hold what fixtures/fp8ckpt/README.md says: which projections are stored how, and
// the ModelOpt one has products only fp64 holds (so its fp64 expectation runs on the stored codes).
TEST(Fp8Checkpoint, BundledFixtures) {
  struct Expected {
    const char* name;
    int quantized;
    bool some_inexact_in_float;
  };
  for (const Expected& e : {Expected{"ct-gqa", 13, false}, Expected{"modelopt-mha", 6, true}}) {
    SCOPED_TRACE(e.name);
    Fixture f = read_fixture(testing::source_dir() + "/fixtures/fp8ckpt/" + e.name);
    const DrafterWeights& w = f.load_weights();
    int quantized = 0;
    bool inexact = false;
    for (size_t l = 0; l < w.layers.size(); ++l) {
      const auto list = projections(w.layers[l]);
      for (size_t p = 0; p < list.size(); ++p) {
        const std::optional<Fp8Stored>& s = *list[p].second;
        const bool attention = p < 4;
        if (std::string(e.name) == "ct-gqa") {
          ASSERT_EQ(s.has_value(), !(l == 1 && p == 6)) << "layer " << l << " projection " << p;
          if (!s) continue;
          EXPECT_EQ(s->per_tensor_scale, !attention);
          EXPECT_EQ(s->activation, attention ? Fp8Activation::kDynamicPerToken : Fp8Activation::kStaticPerTensor);
        } else {
          ASSERT_EQ(s.has_value(), p != 5) << "projection " << p;
          if (!s) continue;
          EXPECT_TRUE(s->per_tensor_scale);
          EXPECT_EQ(s->activation, Fp8Activation::kStaticPerTensor);
        }
        EXPECT_EQ(s->input_scale.has_value(), s->activation == Fp8Activation::kStaticPerTensor);
        ++quantized;
        inexact |= !fp8_dequantized_exactly_in_float(*s);
      }
    }
    EXPECT_EQ(quantized, e.quantized);
    EXPECT_EQ(inexact, e.some_inexact_in_float);
  }
}

}  // namespace
}  // namespace dflash
