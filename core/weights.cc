#include "core/weights.h"

#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include "core/error.h"
#include "core/json_file.h"
#include "core/safetensors.h"

namespace dflash {
namespace {

namespace fs = std::filesystem;

const std::string kModelPrefix = "model.";

std::string in_quotes(const std::string& name) { return "'" + name + "'"; }

bool has_model_prefix(const std::string& name) { return name.rfind(kModelPrefix, 0) == 0; }
std::string strip_model_prefix(const std::string& name) {
  return has_model_prefix(name) ? name.substr(kModelPrefix.size()) : name;
}

// Calls visit(name, expected shape, tensor) for every drafter tensor of drafter.md §2, in
// checkpoint naming without the "model." prefix. `Weights` is DrafterWeights, const or not.
template <class Weights, class Visit>
void for_each_drafter_tensor(const DrafterConfig& c, Weights& w, Visit visit) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, d = c.head_dim;
  const int64_t q = c.q_dim(), kv = c.kv_dim();
  visit("fc.weight", std::vector<int64_t>{H, c.ctx_feature_dim()}, w.fc);
  visit("hidden_norm.weight", std::vector<int64_t>{H}, w.hidden_norm);
  visit("norm.weight", std::vector<int64_t>{H}, w.norm);
  for (int l = 0; l < c.num_layers; ++l) {
    auto& layer = w.layers[l];
    const std::string p = "layers." + std::to_string(l) + ".";
    visit(p + "input_layernorm.weight", std::vector<int64_t>{H}, layer.input_layernorm);
    visit(p + "post_attention_layernorm.weight", std::vector<int64_t>{H}, layer.post_attention_layernorm);
    visit(p + "self_attn.q_proj.weight", std::vector<int64_t>{q, H}, layer.q_proj);
    visit(p + "self_attn.k_proj.weight", std::vector<int64_t>{kv, H}, layer.k_proj);
    visit(p + "self_attn.v_proj.weight", std::vector<int64_t>{kv, H}, layer.v_proj);
    visit(p + "self_attn.o_proj.weight", std::vector<int64_t>{H, q}, layer.o_proj);
    if (c.attention_bias) {
      visit(p + "self_attn.q_proj.bias", std::vector<int64_t>{q}, layer.q_bias);
      visit(p + "self_attn.k_proj.bias", std::vector<int64_t>{kv}, layer.k_bias);
      visit(p + "self_attn.v_proj.bias", std::vector<int64_t>{kv}, layer.v_bias);
      visit(p + "self_attn.o_proj.bias", std::vector<int64_t>{H}, layer.o_bias);
    }
    visit(p + "self_attn.q_norm.weight", std::vector<int64_t>{d}, layer.q_norm);
    visit(p + "self_attn.k_norm.weight", std::vector<int64_t>{d}, layer.k_norm);
    visit(p + "mlp.gate_proj.weight", std::vector<int64_t>{I, H}, layer.gate_proj);
    visit(p + "mlp.up_proj.weight", std::vector<int64_t>{I, H}, layer.up_proj);
    visit(p + "mlp.down_proj.weight", std::vector<int64_t>{H, I}, layer.down_proj);
  }
}

bool is_float_weight_dtype(DType dtype) {
  return dtype == DType::kBF16 || dtype == DType::kF16 || dtype == DType::kF32;
}

// Reads a weight after checking dtype and shape; NaN or Inf in a weight is refused too.
Tensor read_weight(const SafetensorsFile& file, const std::string& stored_name, const std::vector<int64_t>& shape,
                   const std::string& role) {
  const TensorInfo& info = file.info(stored_name);
  const std::string where = file.path() + ": tensor " + in_quotes(stored_name);
  if (!is_float_weight_dtype(info.dtype)) {
    throw bad_input(where + " has dtype " + dtype_name(info.dtype) + "; " + role + " weights must be BF16, F16 or F32");
  }
  if (info.shape != shape) {
    throw bad_input(where + ": wrong shape, expected " + shape_string(shape) + ", got " + shape_string(info.shape));
  }
  Tensor t = file.read_float(stored_name);
  const int64_t bad = first_non_finite(t.values.data(), t.numel());
  if (bad >= 0) throw bad_input(where + ": NaN or Inf at flat index " + std::to_string(bad));
  return t;
}

// A target tensor under its given name or with/without the "model." prefix.
std::optional<std::string> find_target_name(const TensorStore& store, const std::string& name, const char* role) {
  const std::string other = has_model_prefix(name) ? strip_model_prefix(name) : kModelPrefix + name;
  const bool given = store.has(name), alternate = store.has(other);
  if (given && alternate) {
    throw bad_input(store.description() + ": both " + in_quotes(name) + " and " + in_quotes(other) +
                    " are present; which is the " + role + " is ambiguous");
  }
  if (given) return name;
  if (alternate) return other;
  return std::nullopt;
}

// A target directory (or the directory of a sharded index) may carry its config.json.
bool target_config_says_tied(const std::string& path) {
  std::error_code ec;
  fs::path dir;
  if (fs::is_directory(path, ec))
    dir = path;
  else if (path.size() > 5 && path.compare(path.size() - 5, 5, ".json") == 0)
    dir = fs::path(path).parent_path();
  else
    return false;
  const fs::path config_path = dir / "config.json";
  if (!fs::exists(config_path, ec)) return false;
  const nlohmann::json config = read_json_file_strict(config_path.string());
  if (!config.is_object() || !config.contains("tie_word_embeddings")) return false;
  const auto& tied = config["tie_word_embeddings"];
  if (!tied.is_boolean()) throw bad_input(config_path.string() + ": key 'tie_word_embeddings' must be true or false");
  return tied.get<bool>();
}

void check_shape(const std::string& what, const Tensor& t, const std::vector<int64_t>& shape) {
  if (t.shape != shape) {
    throw bad_input("drafter weights: " + what + ": wrong shape, expected " + shape_string(shape) + ", got " +
                    shape_string(t.shape));
  }
  if (static_cast<int64_t>(t.values.size()) != t.numel()) {
    throw bad_input("drafter weights: " + what + ": " + std::to_string(t.values.size()) + " values for shape " +
                    shape_string(t.shape));
  }
}

}  // namespace

