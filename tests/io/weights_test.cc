// Weight loading (core/weights.h) on small synthetic checkpoints written by the checkpoint writer
// or by hand: round trips, name forms, tied targets, sharded targets and tensor accounting.
#include "core/weights.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/safetensors.h"
#include "fixtures/checkpoint_writer.h"
#include "tests/io/io_test_util.h"

namespace dflash {
namespace {

using nlohmann::json;
using testing::make_weights;
using testing::small_config;
using testing::TempDir;

void expect_same_weights(const DrafterConfig& c, const DrafterWeights& a, const DrafterWeights& b) {
  const auto list_a = drafter_tensor_list(c, a);
  const auto list_b = drafter_tensor_list(c, b);
  ASSERT_EQ(list_a.size(), list_b.size());
  for (size_t i = 0; i < list_a.size(); ++i) {
    EXPECT_EQ(list_a[i].tensor->shape, list_b[i].tensor->shape) << list_a[i].name;
    EXPECT_EQ(list_a[i].tensor->values, list_b[i].tensor->values) << list_a[i].name;
  }
  EXPECT_EQ(a.embed_tokens.values, b.embed_tokens.values);
  EXPECT_EQ(a.lm_head.values, b.lm_head.values);
}

// A drafter checkpoint written by hand: each tensor under `prefix + name`, plus `extra`.
void write_checkpoint_by_hand(const std::string& dir, const DrafterConfig& c, const DrafterWeights& w,
                              const std::string& prefix, std::vector<TensorToWrite> extra = {},
                              const std::string& skip = "") {
  std::filesystem::create_directories(dir);
  std::vector<TensorToWrite> tensors;
  for (const NamedWeight& named : drafter_tensor_list(c, w)) {
    if (named.name != skip) tensors.push_back(make_bf16_tensor(prefix + named.name, *named.tensor));
  }
  for (TensorToWrite& t : extra) tensors.push_back(std::move(t));
  write_safetensors(dir + "/model.safetensors", tensors);
}

class WeightsTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    config_json = small_config(GetParam());
    config = parse_drafter_config(config_json, "small");
    weights = make_weights(config);
    write_drafter_checkpoint(dir / "drafter", config_json, weights);
    write_target_file(dir / "target.safetensors", weights);
  }
  DrafterWeights load(const std::string& drafter_dir) {
    return load_drafter_weights(config, drafter_dir, TargetSource{dir / "target.safetensors"});
  }
  TempDir dir;
  json config_json;
  DrafterConfig config;
  DrafterWeights weights;
};

TEST_P(WeightsTest, WriterAndLoaderRoundTrip) {
  const DrafterWeights loaded = load(dir / "drafter");
  expect_same_weights(config, weights, loaded);
  // The written config parses to the same geometry.
  const DrafterConfig reread = load_drafter_config(dir / "drafter");
  EXPECT_EQ(reread.attention_bias, GetParam());
  EXPECT_EQ(reread.ctx_feature_dim(), 16);
  // Every tensor of the checkpoint is BF16 and carries no "model." prefix.
  const auto file = SafetensorsFile::open(dir / "drafter/model.safetensors");
  EXPECT_EQ(file->names().size(), GetParam() ? 3u + 2u * 15u : 3u + 2u * 11u);
  for (const std::string& name : file->names()) {
    EXPECT_EQ(file->info(name).dtype, DType::kBF16) << name;
    EXPECT_NE(name.rfind("model.", 0), 0u) << name;
  }
}

TEST_P(WeightsTest, ModelPrefixIsAcceptedButNotTwice) {
  write_checkpoint_by_hand(dir / "prefixed", config, weights, "model.");
  expect_same_weights(config, weights, load(dir / "prefixed"));

  write_checkpoint_by_hand(dir / "both", config, weights, "", {make_bf16_tensor("model.norm.weight", weights.norm)});
  EXPECT_BAD_INPUT(load(dir / "both"),
                   "tensor 'norm.weight' is present both as 'model.norm.weight' and as 'norm.weight'");
}

