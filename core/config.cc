#include "core/config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <optional>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/fp8_checkpoint.h"
#include "core/json_file.h"
#include "core/limits.h"

namespace dflash {
namespace {

using nlohmann::json;

// Keys of the DFlash variants this harness does not implement, or does only for a drafter that says
// it is one (DFlash2: `architectures` names DFlash2DraftModel); refused wherever they appear.
bool is_dflash2_key(const std::string& key) {
  return key == "conv_kernel_size" || key == "conv_group_size" || key.rfind("selector_", 0) == 0;
}
std::optional<std::string> variant_of_key(const std::string& key) {
  auto starts_with = [&](const char* prefix) { return key.rfind(prefix, 0) == 0; };
  if (is_dflash2_key(key)) return "DFlash2";
  if (starts_with("markov_") || starts_with("confidence_") || key == "projector_type") return "DSpark";
  return std::nullopt;
}

// The DFlash2 scalars (docs/spec/dflash2.md §1); read from dflash_config, a differing top-level copy
// is refused.
const char* const kDflash2Scalars[] = {"output_multiplier", "final_logit_softcapping", "input_embedding_scale"};

// Keys DFlash2 v1 refuses at either level (docs/spec/dflash2.md §1, "refused in DFlash2 v1"), and
// keys accepted only at their neutral value.
const std::set<std::string> kDflash2RefusedKeys = {"swa_window_size", "use_swa", "causal", "attention_sink_bias"};
const std::set<std::string> kDflash2NeutralKeys = {"sample_from_anchor", "draft_vocab_size", "target_hidden_size",
                                                   "logit_scale"};

// Top-level keys that are read below, and `quantization_config`, which loading the weights reads
// (core/fp8_checkpoint.h: a pre-quantized FP8 drafter, or a refusal naming its key).
const std::set<std::string> kMathKeys = {"quantization_config", "hidden_size",         "intermediate_size",
                                         "num_hidden_layers",   "num_attention_heads",
                                         "num_key_value_heads", "head_dim",
                                         "vocab_size",          "rms_norm_eps",
                                         "rope_theta",          "rope_scaling",
                                         "rope_parameters",     "attention_bias",
                                         "hidden_act",          "max_position_embeddings",
                                         "tie_word_embeddings", "block_size",
                                         "num_target_layers",   "dflash_config",
                                         "layer_types",         "use_sliding_window",
                                         "sliding_window",      "is_causal"};

// Top-level keys known not to change what one forward pass computes: identification, training,
// generation and serialization settings. `max_window_layers` only matters with a sliding window,
// which is refused.
const std::set<std::string> kInertKeys = {"architectures",
                                          "model_type",
                                          "torch_dtype",
                                          "dtype",
                                          "transformers_version",
                                          "_name_or_path",
                                          "name_or_path",
                                          "auto_map",
                                          "bos_token_id",
                                          "eos_token_id",
                                          "pad_token_id",
                                          "sep_token_id",
                                          "decoder_start_token_id",
                                          "initializer_range",
                                          "use_cache",
                                          "attention_dropout",
                                          "max_window_layers",
                                          "output_attentions",
                                          "output_hidden_states",
                                          "return_dict",
                                          "torchscript",
                                          "tokenizer_class",
                                          "id2label",
                                          "label2id",
                                          "problem_type",
                                          "finetuning_task",
                                          "task_specific_params",
                                          "prefix",
                                          "is_encoder_decoder",
                                          "is_decoder",
                                          "add_cross_attention",
                                          "tie_encoder_decoder",
                                          "pruned_heads",
                                          "chunk_size_feed_forward",
                                          "use_return_dict"};

const std::set<std::string> kDflashKeys = {"mask_token_id", "target_layer_ids", "block_size"};
const std::set<std::string> kDflash2ConfigKeys = {
    "conv_kernel_size",      "conv_group_size",         "selector_rank",         "selector_top_k",
    "output_multiplier",     "final_logit_softcapping", "input_embedding_scale", "sample_from_anchor",
    "draft_vocab_size",      "target_hidden_size",      "logit_scale"};

const std::set<std::string> kRopeKeys = {
    "rope_type",     "type",      "rope_theta",       "factor",   "original_max_position_embeddings",
    "beta_fast",     "beta_slow", "attention_factor", "truncate", "mscale",
    "mscale_all_dim"};

// Typed access to one JSON object; every message names the source file and the key's path.
class Fields {
 public:
  Fields(const json& object, std::string source, std::string prefix)
      : object_(object), source_(std::move(source)), prefix_(std::move(prefix)) {}