DrafterWeights load_drafter_weights(const DrafterConfig& config, const std::string& drafter_dir,
                                    const TargetSource& target) {
  DrafterWeights w;
  w.layers.resize(config.num_layers);

  // Drafter: every tensor of the checkpoint must be one the config asks for, and the reverse.
  const TensorStore drafter = TensorStore::open(drafter_dir);
  std::map<std::string, std::string> stored_by_canonical;
  for (const std::string& name : drafter.names()) {
    const std::string canonical = strip_model_prefix(name);
    auto [it, inserted] = stored_by_canonical.emplace(canonical, name);
    if (!inserted) {
      throw bad_input(drafter.description() + ": tensor " + in_quotes(canonical) + " is present both as " +
                      in_quotes(it->second) + " and as " + in_quotes(name));
    }
  }
  std::vector<std::string> problems;
  std::set<std::string> consumed;
  for_each_drafter_tensor(config, w, [&](const std::string& name, const std::vector<int64_t>& shape, Tensor& dest) {
    auto it = stored_by_canonical.find(name);
    if (it == stored_by_canonical.end()) {
      problems.push_back("missing tensor " + in_quotes(name) + " (expected shape " + shape_string(shape) + ")");
      return;
    }
    consumed.insert(name);
    try {
      dest = read_weight(drafter.file_of(it->second), it->second, shape, "drafter");
    } catch (const HarnessError& e) {
      problems.push_back(e.what());
    }
  });
  for (const auto& [canonical, stored] : stored_by_canonical) {
    if (!consumed.count(canonical)) {
      problems.push_back("unused tensor " + in_quotes(stored) + " in " + drafter.file_of(stored).path() +
                         " (not a tensor of this drafter config" +
                         (config.attention_bias ? std::string() : "; attention_bias is false") + ")");
    }
  }
  if (!problems.empty()) {
    std::string message = "drafter checkpoint " + drafter.description() + ": " + std::to_string(problems.size()) +
                          (problems.size() == 1 ? " problem: " : " problems: ");
    for (size_t i = 0; i < problems.size(); ++i) message += (i ? "; " : "") + problems[i];
    throw bad_input(message);
  }

  // Target: embed_tokens always; lm_head unless the embeddings are tied.
  const TensorStore target_store = TensorStore::open(target.path);
  const std::vector<int64_t> vocab_shape{config.vocab_size, config.hidden_size};
  const auto embed_name = find_target_name(target_store, target.embed_tokens_name, "embed_tokens");
  if (!embed_name) {
    throw bad_input("target " + target_store.description() + ": embed_tokens " + in_quotes(target.embed_tokens_name) +
                    " not found (also tried with/without the 'model.' prefix)");
  }
  w.embed_tokens = read_weight(target_store.file_of(*embed_name), *embed_name, vocab_shape, "target");
  const auto lm_head_name = find_target_name(target_store, target.lm_head_name, "lm_head");
  if (config.tie_word_embeddings) {
    w.lm_head = w.embed_tokens;
  } else if (lm_head_name) {
    w.lm_head = read_weight(target_store.file_of(*lm_head_name), *lm_head_name, vocab_shape, "target");
  } else if (target.tied || target_config_says_tied(target.path)) {
    w.lm_head = w.embed_tokens;
  } else {
    throw bad_input("target " + target_store.description() + ": lm_head " + in_quotes(target.lm_head_name) +
                    " not found (also tried with/without the 'model.' prefix), and neither the drafter config, the "
                    "fixture nor the target's config.json says the embeddings are tied");
  }

  validate_drafter_weights(config, w);
  return w;
}

