// config.json parsing (docs/spec/drafter.md §1): the oracle configs, Hugging Face defaults, RoPE forms,
// target layer derivation, and every refusal by the key it names.
#include "core/config.h"

#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tests/io/io_test_util.h"

namespace dflash {
namespace {

using nlohmann::json;
using testing::oracle_dir;

// The smallest config that parses: everything else takes its default.
json minimal_config() {
  return json{{"block_size", 16}, {"dflash_config", {{"mask_token_id", 5}, {"target_layer_ids", {1, 9}}}}};
}

DrafterConfig parse(const json& config) { return parse_drafter_config(config, "test/config.json"); }

TEST(Config, OracleConfigsParse) {
  // Values as written in each fixture's drafter/config.json.
  const DrafterConfig gqa = load_drafter_config(oracle_dir("tiny-gqa") + "/drafter");
  EXPECT_EQ(gqa.hidden_size, 96);
  EXPECT_EQ(gqa.num_layers, 2);
  EXPECT_EQ(gqa.num_heads, 6);
  EXPECT_EQ(gqa.num_kv_heads, 2);
  EXPECT_EQ(gqa.head_dim, 16);
  EXPECT_EQ(gqa.intermediate_size, 192);
  EXPECT_EQ(gqa.vocab_size, 500);
  EXPECT_EQ(gqa.rms_norm_eps, 1e-6);
  EXPECT_EQ(gqa.rope.type, RopeConfig::Type::kDefault);
  EXPECT_EQ(gqa.rope.theta, 1000000.0);
  EXPECT_EQ(gqa.block_size, 8);
  EXPECT_EQ(gqa.target_layer_ids, (std::vector<int>{1, 4, 8}));
  EXPECT_EQ(gqa.mask_token_id, 3);
  EXPECT_EQ(gqa.target_hidden_size, 96);
  EXPECT_EQ(gqa.ctx_feature_dim(), 3 * 96);
  EXPECT_EQ(gqa.max_position_embeddings, 40960);
  EXPECT_FALSE(gqa.attention_bias);
  EXPECT_FALSE(gqa.tie_word_embeddings);

  const DrafterConfig bias = load_drafter_config(oracle_dir("bias-mqa-eps") + "/drafter/config.json");
  EXPECT_TRUE(bias.attention_bias);
  EXPECT_EQ(bias.num_kv_heads, 1);
  EXPECT_EQ(bias.head_dim, 32);
  EXPECT_EQ(bias.q_dim(), 128);  // nh·d != H = 80
  EXPECT_EQ(bias.rms_norm_eps, 1e-5);
  EXPECT_EQ(bias.rope.theta, 150000.0);
  EXPECT_EQ(bias.mask_token_id, 699);

  const DrafterConfig yarn = load_drafter_config(oracle_dir("yarn") + "/drafter");
  EXPECT_EQ(yarn.rope.type, RopeConfig::Type::kYarn);
  EXPECT_EQ(yarn.rope.theta, 10000.0);
  EXPECT_EQ(yarn.rope.factor, 4.0);
  EXPECT_EQ(yarn.rope.original_max_position_embeddings, 64);
  EXPECT_EQ(yarn.rope.beta_fast, 32.0);
  EXPECT_EQ(yarn.rope.beta_slow, 1.0);
  EXPECT_TRUE(yarn.rope.truncate);
  EXPECT_FALSE(yarn.rope.has_attention_factor);
  EXPECT_EQ(yarn.max_position_embeddings, 256);
}

TEST(Config, DerivedLayerIdsMatchTheOracle) {
  // derived-layer-ids: L = 3 drafter layers, num_target_layers T = 20, no target_layer_ids. Its
  // fc.weight is [48, 144] = [H, nT·Ht] with Ht = H = 48, so upstream captured nT = 3 layers.
  const DrafterConfig c = load_drafter_config(oracle_dir("derived-layer-ids") + "/drafter");
  EXPECT_EQ(c.num_layers, 3);
  EXPECT_EQ(c.target_layer_ids, (std::vector<int>{1, 9, 17}));  // start 1, end T-3 = 17, evenly spaced
  EXPECT_EQ(c.ctx_feature_dim(), 144);
}

TEST(Config, DeriveTargetLayerIds) {
  // Published drafters (docs/spec/drafter.md §8): Qwen3-8B (36 target layers, 5 drafter layers) and the
  // gpt-oss-20b spacing (24 target layers, 5 ids).
  EXPECT_EQ(derive_target_layer_ids(5, 36), (std::vector<int>{1, 9, 17, 25, 33}));
  EXPECT_EQ(derive_target_layer_ids(5, 24), (std::vector<int>{1, 6, 11, 16, 21}));
  // One drafter layer: T // 2.
  EXPECT_EQ(derive_target_layer_ids(1, 36), std::vector<int>{18});
  EXPECT_EQ(derive_target_layer_ids(1, 7), std::vector<int>{3});
  // Python's round is half to even: T = 6, L = 5 gives 1 + i·0.5 = 1, 1.5, 2, 2.5, 3 -> 1, 2, 2, 2, 3
  // (half-up rounding would give 1, 2, 2, 3, 3).
  EXPECT_EQ(derive_target_layer_ids(5, 6), (std::vector<int>{1, 2, 2, 2, 3}));
  EXPECT_BAD_INPUT(derive_target_layer_ids(0, 36), "at least one layer");
}

TEST(Config, HuggingFaceDefaultsForMissingKeys) {
  const DrafterConfig c = parse(minimal_config());
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.intermediate_size, 22016);
  EXPECT_EQ(c.num_layers, 32);
  EXPECT_EQ(c.num_heads, 32);
  EXPECT_EQ(c.num_kv_heads, 32);  // = num_attention_heads
  EXPECT_EQ(c.head_dim, 128);     // = hidden_size / num_attention_heads
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.rope.theta, 10000.0);
  EXPECT_EQ(c.rope.type, RopeConfig::Type::kDefault);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.max_position_embeddings, 32768);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.block_size, 16);
  EXPECT_EQ(c.mask_token_id, 5);

  json derived = minimal_config();
  derived["hidden_size"] = 2560;
  derived["num_attention_heads"] = 20;
  derived["num_key_value_heads"] = nullptr;  // null means default, as in Hugging Face configs
  derived["head_dim"] = nullptr;
  const DrafterConfig d = parse(derived);
  EXPECT_EQ(d.num_kv_heads, 20);
  EXPECT_EQ(d.head_dim, 128);
}