TEST_P(WeightsTest, TensorAccountingNamesEveryProblem) {
  // Missing and unused together: both are reported, with the file.
  write_checkpoint_by_hand(dir / "acct", config, weights, "",
                           {make_bf16_tensor("layers.0.self_attn.rotary.weight", Tensor({2}, {1.0f, 2.0f}))},
                           "layers.1.mlp.up_proj.weight");
  EXPECT_BAD_INPUT(load(dir / "acct"),
                   "2 problems: missing tensor 'layers.1.mlp.up_proj.weight' (expected shape [16, 8])");
  EXPECT_BAD_INPUT(load(dir / "acct"),
                   "unused tensor 'layers.0.self_attn.rotary.weight' in " + (dir / "acct/model.safetensors"));

  // A wrong shape names expected and actual shapes.
  DrafterWeights transposed = weights;
  transposed.fc = Tensor({16, 8}, weights.fc.values);
  write_checkpoint_by_hand(dir / "shape", config, transposed, "");
  EXPECT_BAD_INPUT(load(dir / "shape"), "tensor 'fc.weight': wrong shape, expected [8, 16], got [16, 8]");

  // Drafter weights must be floating point: I32 is refused, F16 and F32 are read exactly.
  write_checkpoint_by_hand(dir / "dtype", config, weights, "", {}, "norm.weight");
  {
    std::vector<TensorToWrite> tensors;
    for (const NamedWeight& named : drafter_tensor_list(config, weights)) {
      if (named.name == "norm.weight") {
        tensors.push_back(make_i32_tensor(named.name, {8}, {0, 0, 0, 0, 0, 0, 0, 0}));
      } else if (named.name == "hidden_norm.weight") {
        tensors.push_back(make_f32_tensor(named.name, *named.tensor));
      } else {
        tensors.push_back(make_bf16_tensor(named.name, *named.tensor));
      }
    }
    write_safetensors(dir / "dtype/model.safetensors", tensors);
  }
  EXPECT_BAD_INPUT(load(dir / "dtype"), "tensor 'norm.weight' has dtype I32; drafter weights must be BF16, F16 or F32");

  // NaN in a weight is refused with its index.
  DrafterWeights poisoned = weights;
  poisoned.layers[1].k_norm.values[3] = NAN;
  write_checkpoint_by_hand(dir / "nan", config, poisoned, "");
  EXPECT_BAD_INPUT(load(dir / "nan"), "tensor 'layers.1.self_attn.k_norm.weight' " +
                                          shape_string(poisoned.layers[1].k_norm.shape) + ": NaN at index 3");
}

TEST_P(WeightsTest, BiasesRequiredExactlyWithAttentionBias) {
  if (GetParam()) {
    write_checkpoint_by_hand(dir / "nobias", config, weights, "", {}, "layers.0.self_attn.v_proj.bias");
    EXPECT_BAD_INPUT(load(dir / "nobias"), "missing tensor 'layers.0.self_attn.v_proj.bias' (expected shape [4])");
  } else {
    write_checkpoint_by_hand(dir / "bias", config, weights, "",
                             {make_bf16_tensor("layers.0.self_attn.q_proj.bias", Tensor::zeros({8}))});
    EXPECT_BAD_INPUT(load(dir / "bias"), "unused tensor 'layers.0.self_attn.q_proj.bias'");
    EXPECT_BAD_INPUT(load(dir / "bias"), "attention_bias is false");
  }
}

INSTANTIATE_TEST_SUITE_P(Bias, WeightsTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) { return info.param ? "bias" : "nobias"; });

class TargetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config = parse_drafter_config(small_config(false), "small");
    weights = make_weights(config);
    write_drafter_checkpoint(dir / "drafter", small_config(false), weights);
  }
  DrafterWeights load(const TargetSource& target, const DrafterConfig& c) {
    return load_drafter_weights(c, dir / "drafter", target);
  }
  TempDir dir;
  DrafterConfig config;
  DrafterWeights weights;
};