void validate_drafter_weights(const DrafterConfig& config, const DrafterWeights& weights) {
  for (const NamedWeight& named : drafter_tensor_list(config, weights))
    check_shape(named.name, *named.tensor, named.shape);
  if (!config.attention_bias) {
    for (size_t l = 0; l < weights.layers.size(); ++l) {
      const LayerWeights& layer = weights.layers[l];
      const std::pair<const char*, const Tensor*> biases[] = {{"q_proj.bias", &layer.q_bias},
                                                              {"k_proj.bias", &layer.k_bias},
                                                              {"v_proj.bias", &layer.v_bias},
                                                              {"o_proj.bias", &layer.o_bias}};
      for (const auto& [name, bias] : biases) {
        if (!bias->shape.empty() || !bias->values.empty()) {
          throw bad_input("drafter weights: layers." + std::to_string(l) + ".self_attn." + name +
                          " is set but attention_bias is false");
        }
      }
    }
  }
  const std::vector<int64_t> vocab_shape{config.vocab_size, config.hidden_size};
  check_shape("embed_tokens", weights.embed_tokens, vocab_shape);
  check_shape("lm_head", weights.lm_head, vocab_shape);
}

std::vector<NamedWeight> drafter_tensor_list(const DrafterConfig& config, const DrafterWeights& weights) {
  if (static_cast<int>(weights.layers.size()) != config.num_layers) {
    throw bad_input("drafter weights: " + std::to_string(weights.layers.size()) + " layers, the config has " +
                    std::to_string(config.num_layers));
  }
  std::vector<NamedWeight> list;
  for_each_drafter_tensor(config, weights,
                          [&](const std::string& name, const std::vector<int64_t>& shape, const Tensor& t) {
                            list.push_back({name, shape, &t});
                          });
  return list;
}

}  // namespace dflash