TEST(Config, BlockSizeNestedWins) {
  json c = minimal_config();
  c["dflash_config"]["block_size"] = 8;
  EXPECT_EQ(parse(c).block_size, 8);
  c.erase("block_size");
  EXPECT_EQ(parse(c).block_size, 8);
  c["dflash_config"].erase("block_size");
  EXPECT_BAD_INPUT(parse(c), "key 'block_size' is missing");
}

TEST(Config, RopeForms) {
  // Nested rope_parameters with theta inside.
  json c = minimal_config();
  c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1000000.0}};
  EXPECT_EQ(parse(c).rope.theta, 1000000.0);
  EXPECT_EQ(parse(c).rope.type, RopeConfig::Type::kDefault);

  // Legacy rope_scaling with `type`, every YaRN key given (gpt-oss style geometry).
  c = minimal_config();
  c["rope_theta"] = 150000;
  c["max_position_embeddings"] = 131072;
  c["rope_scaling"] = {{"type", "yarn"},          {"factor", 32.0},   {"original_max_position_embeddings", 4096},
                       {"beta_fast", 16.0},       {"beta_slow", 2.0}, {"truncate", false},
                       {"attention_factor", 1.5}, {"mscale", 0.7},    {"mscale_all_dim", 0.9}};
  const DrafterConfig y = parse(c);
  EXPECT_EQ(y.rope.type, RopeConfig::Type::kYarn);
  EXPECT_EQ(y.rope.theta, 150000.0);
  EXPECT_EQ(y.rope.factor, 32.0);
  EXPECT_EQ(y.rope.original_max_position_embeddings, 4096);
  EXPECT_EQ(y.rope.beta_fast, 16.0);
  EXPECT_EQ(y.rope.beta_slow, 2.0);
  EXPECT_FALSE(y.rope.truncate);
  EXPECT_TRUE(y.rope.has_attention_factor);
  EXPECT_EQ(y.rope.attention_factor, 1.5);
  EXPECT_EQ(y.rope.mscale, 0.7);
  EXPECT_EQ(y.rope.mscale_all_dim, 0.9);

  // original_max_position_embeddings defaults to max_position_embeddings.
  c = minimal_config();
  c["max_position_embeddings"] = 2048;
  c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 2.0}};
  EXPECT_EQ(parse(c).rope.original_max_position_embeddings, 2048);

  // rope_scaling: null is "no scaling".
  c = minimal_config();
  c["rope_scaling"] = nullptr;
  EXPECT_EQ(parse(c).rope.type, RopeConfig::Type::kDefault);
}