  // Present and not null (null means "use the default" in Hugging Face configs).
  bool has(const std::string& key) const { return object_.contains(key) && !object_[key].is_null(); }
  std::string where(const std::string& key) const { return source_ + ": key '" + prefix_ + key + "'"; }

  int64_t integer(const std::string& key, int64_t fallback) const {
    if (!has(key)) return fallback;
    const json& v = object_[key];
    if (!v.is_number_integer()) throw bad_input(where(key) + " must be an integer, got " + v.dump());
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      throw bad_input(where(key) + " is too large: " + v.dump());
    }
    return v.get<int64_t>();
  }
  int int32(const std::string& key, int64_t fallback) const {
    const int64_t v = integer(key, fallback);
    if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()) {
      throw bad_input(where(key) + " is out of range: " + std::to_string(v));
    }
    return static_cast<int>(v);
  }
  double number(const std::string& key, double fallback) const {
    if (!has(key)) return fallback;
    const json& v = object_[key];
    if (!v.is_number()) throw bad_input(where(key) + " must be a number, got " + v.dump());
    const double d = v.get<double>();
    if (!std::isfinite(d)) throw bad_input(where(key) + " is not finite");
    return d;
  }
  bool boolean(const std::string& key, bool fallback) const {
    if (!has(key)) return fallback;
    const json& v = object_[key];
    if (!v.is_boolean()) throw bad_input(where(key) + " must be true or false, got " + v.dump());
    return v.get<bool>();
  }
  std::string string(const std::string& key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    const json& v = object_[key];
    if (!v.is_string()) throw bad_input(where(key) + " must be a string, got " + v.dump());
    return v.get<std::string>();
  }

 private:
  const json& object_;
  std::string source_, prefix_;
};

void refuse_variant_keys(const json& object, const std::string& source, const std::string& prefix, bool dflash2) {
  for (const auto& item : object.items()) {
    if (dflash2 && is_dflash2_key(item.key())) continue;
    if (auto variant = variant_of_key(item.key())) {
      throw bad_input(source + ": config key '" + prefix + item.key() + "' belongs to " + *variant +
                      (*variant == "DFlash2" ? ", but 'architectures' does not name DFlash2DraftModel; refusing"
                                             : ", which this harness does not implement; refusing"));
    }
  }
}

