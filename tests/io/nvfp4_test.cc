// The NVFP4 head (core/nvfp4.h, docs/spec/nvfp4-lm-head.md): the E2M1 table and nibble order
// against the contract's own table, exact dequantization, the declarations a config can make, and
// loading from a real target directory (config.json, hf_quant_config.json, sharded). The refusals
// are rows of the shared malformed-input table (malformed_cases.cc, "nvfp4-*").
#include "core/nvfp4.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fp8.h"
#include "core/weights.h"
#include "fixtures/fixture.h"
#include "tests/io/io_test_util.h"

namespace dflash {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::TempDir;

// docs/spec/nvfp4-lm-head.md §4, typed in from the table (not computed).
TEST(Nvfp4, E2M1TableMatchesTheContract) {
  const float expected[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  for (uint8_t code = 0; code < 16; ++code) EXPECT_EQ(e2m1_to_float(code), expected[code]) << int(code);
  EXPECT_TRUE(std::signbit(e2m1_to_float(8)));  // -0 dequantizes to 0
}

// One row of 32 columns: byte 0x1F holds element 0 = code 0xF (-6) in the low nibble and element
// 1 = code 0x1 (0.5) in the high one; block 0's scale 0x38 (1.0), block 1's 0x01 (2^-9, subnormal).
TEST(Nvfp4, NibbleOrderScalesAndGlobalScaleMultiply) {
  NvFp4Weight w;
  w.rows = 1;
  w.cols = 32;
  w.codes.assign(16, 0);
  w.codes[0] = 0x1F;
  w.codes[8] = 0x70;  // element 16 = code 0 (0), element 17 = code 7 (6)
  w.block_scales = {0x38, 0x01};
  w.global_scale = 0.25f;
  std::vector<float> scaled(32);
  std::vector<double> exact(32);
  nvfp4_block_scaled_row(w, 0, scaled.data());
  nvfp4_dequantized_row(w, 0, exact.data());
  EXPECT_EQ(scaled[0], -6.0f);
  EXPECT_EQ(scaled[1], 0.5f);
  EXPECT_EQ(scaled[16], 0.0f);
  EXPECT_EQ(scaled[17], 6.0f * std::ldexp(1.0f, -9));
  EXPECT_EQ(exact[0], -1.5);   // multiplied by weight_scale_2, never divided
  EXPECT_EQ(exact[17], 6.0 * std::ldexp(1.0, -9) * 0.25);
  EXPECT_NO_THROW(validate_nvfp4_head(w, 1, 32, "test"));
  EXPECT_BAD_INPUT(validate_nvfp4_head(w, 1, 40, "test"), "test: hidden size 40 is not a multiple of 16");
  w.global_scale = INFINITY;
  EXPECT_BAD_INPUT(validate_nvfp4_head(w, 1, 32, "test"), "test: weight_scale_2 inf must be finite and > 0");
}

// The fixture's head: exact in double means e2m1·e4m3 (float) times weight_scale_2 equals the
// double row to the last bit, for every row.
TEST(Nvfp4, DequantizationIsExactInDouble) {
  Fixture f = read_fixture(testing::oracle_dir("nvfp4-tiny-gqa"));
  const DrafterWeights& w = f.load_weights();
  ASSERT_TRUE(w.nvfp4_head());
  EXPECT_TRUE(w.lm_head.values.empty());
  const NvFp4Weight& q = w.lm_head_nvfp4;
  EXPECT_EQ(q.rows, 500);
  EXPECT_EQ(q.cols, 96);
  ASSERT_TRUE(q.input_scale.has_value());
  std::vector<float> scaled(q.cols);
  std::vector<double> exact(q.cols);
  int codes_seen = 0;
  std::vector<bool> seen(16, false);
  for (int64_t n = 0; n < q.rows; ++n) {
    nvfp4_block_scaled_row(q, n, scaled.data());
    nvfp4_dequantized_row(q, n, exact.data());
    for (int64_t k = 0; k < q.cols; ++k) {
      ASSERT_EQ(static_cast<double>(scaled[k]) * q.global_scale, exact[k]) << n << "," << k;
      const uint8_t code = (q.codes[n * 48 + k / 2] >> (4 * (k % 2))) & 0xF;
      if (!seen[code]) ++codes_seen;
      seen[code] = true;
    }
  }
  EXPECT_EQ(codes_seen, 16);  // the fixture's provenance: every code occurs
}

TEST(Nvfp4, Declarations) {
  const std::string where = "config.json: quantization_config";
  EXPECT_TRUE(declaration_from_quantization_config(
                  {{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}, {"group_size", 16}, {"ignore", json::array()}}, where)
                  .nvfp4);
  for (const char* algo : {"W4A16_NVFP4", "NVFP4_W4A16"}) {
    EXPECT_TRUE(declaration_from_quantization_config({{"quant_method", "modelopt"}, {"quant_algo", algo}}, where).nvfp4);
  }
  const auto excluded = declaration_from_quantization_config(
      {{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}, {"ignore", {"model.layers.0*", "*lm_head"}}}, where);
  EXPECT_FALSE(excluded.nvfp4);
  EXPECT_EQ(excluded.source, where + ".ignore (pattern '*lm_head')");
  EXPECT_FALSE(declaration_from_quantization_config({{"quant_method", "modelopt"}, {"quant_algo", "FP8"}}, where).nvfp4);
  EXPECT_FALSE(declaration_from_quantization_config({{"quant_method", "compressed-tensors"}}, where).nvfp4);
  const json mixed = {{"quant_method", "modelopt"},
                      {"quant_algo", "MIXED_PRECISION"},
                      {"quantized_layers", {{"lm_head", {{"quant_algo", "W4A16_NVFP4"}, {"group_size", 16}}}}}};
  EXPECT_TRUE(declaration_from_quantization_config(mixed, where).nvfp4);
  json mixed32 = mixed;
  mixed32["quantized_layers"]["lm_head"]["group_size"] = 32;
  EXPECT_BAD_INPUT(declaration_from_quantization_config(mixed32, where),
                   "config.json: quantization_config.quantized_layers.lm_head.group_size is 32; NVFP4 blocks are 16");
  const json groups = {{"quant_method", "modelopt"},
                       {"quant_algo", "NVFP4"},
                       {"config_groups", {{"group_0", {{"weights", {{"num_bits", 4}, {"group_size", 32}}}}}}}};
  EXPECT_BAD_INPUT(declaration_from_quantization_config(groups, where),
                   "quantization_config.config_groups.group_0.weights.group_size is 32");
  EXPECT_BAD_INPUT(declaration_from_quantization_config({{"quant_method", "modelopt"}}, where),
                   "config.json: quantization_config: missing key 'quant_algo'");

  const json legacy = {{"producer", {{"name", "modelopt"}}},
                       {"quantization",
                        {{"quant_algo", "NVFP4"}, {"group_size", 16}, {"kv_cache_quant_algo", nullptr}, {"exclude_modules", json::array()}}}};
  EXPECT_TRUE(declaration_from_hf_quant_config(legacy, "hf_quant_config.json").nvfp4);
  for (const char* key : {"group_size", "kv_cache_quant_algo", "exclude_modules"}) {
    json missing = legacy;
    missing["quantization"].erase(key);
    EXPECT_BAD_INPUT(declaration_from_hf_quant_config(missing, "hf_quant_config.json"),
                     std::string("hf_quant_config.json: quantization: missing key '") + key + "'");
  }
  json excluded_legacy = legacy;
  excluded_legacy["quantization"]["exclude_modules"] = {"lm_head"};
  EXPECT_FALSE(declaration_from_hf_quant_config(excluded_legacy, "hf_quant_config.json").nvfp4);
}

// A real target directory: the fixture's target.safetensors with the declaration in config.json
// (quantization_config) or hf_quant_config.json, as one file or as a sharded index; the head
// loaded from it is byte for byte the fixture's.
TEST(Nvfp4, LoadsFromTargetDirectories) {
  Fixture f = read_fixture(testing::oracle_dir("nvfp4-tiny-gqa"));
  const DrafterWeights& from_fixture = f.load_weights();
  TempDir tmp;
  auto write = [](const std::string& path, const json& j) { std::ofstream(path) << j.dump(1); };
  const json config_qc = {{"tie_word_embeddings", false},
                          {"quantization_config",
                           {{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}, {"group_size", 16}, {"ignore", json::array()}}}};
  const json hf_quant = {{"producer", {{"name", "modelopt"}}},
                         {"quantization",
                          {{"quant_algo", "W4A16_NVFP4"}, {"group_size", 16}, {"kv_cache_quant_algo", nullptr}, {"exclude_modules", json::array()}}}};
  struct Layout {
    const char* name;
    bool sharded, config_json, hf_quant_config;
  };
  for (const Layout& layout : {Layout{"config", false, true, false}, Layout{"hf-quant", true, false, true},
                               Layout{"both", true, true, true}}) {
    SCOPED_TRACE(layout.name);
    const fs::path dir = fs::path(tmp.path()) / layout.name;
    fs::create_directories(dir);
    const std::string file = layout.sharded ? "model-00001-of-00001.safetensors" : "model.safetensors";
    fs::copy_file(f.target.path, dir / file);
    if (layout.sharded) {
      json map = json::object();
      for (const char* t : {"embed_tokens.weight", "lm_head.weight", "lm_head.weight_scale", "lm_head.weight_scale_2",
                            "lm_head.input_scale"}) {
        map[t] = file;
      }
      write((dir / "model.safetensors.index.json").string(), {{"weight_map", map}});
    }
    if (layout.config_json) write((dir / "config.json").string(), config_qc);
    if (layout.hf_quant_config) write((dir / "hf_quant_config.json").string(), hf_quant);
    TargetSource target;
    target.path = dir.string();
    const DrafterWeights w = load_drafter_weights(f.config, f.drafter_dir, target);
    ASSERT_TRUE(w.nvfp4_head());
    EXPECT_EQ(w.lm_head_nvfp4.codes, from_fixture.lm_head_nvfp4.codes);
    EXPECT_EQ(w.lm_head_nvfp4.block_scales, from_fixture.lm_head_nvfp4.block_scales);
    EXPECT_EQ(w.lm_head_nvfp4.global_scale, from_fixture.lm_head_nvfp4.global_scale);
  }
  // The two carriers disagree: refused, naming both.
  const fs::path dir = fs::path(tmp.path()) / "both";
  json excluded = hf_quant;
  excluded["quantization"]["exclude_modules"] = {"lm_head"};
  write((dir / "hf_quant_config.json").string(), excluded);
  TargetSource target;
  target.path = dir.string();
  EXPECT_BAD_INPUT(load_drafter_weights(f.config, f.drafter_dir, target),
                   "hf_quant_config.json: quantization.exclude_modules (pattern 'lm_head') disagree on whether the "
                   "lm_head is NVFP4");
}

}  // namespace
}  // namespace dflash
