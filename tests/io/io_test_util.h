// Shared by the tests of tests/io: a scratch directory that removes itself, where the bundled
// oracle fixtures and the bundled engine captures live, and a small synthetic drafter.
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/support/harness_error.h"
#include "core/config.h"
#include "core/dtype.h"
#include "core/weights.h"

namespace dflash::testing {

class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "dflash-io-XXXXXX").string();
    if (!mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return (std::filesystem::path(path_) / name).string(); }

 private:
  std::string path_;
};

inline std::string source_dir() { return DFLASH_SOURCE_DIR; }
inline std::string oracle_dir(const std::string& name) { return source_dir() + "/fixtures/oracle/" + name; }
inline std::string captures_dir() { return source_dir() + "/fixtures/captures"; }

inline const char* const kOracleFixtures[] = {
    "tiny-mha",   "tiny-gqa",          "bias-mqa-eps",   "yarn",         "batch-widths-release",
    "ctx-window", "derived-layer-ids", "heads128-batch", "far-yarn-bias"};

// ---- a small synthetic drafter, for loaders and writers ----

// H 8, L 2, nh 2 / nkv 1, d 4 (nh·d = 8), I 16, V 32, two target layers: fc is [8, 16].
inline nlohmann::json small_config(bool bias) {
  return nlohmann::json{{"hidden_size", 8},
                        {"num_hidden_layers", 2},
                        {"num_attention_heads", 2},
                        {"num_key_value_heads", 1},
                        {"head_dim", 4},
                        {"intermediate_size", 16},
                        {"vocab_size", 32},
                        {"attention_bias", bias},
                        {"block_size", 4},
                        {"dflash_config", {{"mask_token_id", 31}, {"target_layer_ids", {0, 2}}}}};
}

// Deterministic bf16-valued numbers: a 32-bit LCG mapped to [-1, 1) and rounded to bf16.
inline Tensor bf16_values(std::vector<int64_t> shape, uint32_t seed) {
  Tensor t = Tensor::zeros(std::move(shape));
  uint32_t state = seed * 2654435761u + 1;
  for (float& v : t.values) {
    state = state * 1664525u + 1013904223u;
    v = round_to_bf16(static_cast<float>(state >> 8) / 8388608.0f - 1.0f);
  }
  return t;
}

inline DrafterWeights make_weights(const DrafterConfig& c) {
  DrafterWeights w;
  w.layers.resize(c.num_layers);
  uint32_t seed = 1;
  // Names and shapes from the shared list (it points into w, which is not const, so filling
  // through it is well defined); the values are what every round trip is checked against.
  for (const NamedWeight& named : drafter_tensor_list(c, w)) {
    *const_cast<Tensor*>(named.tensor) = bf16_values(named.shape, seed++);
  }
  w.embed_tokens = bf16_values({c.vocab_size, c.hidden_size}, 1000);
  w.lm_head = bf16_values({c.vocab_size, c.hidden_size}, 2000);
  return w;
}

// Runs `body`, which must throw HarnessError of kind kBadInput whose message holds `expected`.
#define EXPECT_BAD_INPUT(body, expected) \
  ::dflash::testing::expect_mentions(::dflash::testing::harness_error_message([&] { body; }), (expected))

}  // namespace dflash::testing