// One rope_scaling / rope_parameters object (docs/spec/drafter.md §4). Returns its theta when it has one.
std::optional<double> parse_rope_object(const json& object, const std::string& source, const std::string& key,
                                        int max_position_embeddings, RopeConfig* rope) {
  const std::string prefix = key + ".";
  if (!object.is_object())
    throw bad_input(source + ": key '" + key + "' must be an object or null, got " + object.dump());
  for (const auto& item : object.items()) {
    if (!kRopeKeys.count(item.key())) {
      throw bad_input(source + ": unknown key '" + prefix + item.key() + "' may change the RoPE math; refusing");
    }
  }
  Fields f(object, source, prefix);
  std::string type = f.string("rope_type", "");
  const std::string legacy_type = f.string("type", "");
  if (!type.empty() && !legacy_type.empty() && type != legacy_type) {
    throw bad_input(source + ": keys '" + prefix + "rope_type' ('" + type + "') and '" + prefix + "type' ('" +
                    legacy_type + "') disagree");
  }
  if (type.empty()) type = legacy_type;
  if (type.empty()) throw bad_input(source + ": key '" + key + "' has neither 'rope_type' nor 'type'");

  std::optional<double> theta;
  if (f.has("rope_theta")) theta = f.number("rope_theta", 0.0);

  if (type == "default") {
    for (const char* yarn_key : {"factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
                                 "attention_factor", "truncate", "mscale", "mscale_all_dim"}) {
      if (object.contains(yarn_key)) {
        throw bad_input(f.where(yarn_key) +
                        " has no meaning for rope_type 'default'; refusing rather than ignoring it");
      }
    }
    rope->type = RopeConfig::Type::kDefault;
    return theta;
  }
  if (type != "yarn") {
    throw bad_input(f.where(object.contains("rope_type") ? "rope_type" : "type") + ": rope type '" + type +
                    "' is not supported (default or yarn)");
  }
  rope->type = RopeConfig::Type::kYarn;
  if (!f.has("factor")) throw bad_input(source + ": key '" + prefix + "factor' is required for YaRN");
  rope->factor = f.number("factor", 1.0);
  if (rope->factor < 1.0)
    throw bad_input(f.where("factor") + " must be >= 1 for YaRN, got " + std::to_string(rope->factor));
  rope->original_max_position_embeddings = f.int32("original_max_position_embeddings", max_position_embeddings);
  if (rope->original_max_position_embeddings < 1) {
    throw bad_input(f.where("original_max_position_embeddings") + " must be positive");
  }
  // Hugging Face versions differ here: some replace `factor` by max_position_embeddings /
  // original_max_position_embeddings when the latter is given, some do not. Only a config on
  // which both readings agree is accepted.
  if (f.has("original_max_position_embeddings")) {
    const double ratio = static_cast<double>(max_position_embeddings) / rope->original_max_position_embeddings;
    if (ratio != rope->factor) {
      std::ostringstream message;
      message << f.where("factor") << " = " << rope->factor << " disagrees with max_position_embeddings / " << prefix
              << "original_max_position_embeddings = " << max_position_embeddings << " / "
              << rope->original_max_position_embeddings << " = " << ratio
              << "; Hugging Face versions differ on which applies, refusing";
      throw bad_input(message.str());
    }
  }
  rope->beta_fast = f.number("beta_fast", 32.0);
  rope->beta_slow = f.number("beta_slow", 1.0);
  if (rope->beta_fast <= 0 || rope->beta_slow <= 0)
    throw bad_input(source + ": YaRN beta_fast and beta_slow must be positive");
  rope->truncate = f.boolean("truncate", true);
  rope->has_attention_factor = f.has("attention_factor");
  rope->attention_factor = f.number("attention_factor", 1.0);
  if (rope->has_attention_factor && rope->attention_factor <= 0)
    throw bad_input(f.where("attention_factor") + " must be positive");
  rope->mscale = f.number("mscale", 0.0);
  rope->mscale_all_dim = f.number("mscale_all_dim", 0.0);
  return theta;
}

bool same_rope(const RopeConfig& a, const RopeConfig& b) {
  return a.type == b.type && a.factor == b.factor &&
         a.original_max_position_embeddings == b.original_max_position_embeddings && a.beta_fast == b.beta_fast &&
         a.beta_slow == b.beta_slow && a.truncate == b.truncate && a.has_attention_factor == b.has_attention_factor &&
         a.attention_factor == b.attention_factor && a.mscale == b.mscale && a.mscale_all_dim == b.mscale_all_dim;
}

std::string ids_string(const std::vector<int>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? ", " : "") + std::to_string(ids[i]);
  return s + "]";
}


// A config is DFlash2 when `architectures` names DFlash2DraftModel (docs/spec/dflash2.md §1); its
// dflash_config keys are then required (a missing one is refused by name when read).
bool names_dflash2(const json& config, const std::string& source) {
  if (!config.contains("architectures")) return false;
  const json& arch = config["architectures"];
  if (!arch.is_array()) return false;
  for (const json& a : arch) {
    if (a.is_string() && a.get<std::string>() == "DFlash2DraftModel") {
      if (arch.size() != 1) {
        throw bad_input(source + ": key 'architectures' = " + arch.dump() +
                        " names DFlash2DraftModel among others; which model this is is ambiguous");
      }
      return true;
    }
  }
  return false;
}