TEST_F(TargetTest, NamesWithOrWithoutModelPrefix) {
  write_safetensors(dir / "hf.safetensors",
                    {make_bf16_tensor("model.embed_tokens.weight", weights.embed_tokens),
                     make_bf16_tensor("lm_head.weight", weights.lm_head),
                     make_bf16_tensor("model.layers.0.mlp.up_proj.weight", Tensor::zeros({2}))});
  const DrafterWeights loaded = load(TargetSource{dir / "hf.safetensors"}, config);
  EXPECT_EQ(loaded.embed_tokens.values, weights.embed_tokens.values);
  EXPECT_EQ(loaded.lm_head.values, weights.lm_head.values);

  // Given with the prefix, found without it.
  write_safetensors(dir / "plain.safetensors", {make_bf16_tensor("embed_tokens.weight", weights.embed_tokens),
                                                make_bf16_tensor("lm_head.weight", weights.lm_head)});
  TargetSource prefixed{dir / "plain.safetensors", "model.embed_tokens.weight", "model.lm_head.weight"};
  EXPECT_EQ(load(prefixed, config).lm_head.values, weights.lm_head.values);

  write_safetensors(dir / "both.safetensors", {make_bf16_tensor("embed_tokens.weight", weights.embed_tokens),
                                               make_bf16_tensor("model.embed_tokens.weight", weights.embed_tokens),
                                               make_bf16_tensor("lm_head.weight", weights.lm_head)});
  EXPECT_BAD_INPUT(load(TargetSource{dir / "both.safetensors"}, config),
                   "both 'embed_tokens.weight' and 'model.embed_tokens.weight' are present");
}

TEST_F(TargetTest, TiedTargets) {
  write_safetensors(dir / "embed-only.safetensors", {make_bf16_tensor("embed_tokens.weight", weights.embed_tokens)});
  // lm_head missing and nothing says tied: an error naming it.
  EXPECT_BAD_INPUT(load(TargetSource{dir / "embed-only.safetensors"}, config),
                   "lm_head 'lm_head.weight' not found (also tried with/without the 'model.' prefix)");
  // The fixture says tied.
  TargetSource tied{dir / "embed-only.safetensors"};
  tied.tied = true;
  EXPECT_EQ(load(tied, config).lm_head.values, weights.embed_tokens.values);
  // The drafter config says tied: embed_tokens serves both even when the target has an lm_head.
  json tied_json = small_config(false);
  tied_json["tie_word_embeddings"] = true;
  const DrafterConfig tied_config = parse_drafter_config(tied_json, "tied");
  write_target_file(dir / "full.safetensors", weights);
  EXPECT_EQ(load(TargetSource{dir / "full.safetensors"}, tied_config).lm_head.values, weights.embed_tokens.values);
  // A target directory whose config.json says tied.
  std::filesystem::create_directories(dir / "target-dir");
  write_safetensors(dir / "target-dir/model.safetensors",
                    {make_bf16_tensor("model.embed_tokens.weight", weights.embed_tokens)});
  std::ofstream(dir / "target-dir/config.json") << R"({"tie_word_embeddings": true})";
  EXPECT_EQ(load(TargetSource{dir / "target-dir"}, config).lm_head.values, weights.embed_tokens.values);
  std::ofstream(dir / "target-dir/config.json") << R"({"tie_word_embeddings": false})";
  EXPECT_BAD_INPUT(load(TargetSource{dir / "target-dir"}, config), "lm_head 'lm_head.weight' not found");
}