TEST(Config, DflashConfigCarriesTheDflashKeys) {
  json c = minimal_config();
  c["dflash_config"].erase("target_layer_ids");
  c["num_target_layers"] = 36;
  c["num_hidden_layers"] = 5;
  EXPECT_EQ(parse(c).target_layer_ids, (std::vector<int>{1, 9, 17, 25, 33}));
  c.erase("num_target_layers");
  EXPECT_BAD_INPUT(parse(c), "neither 'dflash_config.target_layer_ids' nor 'num_target_layers'");
}

// Every refusal, each by the key it names. One table, one loop.
TEST(Config, RefusalsNameTheKey) {
  struct Case {
    const char* what;
    std::function<void(json&)> edit;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {"non-silu", [](json& c) { c["hidden_act"] = "gelu"; }, "key 'hidden_act' is 'gelu'; only silu is supported"},
      {"sliding window on",
       [](json& c) {
         c["use_sliding_window"] = true;
         c["sliding_window"] = 4096;
       },
       "key 'use_sliding_window' is true with sliding_window 4096"},
      {"sliding window flag alone", [](json& c) { c["use_sliding_window"] = true; },
       "key 'use_sliding_window' is true"},
      {"sliding layer type",
       [](json& c) {
         c["num_hidden_layers"] = 2;
         c["layer_types"] = {"full_attention", "sliding_attention"};
       },
       "key 'layer_types'[1] is \"sliding_attention\""},
      {"layer_types length",
       [](json& c) {
         c["num_hidden_layers"] = 2;
         c["layer_types"] = {"full_attention"};
       },
       "has 1 entries for 2 layers"},
      {"DFlash2 conv_kernel_size", [](json& c) { c["conv_kernel_size"] = 4; }, "'conv_kernel_size' belongs to DFlash2"},
      {"DFlash2 conv_group_size nested", [](json& c) { c["dflash_config"]["conv_group_size"] = 4; },
       "'dflash_config.conv_group_size' belongs to DFlash2"},
      {"DFlash2 selector_", [](json& c) { c["selector_hidden"] = 64; }, "'selector_hidden' belongs to DFlash2"},
      {"DSpark markov_", [](json& c) { c["dflash_config"]["markov_order"] = 2; },
       "'dflash_config.markov_order' belongs to DSpark"},
      {"DSpark confidence_", [](json& c) { c["confidence_head"] = true; }, "'confidence_head' belongs to DSpark"},
      {"DSpark projector_type", [](json& c) { c["projector_type"] = "mlp"; }, "'projector_type' belongs to DSpark"},
      {"rope type linear",
       [](json& c) {
         c["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
       },
       "rope type 'linear' is not supported"},
      {"rope type dynamic in rope_parameters",
       [](json& c) {
         c["rope_parameters"] = {{"rope_type", "dynamic"}};
       },
       "rope type 'dynamic' is not supported"},
      {"unknown rope key",
       [](json& c) {
         c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 2.0}, {"low_freq_factor", 1}};
       },
       "unknown key 'rope_scaling.low_freq_factor'"},
      {"yarn key on default rope",
       [](json& c) {
         c["rope_parameters"] = {{"rope_type", "default"}, {"factor", 2.0}};
       },
       "key 'rope_parameters.factor' has no meaning for rope_type 'default'"},
      {"yarn without factor",
       [](json& c) {
         c["rope_scaling"] = {{"rope_type", "yarn"}};
       },
       "'rope_scaling.factor' is required for YaRN"},
      {"yarn factor disagrees",
       [](json& c) {
         c["max_position_embeddings"] = 40960;
         c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
       },
       "disagrees with max_position_embeddings / rope_scaling.original_max_position_embeddings"},
      {"type and rope_type disagree",
       [](json& c) {
         c["rope_scaling"] = {{"rope_type", "yarn"}, {"type", "default"}, {"factor", 2.0}};
       },
       "disagree"},
      {"theta sources disagree",
       [](json& c) {
         c["rope_theta"] = 10000.0;
         c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5e5}};
       },
       "key 'rope_theta' = 10000 and key 'rope_parameters.rope_theta' = 500000 disagree"},
      {"unknown dflash_config key", [](json& c) { c["dflash_config"]["layer_norm"] = true; },
       "unknown key 'dflash_config.layer_norm'"},
      {"unknown top-level key", [](json& c) { c["partial_rotary_factor"] = 0.5; },
       "unknown config key 'partial_rotary_factor' may change the math; refusing"},
      {"quantization config without a method", [](json& c) { c["quantization_config"] = json::object(); },
       "quantization_config: missing key 'quant_method'"},
      {"quantization config not FP8",
       [](json& c) { c["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}}; },
       "quantization_config.quant_method is 'gptq'; a quantized drafter is read as FP8"},
      {"mask token missing", [](json& c) { c["dflash_config"].erase("mask_token_id"); },
       "'dflash_config.mask_token_id' is missing"},
      {"dflash_config missing", [](json& c) { c.erase("dflash_config"); }, "key 'dflash_config' is missing"},
      {"mask token past vocab",
       [](json& c) {
         c["vocab_size"] = 100;
         c["dflash_config"]["mask_token_id"] = 100;
       },
       "mask_token_id' = 100 is outside [0, vocab_size 100)"},
      {"heads not a multiple of kv heads",
       [](json& c) {
         c["num_attention_heads"] = 32;
         c["num_key_value_heads"] = 6;
       },
       "num_attention_heads' = 32 is not a multiple of num_key_value_heads = 6"},
      {"odd head_dim", [](json& c) { c["head_dim"] = 33; }, "key 'head_dim' must be even"},
      {"zero hidden size", [](json& c) { c["hidden_size"] = 0; }, "key 'hidden_size' must be positive"},
      {"negative layers", [](json& c) { c["num_hidden_layers"] = -1; }, "key 'num_hidden_layers' must be positive"},
      {"negative target id",
       [](json& c) {
         c["dflash_config"]["target_layer_ids"] = {1, -2};
       },
       "target layer id -2 in [1, -2] is negative"},
      {"target id past the target",
       [](json& c) {
         c["num_target_layers"] = 8;
         c["dflash_config"]["target_layer_ids"] = {1, 9};
       },
       "target layer id 9 in [1, 9] is past the target's num_target_layers 8"},
      {"wrong type int", [](json& c) { c["hidden_size"] = "4096"; },
       "key 'hidden_size' must be an integer, got \"4096\""},
      {"wrong type float for int", [](json& c) { c["vocab_size"] = 1000.5; }, "key 'vocab_size' must be an integer"},
      {"wrong type bool", [](json& c) { c["attention_bias"] = 1; }, "key 'attention_bias' must be true or false"},
      {"wrong type number", [](json& c) { c["rms_norm_eps"] = "1e-6"; }, "key 'rms_norm_eps' must be a number"},
      {"head_dim underivable",
       [](json& c) {
         c["hidden_size"] = 100;
         c["num_attention_heads"] = 3;
         c["num_key_value_heads"] = 3;
       },
       "head_dim is absent and hidden_size 100 is not a multiple of num_attention_heads 3"},
      {"not an object", [](json& c) { c = json::array(); }, "the config is not a JSON object"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    json config = minimal_config();
    c.edit(config);
    const std::string message = testing::harness_error_message([&] { parse(config); });
    testing::expect_mentions(message, c.expected);
    EXPECT_EQ(message.rfind("test/config.json", 0), 0u) << "the message names the file first: " << message;
  }
}

TEST(Config, InertKeysAndAllowedSlidingWindowFormsAreAccepted) {
  json c = minimal_config();
  c["architectures"] = {"DFlashDraftModel"};
  c["model_type"] = "qwen3";
  c["torch_dtype"] = "bfloat16";
  c["transformers_version"] = "4.57.0";
  c["bos_token_id"] = 1;
  c["eos_token_id"] = 2;
  c["initializer_range"] = 0.02;
  c["use_cache"] = true;
  c["attention_dropout"] = 0.0;
  c["max_window_layers"] = 28;
  c["use_sliding_window"] = false;
  c["sliding_window"] = 4096;  // inert while use_sliding_window is false
  c["num_hidden_layers"] = 2;
  c["layer_types"] = {"full_attention", "full_attention"};
  EXPECT_NO_THROW(parse(c));
  c["sliding_window"] = nullptr;
  c.erase("use_sliding_window");
  EXPECT_NO_THROW(parse(c));
}

TEST(Config, DuplicateKeysInTheFileAreRefused) {
  testing::TempDir dir;
  std::ofstream(dir / "config.json") << R"({"hidden_size": 64, "hidden_size": 128})";
  EXPECT_BAD_INPUT(load_drafter_config(dir.path()), "duplicate key 'hidden_size' at the top level");
  EXPECT_BAD_INPUT(load_drafter_config(dir / "absent.json"), "no such file or directory: " + dir / "absent.json");
}

}  // namespace
}  // namespace dflash