void refuse_dflash2_v1_keys(const json& object, const std::string& source, const std::string& prefix) {
  const Fields f(object, source, prefix);
  for (const auto& item : object.items()) {
    const std::string& key = item.key();
    if (kDflash2RefusedKeys.count(key)) {
      throw bad_input(f.where(key) + " is not part of DFlash2 v1 (window and causality come from layer_types, "
                                     "sliding_window and is_causal); refusing");
    }
  }
  if (f.has("sample_from_anchor") && f.boolean("sample_from_anchor", false))
    throw bad_input(f.where("sample_from_anchor") + " is true; DFlash2 v1 drafts from the mask rows; refusing");
  if (f.has("logit_scale") && f.number("logit_scale", 1.0) != 1.0)
    throw bad_input(f.where("logit_scale") + " is not 1; where DFlash2 applies it is ambiguous; refusing");
}

// `layer_types`: an array of one entry per layer, or a refusal naming the key.
const json& layer_types(const json& config, const Fields& top, int num_layers) {
  const json& types = config["layer_types"];
  if (!types.is_array()) throw bad_input(top.where("layer_types") + " must be an array");
  if (static_cast<int>(types.size()) != num_layers) {
    throw bad_input(top.where("layer_types") + " has " + std::to_string(types.size()) + " entries for " +
                    std::to_string(num_layers) + " layers");
  }
  return types;
}

void refuse_plain_sliding(const json& config, const Fields& top, int num_layers) {
  // Plain DFlash has no sliding-window attention (docs/spec/drafter.md §1): refuse rather than run it as full attention.
  if (top.boolean("use_sliding_window", false)) {
    throw bad_input(
        top.where("use_sliding_window") + " is true" +
        (top.has("sliding_window") ? " with sliding_window " + config["sliding_window"].dump() : std::string()) +
        ": sliding-window attention exists only in DFlash2 drafters; refusing");
  }
  if (top.has("sliding_window")) top.integer("sliding_window", 0);  // type check only: inert without use_sliding_window
  if (top.has("is_causal") && top.boolean("is_causal", false))
    throw bad_input(top.where("is_causal") + " is true; DFlash attends bidirectionally in the block; refusing");
  if (!top.has("layer_types")) return;
  const json& types = layer_types(config, top, num_layers);
  for (size_t i = 0; i < types.size(); ++i) {
    if (!types[i].is_string() || types[i].get<std::string>() != "full_attention") {
      throw bad_input(top.where("layer_types") + "[" + std::to_string(i) + "] is " + types[i].dump() +
                      "; only full_attention layers exist in plain DFlash drafters; refusing");
    }
  }
}

// layer_types, sliding_window and is_causal of a DFlash2 drafter (docs/spec/dflash2.md §1).
void parse_dflash2_attention(const json& config, const Fields& top, int num_layers, Dflash2Config* d) {
  if (!top.has("is_causal")) {
    throw bad_input(top.where("is_causal") +
                    " is missing; DFlash2 needs it false (absent, engines make sliding layers causal); refusing");
  }
  if (top.boolean("is_causal", false))
    throw bad_input(top.where("is_causal") + " is true; DFlash2 v1 is non-causal; refusing");
  d->sliding.assign(static_cast<size_t>(num_layers), false);
  if (top.has("layer_types")) {
    const json& types = layer_types(config, top, num_layers);
    for (size_t i = 0; i < types.size(); ++i) {
      const std::string type = types[i].is_string() ? types[i].get<std::string>() : std::string();
      if (type != "full_attention" && type != "sliding_attention") {
        throw bad_input(top.where("layer_types") + "[" + std::to_string(i) + "] is " + types[i].dump() +
                        "; expected \"sliding_attention\" or \"full_attention\"; refusing");
      }
      d->sliding[i] = type == "sliding_attention";
    }
  }
  if (top.has("use_sliding_window")) top.boolean("use_sliding_window", false);  // informational (type check only)
  if (d->any_sliding()) {
    if (!top.has("sliding_window"))
      throw bad_input(top.where("sliding_window") + " is missing; layer_types has sliding_attention layers");
    d->sliding_window = top.int32("sliding_window", 0);
    if (d->sliding_window < 1)
      throw bad_input(top.where("sliding_window") + " must be >= 1, got " + std::to_string(d->sliding_window));
  } else if (top.has("sliding_window")) {
    top.integer("sliding_window", 0);  // type check only: no layer slides
  }
}