TEST_F(TargetTest, ShardedTargetAndWrongShapes) {
  std::filesystem::create_directories(dir / "sharded");
  write_safetensors(dir / "sharded/model-00001-of-00002.safetensors",
                    {make_bf16_tensor("model.embed_tokens.weight", weights.embed_tokens)});
  write_safetensors(dir / "sharded/model-00002-of-00002.safetensors",
                    {make_bf16_tensor("lm_head.weight", weights.lm_head)});
  std::ofstream(dir / "sharded/model.safetensors.index.json")
      << R"({"weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
                            "lm_head.weight": "model-00002-of-00002.safetensors"}})";
  for (const std::string& path : {dir / "sharded", dir / "sharded/model.safetensors.index.json"}) {
    const DrafterWeights loaded = load(TargetSource{path}, config);
    EXPECT_EQ(loaded.embed_tokens.values, weights.embed_tokens.values);
    EXPECT_EQ(loaded.lm_head.values, weights.lm_head.values);
  }
  // A target with another vocabulary is refused by shape.
  write_safetensors(dir / "v64.safetensors", {make_bf16_tensor("embed_tokens.weight", Tensor::zeros({64, 8})),
                                              make_bf16_tensor("lm_head.weight", Tensor::zeros({64, 8}))});
  EXPECT_BAD_INPUT(load(TargetSource{dir / "v64.safetensors"}, config),
                   "tensor 'embed_tokens.weight': wrong shape, expected [32, 8], got [64, 8]");
  EXPECT_BAD_INPUT(load(TargetSource{dir / "absent.safetensors"}, config),
                   "absent.safetensors: no such file or directory");
}

TEST(ValidateDrafterWeights, ChecksShapesBiasesAndLayers) {
  const DrafterConfig c = parse_drafter_config(small_config(false), "small");
  DrafterWeights w = make_weights(c);
  EXPECT_NO_THROW(validate_drafter_weights(c, w));

  DrafterWeights bad = w;
  bad.layers[1].o_proj = Tensor::zeros({8, 4});
  EXPECT_BAD_INPUT(validate_drafter_weights(c, bad),
                   "layers.1.self_attn.o_proj.weight: wrong shape, expected [8, 8], got [8, 4]");
  bad = w;
  bad.layers[0].k_bias = Tensor::zeros({4});
  EXPECT_BAD_INPUT(validate_drafter_weights(c, bad),
                   "layers.0.self_attn.k_proj.bias is set but attention_bias is false");
  bad = w;
  bad.layers.pop_back();
  EXPECT_BAD_INPUT(validate_drafter_weights(c, bad), "1 layers, the config has 2");
  bad = w;
  bad.lm_head = Tensor::zeros({31, 8});
  EXPECT_BAD_INPUT(validate_drafter_weights(c, bad), "lm_head: wrong shape, expected [32, 8], got [31, 8]");
  bad = w;
  bad.norm.values.pop_back();
  EXPECT_BAD_INPUT(validate_drafter_weights(c, bad), "norm.weight: 7 values for shape [8]");

  const DrafterConfig with_bias = parse_drafter_config(small_config(true), "small");
  EXPECT_BAD_INPUT(validate_drafter_weights(with_bias, w),
                   "layers.0.self_attn.q_proj.bias: wrong shape, expected [8], got []");
}

TEST(CheckpointWriter, RefusesValuesItWouldRound) {
  TempDir dir;
  const DrafterConfig c = parse_drafter_config(small_config(false), "small");
  DrafterWeights w = make_weights(c);
  w.layers[0].gate_proj.values[5] = 0.1f;  // not a bf16 value
  EXPECT_BAD_INPUT(write_drafter_checkpoint(dir / "d", small_config(false), w),
                   "tensor 'layers.0.mlp.gate_proj.weight' value 0.100000 at row 0, column 5 is not a bf16 value");
  w = make_weights(c);
  w.lm_head.values[0] = 1.0f / 3.0f;
  EXPECT_BAD_INPUT(write_target_file(dir / "t.safetensors", w), "tensor 'lm_head.weight' value");
  json broken = small_config(false);
  broken["hidden_act"] = "relu";
  EXPECT_BAD_INPUT(write_drafter_checkpoint(dir / "d", broken, make_weights(c)), "only silu is supported");
}

}  // namespace
}  // namespace dflash
