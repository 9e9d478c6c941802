// The drafter's config.json (docs/spec/drafter.md §1): parsed once, validated, every key that changes the
// math either consumed or refused by name.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dflash {

struct RopeConfig {
  enum class Type { kDefault, kYarn };
  Type type = Type::kDefault;
  double theta = 10000.0;
  // YaRN only (docs/spec/drafter.md §4, Hugging Face _compute_yarn_parameters).
  double factor = 1.0;
  int original_max_position_embeddings = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  bool truncate = true;
  bool has_attention_factor = false;  // explicit `attention_factor` key
  double attention_factor = 1.0;      // explicit value when has_attention_factor
  double mscale = 0.0;                // DeepSeek-style keys; 0 = absent
  double mscale_all_dim = 0.0;
};

// DFlash2 additions (docs/spec/dflash2.md §1): convolutions around attention and MLP, sliding
// non-causal layers, the candidate selector. `enabled` is false for a plain DFlash drafter.
struct Dflash2Config {
  bool enabled = false;
  int conv_kernel_size = 0;  // k: taps of each convolution
  int conv_group_size = 0;   // G: channels sharing one dynamic coefficient
  int selector_rank = 0;     // r
  int selector_top_k = 0;    // K
  double output_multiplier = 1.0;
  double final_logit_softcapping = 0.0;  // 0 = off
  double input_embedding_scale = 1.0;
  std::vector<bool> sliding;  // per layer: sliding_attention (true) or full_attention
  int sliding_window = 0;     // W, counting the query's own position; 0 when no layer slides

  int num_groups(int hidden_size) const { return hidden_size / conv_group_size; }  // ng
  bool any_sliding() const {
    for (bool s : sliding) if (s) return true;
    return false;
  }
  bool all_sliding() const {
    for (bool s : sliding) if (!s) return false;
    return enabled && !sliding.empty();
  }
};

struct DrafterConfig {
  int hidden_size = 0;          // H
  int num_layers = 0;           // L
  int num_heads = 0;            // nh
  int num_kv_heads = 0;         // nkv
  int head_dim = 0;             // d
  int intermediate_size = 0;    // I
  int vocab_size = 0;           // V
  double rms_norm_eps = 1e-6;
  bool attention_bias = false;
  RopeConfig rope;
  int block_size = 0;                 // trained block width
  std::vector<int> target_layer_ids;  // captured target layers, 0-based
  int mask_token_id = 0;
  int target_hidden_size = 0;  // Ht (= H for every published drafter)
  bool tie_word_embeddings = false;
  int max_position_embeddings = 0;
  Dflash2Config dflash2;

  int conv_coef_dim() const { return 2 * dflash2.conv_kernel_size * dflash2.num_groups(hidden_size); }  // 2·k·ng

  // The products are formed in 64-bit; check_config_limits keeps them within int (core/limits.h).
  int num_target_layers() const { return static_cast<int>(target_layer_ids.size()); }  // nT
  int q_dim() const { return static_cast<int>(int64_t{num_heads} * head_dim); }
  int kv_dim() const { return static_cast<int>(int64_t{num_kv_heads} * head_dim); }
  int ctx_feature_dim() const { return static_cast<int>(int64_t{num_target_layers()} * target_hidden_size); }  // nT·Ht
};

// Refuses (bad input prefixed by `source`) a size past its bound in core/limits.h, or a product
// (nh·d, nT·Ht) past its own; parse_drafter_config and every drafter call it.
void check_config_limits(const DrafterConfig& config, const std::string& source);

// Parses a config object; `source` (a path) prefixes every error message.
DrafterConfig parse_drafter_config(const nlohmann::json& json, const std::string& source);
// Reads and parses `<dir>/config.json`.
DrafterConfig load_drafter_config(const std::string& path);

// target_layer_ids derived from num_target_layers when absent (docs/spec/drafter.md §1).
std::vector<int> derive_target_layer_ids(int num_draft_layers, int num_target_layers);

}  // namespace dflash