// The conv and selector keys of dflash_config and the three scalars (docs/spec/dflash2.md §1).
void parse_dflash2_selector(const json& config, const Fields& df, const Fields& top, const DrafterConfig& c,
                            Dflash2Config* d) {
  auto required = [&](const char* key) {
    if (!df.has(key)) throw bad_input(df.where(key) + " is missing; a DFlash2 drafter requires it");
    return df.int32(key, 0);
  };
  d->enabled = true;
  d->conv_kernel_size = required("conv_kernel_size");
  if (d->conv_kernel_size < 1 || d->conv_kernel_size > c.block_size) {
    throw bad_input(df.where("conv_kernel_size") + " = " + std::to_string(d->conv_kernel_size) +
                    " must be in [1, block_size " + std::to_string(c.block_size) + "]");
  }
  d->conv_group_size = required("conv_group_size");
  if (d->conv_group_size < 1 || c.hidden_size % d->conv_group_size != 0) {
    throw bad_input(df.where("conv_group_size") + " = " + std::to_string(d->conv_group_size) +
                    " must be positive and divide hidden_size " + std::to_string(c.hidden_size));
  }
  d->selector_rank = required("selector_rank");
  if (d->selector_rank < 1)
    throw bad_input(df.where("selector_rank") + " must be >= 1, got " + std::to_string(d->selector_rank));
  d->selector_top_k = required("selector_top_k");
  if (d->selector_top_k < 1 || d->selector_top_k > c.vocab_size) {
    throw bad_input(df.where("selector_top_k") + " = " + std::to_string(d->selector_top_k) +
                    " must be in [1, vocab_size " + std::to_string(c.vocab_size) + "]");
  }
  d->output_multiplier = df.number("output_multiplier", 1.0);
  if (!(d->output_multiplier > 0))
    throw bad_input(df.where("output_multiplier") + " must be > 0 (a non-positive one reverses the ranking)");
  d->final_logit_softcapping = df.number("final_logit_softcapping", 0.0);
  if (df.has("final_logit_softcapping") && !(d->final_logit_softcapping > 0))
    throw bad_input(df.where("final_logit_softcapping") + " must be > 0 (null or absent turns it off)");
  d->input_embedding_scale = df.number("input_embedding_scale", 1.0);
  if (!(d->input_embedding_scale > 0)) throw bad_input(df.where("input_embedding_scale") + " must be > 0");
  for (const char* key : kDflash2Scalars) {
    if (!top.has(key)) continue;
    if (!df.has(key) || top.number(key, 0.0) != df.number(key, 0.0)) {
      throw bad_input(top.where(key) + " = " + config[key].dump() + " differs from 'dflash_config." + key +
                      "' (DFlash2 reads dflash_config only); refusing");
    }
  }
  for (const char* key : {"draft_vocab_size", "target_hidden_size"}) {
    for (const Fields* f : {&top, &df}) {
      if (!f->has(key)) continue;
      const int want = std::string(key) == "draft_vocab_size" ? c.vocab_size : c.hidden_size;
      if (f->int32(key, 0) != want) {
        throw bad_input(f->where(key) + " = " + std::to_string(f->int32(key, 0)) + " differs from " +
                        (want == c.vocab_size ? "vocab_size " : "hidden_size ") + std::to_string(want) +
                        "; DFlash2 v1 codebooks and context rows need them equal; refusing");
      }
    }
  }
}

}  // namespace

std::vector<int> derive_target_layer_ids(int num_draft_layers, int num_target_layers) {
  // Upstream z-lab DFlash build_target_layer_ids(num_target_layers, num_draft_layers):
  //   one drafter layer -> [T // 2]; otherwise start = 1, end = T - 3 and
  //   ids[i] = int(round(start + i * (end - start) / (L - 1))) with Python's round (half to even).
  // Checked against the oracle derived-layer-ids (L = 3, T = 20 -> 3 ids, fc width 3·Ht) and the
  // published Qwen3-8B drafter (L = 5, T = 36 -> 1, 9, 17, 25, 33).
  if (num_draft_layers < 1) throw bad_input("derive_target_layer_ids: the drafter needs at least one layer");
  if (num_target_layers < 1) throw bad_input("derive_target_layer_ids: num_target_layers must be positive");
  if (num_draft_layers == 1) return {num_target_layers / 2};
  const int start = 1;
  const int end = num_target_layers - 3;
  const int span = end - start;
  std::vector<int> ids(num_draft_layers);
  for (int i = 0; i < num_draft_layers; ++i) {
    // Python: (i * span) / (L - 1) is a true division in double, then + start, then round.
    const double value = start + static_cast<double>(i * span) / (num_draft_layers - 1);
    ids[i] = static_cast<int>(std::nearbyint(value));  // default rounding mode: nearest, ties to even
  }
  return ids;
}

void check_config_limits(const DrafterConfig& c, const std::string& source) {
  const auto key = [&](const std::string& name) { return source + ": key '" + name + "'"; };
  limits::check_at_most(key("hidden_size"), c.hidden_size, limits::kHiddenSize);
  limits::check_at_most(key("intermediate_size"), c.intermediate_size, limits::kIntermediateSize);
  limits::check_at_most(key("num_hidden_layers"), c.num_layers, limits::kLayers);
  limits::check_at_most(key("num_attention_heads"), c.num_heads, limits::kHeads);
  limits::check_at_most(key("num_key_value_heads"), c.num_kv_heads, limits::kHeads);
  limits::check_at_most(key("head_dim"), c.head_dim, limits::kHeadDim);
  limits::check_at_most(key("vocab_size"), c.vocab_size, limits::kVocabSize);
  limits::check_at_most(key("block_size"), c.block_size, limits::kBlockSize);
  limits::check_at_most(key("max_position_embeddings"), c.max_position_embeddings, limits::kPositions);
  limits::check_at_most(key("dflash_config.target_layer_ids") + " count",
                        static_cast<int64_t>(c.target_layer_ids.size()), limits::kTargetLayers);
  for (int id : c.target_layer_ids) {
    limits::check_at_most(key("dflash_config.target_layer_ids") + " entry", id, limits::kTargetLayers - 1);
  }
  // nkv·d <= nh·d: num_attention_heads is a multiple of num_key_value_heads.
  limits::checked_product(key("num_attention_heads") + " x 'head_dim'", c.num_heads, c.head_dim,
                          limits::kProjectionDim);
  limits::checked_product(source + ": target layers x target hidden size (nT·Ht)",
                          static_cast<int64_t>(c.target_layer_ids.size()), c.target_hidden_size,
                          limits::kCtxFeatureDim);
}

DrafterConfig parse_drafter_config(const json& config, const std::string& source) {
  if (!config.is_object()) throw bad_input(source + ": the config is not a JSON object");
  const bool dflash2 = names_dflash2(config, source);
  refuse_variant_keys(config, source, "", dflash2);
  if (dflash2) refuse_dflash2_v1_keys(config, source, "");
  for (const auto& item : config.items()) {
    const bool dflash2_key = dflash2 && (kDflash2NeutralKeys.count(item.key()) ||
                                         std::find(std::begin(kDflash2Scalars), std::end(kDflash2Scalars),
                                                   item.key()) != std::end(kDflash2Scalars));
    if (!kMathKeys.count(item.key()) && !kInertKeys.count(item.key()) && !dflash2_key) {
      throw bad_input(source + ": unknown config key '" + item.key() + "' may change the math; refusing");
    }
  }
  const Fields top(config, source, "");
  DrafterConfig c;
  // Checked here so that a config is refused whole; the weights' loader applies it.
  if (config.contains("quantization_config") && !config["quantization_config"].is_null()) {
    fp8_declaration_from_quantization_config(config["quantization_config"], source + ": quantization_config");
  }

  // Geometry, with Hugging Face Qwen3Config defaults for missing keys. Two follow docs/spec/drafter.md
  // rather than Qwen3Config: num_key_value_heads falls back to num_attention_heads and head_dim
  // to hidden_size / num_attention_heads (Qwen3Config's literal head_dim default is 128).
  c.hidden_size = top.int32("hidden_size", 4096);
  c.intermediate_size = top.int32("intermediate_size", 22016);
  c.num_layers = top.int32("num_hidden_layers", 32);
  c.num_heads = top.int32("num_attention_heads", 32);
  c.num_kv_heads = top.int32("num_key_value_heads", c.num_heads);
  c.vocab_size = top.int32("vocab_size", 151936);
  c.max_position_embeddings = top.int32("max_position_embeddings", 32768);
  c.rms_norm_eps = top.number("rms_norm_eps", 1e-6);
  c.attention_bias = top.boolean("attention_bias", false);
  c.tie_word_embeddings = top.boolean("tie_word_embeddings", false);

  auto require_positive = [&](const char* key, int64_t value) {
    if (value <= 0) throw bad_input(top.where(key) + " must be positive, got " + std::to_string(value));
  };
  require_positive("hidden_size", c.hidden_size);
  require_positive("intermediate_size", c.intermediate_size);
  require_positive("num_hidden_layers", c.num_layers);
  require_positive("num_attention_heads", c.num_heads);
  require_positive("num_key_value_heads", c.num_kv_heads);
  require_positive("vocab_size", c.vocab_size);
  require_positive("max_position_embeddings", c.max_position_embeddings);
  check_config_limits(c, source);  // the sizes read so far, before anything is derived from them
  if (!top.has("head_dim") && c.hidden_size % c.num_heads != 0) {
    throw bad_input(source + ": head_dim is absent and hidden_size " + std::to_string(c.hidden_size) +
                    " is not a multiple of num_attention_heads " + std::to_string(c.num_heads));
  }
  c.head_dim = top.int32("head_dim", c.hidden_size / c.num_heads);
  require_positive("head_dim", c.head_dim);
  if (c.head_dim % 2 != 0)
    throw bad_input(top.where("head_dim") + " must be even for rotate-half RoPE, got " + std::to_string(c.head_dim));
  if (c.num_heads % c.num_kv_heads != 0) {
    throw bad_input(top.where("num_attention_heads") + " = " + std::to_string(c.num_heads) +
                    " is not a multiple of num_key_value_heads = " + std::to_string(c.num_kv_heads));
  }
  if (!(c.rms_norm_eps > 0)) throw bad_input(top.where("rms_norm_eps") + " must be positive");
  c.target_hidden_size = c.hidden_size;

  const std::string act = top.string("hidden_act", "silu");
  if (act != "silu") throw bad_input(top.where("hidden_act") + " is '" + act + "'; only silu is supported; refusing");

  if (dflash2) {
    parse_dflash2_attention(config, top, c.num_layers, &c.dflash2);
  } else {
    refuse_plain_sliding(config, top, c.num_layers);
  }

  // RoPE: theta from the top level or from inside rope_parameters / rope_scaling; every source
  // that names one must agree.
  std::vector<std::pair<std::string, double>> thetas;
  if (top.has("rope_theta")) thetas.emplace_back("rope_theta", top.number("rope_theta", 0.0));
  std::optional<RopeConfig> from_parameters, from_scaling;
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!top.has(key)) continue;
    RopeConfig rope;
    if (auto theta = parse_rope_object(config[key], source, key, c.max_position_embeddings, &rope)) {
      thetas.emplace_back(std::string(key) + ".rope_theta", *theta);
    }
    (std::string(key) == "rope_parameters" ? from_parameters : from_scaling) = rope;
  }
  if (from_parameters && from_scaling && !same_rope(*from_parameters, *from_scaling)) {
    throw bad_input(source + ": keys 'rope_parameters' and 'rope_scaling' describe different RoPE; refusing");
  }
  c.rope = from_parameters ? *from_parameters : from_scaling ? *from_scaling : RopeConfig{};
  c.rope.theta = thetas.empty() ? 10000.0 : thetas.front().second;
  for (const auto& [key, theta] : thetas) {
    if (theta != c.rope.theta) {
      std::ostringstream message;
      message << source << ": key '" << thetas.front().first << "' = " << c.rope.theta << " and key '" << key
              << "' = " << theta << " disagree";
      throw bad_input(message.str());
    }
  }
  if (!(c.rope.theta > 0)) throw bad_input(source + ": rope_theta must be positive");

  // DFlash keys.
  const std::string dflash_key = "dflash_config";
  if (!top.has(dflash_key)) throw bad_input(source + ": key 'dflash_config' is missing (it carries mask_token_id)");
  const json& dflash = config[dflash_key];
  if (!dflash.is_object()) throw bad_input(top.where(dflash_key) + " must be an object");
  refuse_variant_keys(dflash, source, "dflash_config.", dflash2);
  if (dflash2) refuse_dflash2_v1_keys(dflash, source, "dflash_config.");
  for (const auto& item : dflash.items()) {
    if (!kDflashKeys.count(item.key()) && !(dflash2 && kDflash2ConfigKeys.count(item.key()))) {
      throw bad_input(source + ": unknown key 'dflash_config." + item.key() + "' may change the math; refusing");
    }
  }
  const Fields df(dflash, source, "dflash_config.");

  if (df.has("block_size"))
    c.block_size = df.int32("block_size", 0);  // the nested key wins
  else if (top.has("block_size"))
    c.block_size = top.int32("block_size", 0);
  else
    throw bad_input(source + ": key 'block_size' is missing (top level or dflash_config.block_size)");
  if (c.block_size < 1) throw bad_input(source + ": block_size must be positive, got " + std::to_string(c.block_size));
  if (dflash2) parse_dflash2_selector(config, df, top, c, &c.dflash2);

  if (!df.has("mask_token_id")) throw bad_input(source + ": key 'dflash_config.mask_token_id' is missing");
  c.mask_token_id = df.int32("mask_token_id", 0);
  if (c.mask_token_id < 0 || c.mask_token_id >= c.vocab_size) {
    throw bad_input(df.where("mask_token_id") + " = " + std::to_string(c.mask_token_id) +
                    " is outside [0, vocab_size " + std::to_string(c.vocab_size) + ")");
  }

  const bool has_num_target = top.has("num_target_layers");
  const int num_target_layers = top.int32("num_target_layers", 0);
  if (has_num_target && num_target_layers < 1) throw bad_input(top.where("num_target_layers") + " must be positive");
  if (has_num_target) limits::check_at_most(top.where("num_target_layers"), num_target_layers, limits::kTargetLayers);
  if (df.has("target_layer_ids")) {
    const json& ids = dflash["target_layer_ids"];
    if (!ids.is_array() || ids.empty())
      throw bad_input(df.where("target_layer_ids") + " must be a non-empty array of integers");
    for (size_t i = 0; i < ids.size(); ++i) {
      if (!ids[i].is_number_integer() || ids[i].get<int64_t>() > std::numeric_limits<int>::max()) {
        throw bad_input(df.where("target_layer_ids") + "[" + std::to_string(i) +
                        "] is not an integer: " + ids[i].dump());
      }
      c.target_layer_ids.push_back(static_cast<int>(ids[i].get<int64_t>()));
      limits::check_at_most(df.where("target_layer_ids") + " count", static_cast<int64_t>(c.target_layer_ids.size()),
                            limits::kTargetLayers);
    }
  } else if (has_num_target) {
    c.target_layer_ids = derive_target_layer_ids(c.num_layers, num_target_layers);
  } else {
    throw bad_input(source + ": neither 'dflash_config.target_layer_ids' nor 'num_target_layers' is given");
  }
  for (int id : c.target_layer_ids) {
    if (id < 0) {
      throw bad_input(source + ": target layer id " + std::to_string(id) + " in " + ids_string(c.target_layer_ids) +
                      " is negative");
    }
    if (has_num_target && id >= num_target_layers) {
      throw bad_input(source + ": target layer id " + std::to_string(id) + " in " + ids_string(c.target_layer_ids) +
                      " is past the target's num_target_layers " + std::to_string(num_target_layers));
    }
  }
  check_config_limits(c, source);
  return c;
}

DrafterConfig load_drafter_config(const std::string& path) {
  std::string file = path;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) file = (std::filesystem::path(path) / "config.json").string();
  return parse_drafter_config(read_json_file_strict(file), file);
}

}  // namespace dflash
