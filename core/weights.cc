#include "core/weights.h"

#include <algorithm>
#include <array>
#include <cmath>
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

// Calls visit(name, expected shape, tensor) for every drafter tensor of docs/spec/drafter.md §2, in
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
    if (c.dflash2.enabled) {
      const int64_t k = c.dflash2.conv_kernel_size, coef = c.conv_coef_dim();
      visit(p + "attention_conv.base_kernel", std::vector<int64_t>{2, k, H}, layer.attn_conv_base);
      visit(p + "attention_conv.kernel_projection.weight", std::vector<int64_t>{coef, H}, layer.attn_conv_proj);
      visit(p + "mlp_conv.base_kernel", std::vector<int64_t>{2, k, H}, layer.mlp_conv_base);
      visit(p + "mlp_conv.kernel_projection.weight", std::vector<int64_t>{coef, H}, layer.mlp_conv_proj);
    }
  }
  if (c.dflash2.enabled) {
    const int64_t r = c.dflash2.selector_rank, V = c.vocab_size;
    visit("candidate_selector.hidden_projection.weight", std::vector<int64_t>{r, H}, w.selector.hidden_projection);
    visit("candidate_selector.predecessor_codebook", std::vector<int64_t>{V, r}, w.selector.predecessor_codebook);
    visit("candidate_selector.successor_codebook", std::vector<int64_t>{V, r}, w.selector.successor_codebook);
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
  if (bad >= 0) {
    throw bad_input(where + " " + shape_string(t.shape) + ": " + (std::isnan(t.values[bad]) ? "NaN" : "Inf") + " at " +
                    element_location(t.shape, bad));
  }
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

// The directory of a target path (a directory, or the directory of a sharded index) where its
// config.json / hf_quant_config.json may lie; none for a single .safetensors file.
std::optional<fs::path> target_dir_of(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return fs::path(path);
  if (path.size() > 5 && path.compare(path.size() - 5, 5, ".json") == 0) return fs::path(path).parent_path();
  return std::nullopt;
}

// The target directory's config.json, if there is one.
std::optional<nlohmann::json> target_config_json(const std::string& path) {
  const auto dir = target_dir_of(path);
  std::error_code ec;
  if (!dir || !fs::exists(*dir / "config.json", ec)) return std::nullopt;
  return read_json_file_strict((*dir / "config.json").string());
}

bool target_config_says_tied(const std::string& path) {
  const auto config = target_config_json(path);
  if (!config || !config->is_object() || !config->contains("tie_word_embeddings")) return false;
  const auto& tied = (*config)["tie_word_embeddings"];
  if (!tied.is_boolean()) {
    throw bad_input((*target_dir_of(path) / "config.json").string() + ": key 'tie_word_embeddings' must be true or false");
  }
  return tied.get<bool>();
}

// What declares the lm_head's format: the fixture's fields, else the target directory's
// config.json quantization_config and hf_quant_config.json (both, when both are there, must agree).
LmHeadDeclaration declare_lm_head(const TargetSource& target) {
  const std::string fixture_where = target.manifest + ": target";
  std::optional<LmHeadDeclaration> from_fixture_config;
  if (!target.quantization_config.is_null()) {
    from_fixture_config = declaration_from_quantization_config(target.quantization_config,
                                                               fixture_where + ".quantization_config");
  }
  if (!target.lm_head_format.empty()) {
    const bool nvfp4 = target.lm_head_format == "nvfp4";
    if (from_fixture_config && from_fixture_config->nvfp4 != nvfp4) {
      throw bad_input(fixture_where + ".lm_head_format is " + in_quotes(target.lm_head_format) + " but " +
                      from_fixture_config->source + (from_fixture_config->nvfp4 ? " declares" : " does not declare") +
                      " an NVFP4 lm_head");
    }
    return {nvfp4, fixture_where + ".lm_head_format"};
  }
  if (from_fixture_config) return *from_fixture_config;

  std::vector<LmHeadDeclaration> found;
  if (const auto config = target_config_json(target.path); config && config->is_object() &&
                                                           config->contains("quantization_config")) {
    found.push_back(declaration_from_quantization_config(
        (*config)["quantization_config"], (*target_dir_of(target.path) / "config.json").string() + ": quantization_config"));
  }
  std::error_code ec;
  if (const auto dir = target_dir_of(target.path); dir && fs::exists(*dir / "hf_quant_config.json", ec)) {
    const std::string path = (*dir / "hf_quant_config.json").string();
    found.push_back(declaration_from_hf_quant_config(read_json_file_strict(path), path));
  }
  if (found.size() == 2 && found[0].nvfp4 != found[1].nvfp4) {
    throw bad_input("target " + target.path + ": " + found[0].source + " and " + found[1].source +
                    " disagree on whether the lm_head is NVFP4");
  }
  if (found.empty()) return {false, "target " + target.path + ": no quantization declaration"};
  return found.front();
}

// The target's head: NVFP4 when declared and stored so (they must agree), else a float tensor.
void load_lm_head(const DrafterConfig& config, const TargetSource& target, const TensorStore& store,
                  const std::string& name, DrafterWeights* w) {
  const LmHeadDeclaration declaration = declare_lm_head(target);
  const NvFp4Names names = target.nvfp4_names ? *target.nvfp4_names : NvFp4Names::beside(name);
  const std::string prefix = module_of(name);
  for (const char* other : {".weight_packed", ".weight_global_scale"}) {
    if (store.has(prefix + other)) {
      throw bad_input("target " + store.description() + ": tensor " + in_quotes(prefix + other) +
                      " is compressed-tensors NVFP4, which is not supported (only ModelOpt's layout is)");
    }
  }
  const DType dtype = store.file_of(name).info(name).dtype;
  if (dtype == DType::kU8) {
    if (!declaration.nvfp4) {
      throw bad_input("target " + store.description() + ": lm_head " + in_quotes(name) +
                      " is U8 (packed NVFP4?) but nothing declares an NVFP4 lm_head (" + declaration.source + ")");
    }
    w->lm_head_nvfp4 = load_nvfp4_head(store, names, config.vocab_size, config.hidden_size);
    return;
  }
  if (declaration.nvfp4) {
    throw bad_input("target " + store.description() + ": " + declaration.source + " declares an NVFP4 lm_head but " +
                    in_quotes(name) + " has dtype " + dtype_name(dtype) + " (NVFP4 needs U8)");
  }
  for (const std::string& scale : {names.weight_scale, names.weight_scale_2}) {
    if (store.has(scale)) {
      throw bad_input("target " + store.description() + ": tensor " + in_quotes(scale) + " is present but " +
                      declaration.source + " declares no NVFP4 lm_head and " + in_quotes(name) + " is " +
                      dtype_name(dtype) + "; declaration and tensors must agree");
    }
  }
  w->lm_head = read_weight(store.file_of(name), name, {config.vocab_size, config.hidden_size}, "target");
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

// The seven projections of a layer with their stored FP8 codes, under their module names. `Layer` is
// LayerWeights, const or not.
template <class Layer>
auto fp8_projections(Layer& L) {
  using Slot = std::pair<const char*, std::pair<decltype(&L.q_proj), decltype(&L.q_proj_fp8)>>;
  return std::array<Slot, 7>{Slot{"self_attn.q_proj", {&L.q_proj, &L.q_proj_fp8}},
                             Slot{"self_attn.k_proj", {&L.k_proj, &L.k_proj_fp8}},
                             Slot{"self_attn.v_proj", {&L.v_proj, &L.v_proj_fp8}},
                             Slot{"self_attn.o_proj", {&L.o_proj, &L.o_proj_fp8}},
                             Slot{"mlp.gate_proj", {&L.gate_proj, &L.gate_proj_fp8}},
                             Slot{"mlp.up_proj", {&L.up_proj, &L.up_proj_fp8}},
                             Slot{"mlp.down_proj", {&L.down_proj, &L.down_proj_fp8}}};
}

// Where the stored FP8 codes of the projection `canonical_module` ("layers.3.mlp.up_proj") go.
std::optional<Fp8Stored>* fp8_slot(DrafterWeights& w, const std::string& canonical_module) {
  const size_t dot = canonical_module.find('.', 7);
  const size_t layer = std::stoul(canonical_module.substr(7, dot - 7));
  for (auto& [name, slot] : fp8_projections(w.layers.at(layer))) {
    if (canonical_module.compare(dot + 1, std::string::npos, name) == 0) return slot.second;
  }
  throw internal_error("fp8_slot: " + canonical_module + " is not a projection");
}

// Where the static input scale of the projection `canonical_module` goes (w8a8, LayerWeights).
std::optional<float>* input_scale_slot(DrafterWeights& w, const std::string& canonical_module) {
  const size_t dot = canonical_module.find('.', 7);
  LayerWeights& L = w.layers.at(std::stoul(canonical_module.substr(7, dot - 7)));
  const std::pair<const char*, std::optional<float>*> slots[] = {
      {"self_attn.q_proj", &L.q_input_scale}, {"self_attn.k_proj", &L.k_input_scale},
      {"self_attn.v_proj", &L.v_input_scale}, {"self_attn.o_proj", &L.o_input_scale},
      {"mlp.gate_proj", &L.gate_input_scale}, {"mlp.up_proj", &L.up_input_scale},
      {"mlp.down_proj", &L.down_input_scale}};
  for (const auto& [name, slot] : slots) {
    if (canonical_module.compare(dot + 1, std::string::npos, name) == 0) return slot;
  }
  throw internal_error("input_scale_slot: " + canonical_module + " is not a projection");
}

// A Linear module's weight, `stored` in the checkpoint, when the drafter may be a pre-quantized FP8 one
// (core/fp8_checkpoint.h): read as its codes and scales where the declaration quantizes it (true), left
// to read_weight where it does not (false). An FP8 weight nothing declares, and a declared module the
// harness keeps unquantized, are refused.
bool load_declared_fp8(const TensorStore& drafter, const Fp8Declaration* fp8, const std::string& canonical,
                       const std::string& stored, const std::vector<int64_t>& shape, Tensor& dest, DrafterWeights& w,
                       std::set<std::string>& consumed) {
  const SafetensorsFile& file = drafter.file_of(stored);
  const bool stored_fp8 = file.info(stored).dtype == DType::kF8E4M3;
  const std::string where = file.path() + ": tensor " + in_quotes(stored);
  if (fp8 == nullptr) {
    if (stored_fp8) {
      throw bad_input(where + " is F8_E4M3 but the drafter declares no quantization (no quantization_config in its "
                      "config.json, no hf_quant_config.json)");
    }
    return false;
  }
  const std::string module = module_of(canonical), stored_module = module_of(stored);
  const Fp8ModuleScheme scheme = fp8->scheme_of(stored_module);
  if (!scheme.quantized) {
    if (stored_fp8) throw bad_input(where + " is F8_E4M3 but " + scheme.why + " leaves it unquantized");
    return false;
  }
  if (!is_fp8_projection(module)) {
    throw bad_input(where + ": " + scheme.why + " quantizes " + in_quotes(module) +
                    ", which the harness keeps unquantized (only q/k/v/o/gate/up/down are FP8 projections, "
                    "docs/spec/drafter.md §6); list it in " + fp8->exclusion_key);
  }
  // Its scales are this module's whether or not they load, so a refusal below is reported once.
  for (const char* suffix : {".weight_scale", ".input_scale"}) consumed.insert(module + suffix);
  std::optional<Fp8Stored>& slot = *fp8_slot(w, module);
  slot = load_fp8_projection(drafter, stored_module, shape[0], shape[1], scheme, fp8->layout, &dest);
  // A static activation scale is what w8a8 quantizes this projection's input with (LayerWeights).
  if (slot->input_scale) *input_scale_slot(w, module) = *slot->input_scale;
  return true;
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
  // A pre-quantized FP8 drafter declares itself in its config.json or hf_quant_config.json.
  const std::optional<Fp8Declaration> fp8 = read_drafter_fp8_declaration(drafter_dir);
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
      const bool linear_weight = is_linear_module(module_of(name)) && module_of(name) != name;
      if (linear_weight && load_declared_fp8(drafter, fp8 ? &*fp8 : nullptr, name, it->second, shape, dest, w, consumed)) {
        return;
      }
      dest = read_weight(drafter.file_of(it->second), it->second, shape, "drafter");
    } catch (const HarnessError& e) {
      problems.push_back(e.what());
    }
  });
  for (const auto& [canonical, stored] : stored_by_canonical) {
    if (consumed.count(canonical)) continue;
    try {
      if (const auto why = explain_unused_quantization_tensor(canonical, fp8 ? &*fp8 : nullptr)) {
        problems.push_back("unused " + *why + " (" + drafter.file_of(stored).path() + ")");
        continue;
      }
    } catch (const HarnessError& e) {
      // A declaration that cannot decide this module (two groups target it) was reported at its weight.
      if (std::find(problems.begin(), problems.end(), e.what()) == problems.end()) problems.push_back(e.what());
      continue;
    }
    problems.push_back("unused tensor " + in_quotes(stored) + " in " + drafter.file_of(stored).path() +
                       " (not a tensor of this drafter config" +
                       (config.attention_bias ? std::string() : "; attention_bias is false") + ")");
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
  if (target_store.file_of(*embed_name).info(*embed_name).dtype == DType::kU8 ||
      target_store.has(module_of(*embed_name) + ".weight_scale")) {
    throw bad_input("target " + target_store.description() + ": embed_tokens " + in_quotes(*embed_name) +
                    " is quantized (NVFP4 embeddings are not supported; embed_tokens must be BF16, F16 or F32)");
  }
  w.embed_tokens = read_weight(target_store.file_of(*embed_name), *embed_name, vocab_shape, "target");
  const auto lm_head_name = find_target_name(target_store, target.lm_head_name, "lm_head");
  const bool tied = config.tie_word_embeddings || (!lm_head_name && (target.tied || target_config_says_tied(target.path)));
  if (tied) {
    if (target.lm_head_format == "nvfp4") {
      throw bad_input(target.manifest + ": target.lm_head_format is 'nvfp4' but the target ties lm_head to embed_tokens "
                      "(a tied target has no separate head to quantize)");
    }
    w.lm_head = w.embed_tokens;
  } else if (lm_head_name) {
    load_lm_head(config, target, target_store, *lm_head_name, &w);
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
  for (size_t l = 0; l < weights.layers.size(); ++l) {
    for (const auto& [name, slot] : fp8_projections(weights.layers[l])) {
      if (*slot.second) {
        validate_fp8_stored(**slot.second, *slot.first, "drafter weights: layers." + std::to_string(l) + "." + name);
      }
    }
  }
  const std::vector<int64_t> vocab_shape{config.vocab_size, config.hidden_size};
  check_shape("embed_tokens", weights.embed_tokens, vocab_shape);
  if (weights.nvfp4_head()) {
    if (!weights.lm_head.values.empty()) throw bad_input("drafter weights: both a float lm_head and an NVFP4 one are set");
    validate_nvfp4_head(weights.lm_head_nvfp4, config.vocab_size, config.hidden_size, "drafter weights: lm_head (NVFP4)");
  } else {
    check_shape("lm_head", weights.lm_head, vocab_shape);
  }
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

DrafterWeights assemble_drafter_tensors(
    const DrafterConfig& config, const std::function<Tensor(const std::string& name, const std::vector<int64_t>& shape)>& get) {
  DrafterWeights w;
  w.layers.resize(static_cast<size_t>(config.num_layers));
  for_each_drafter_tensor(config, w, [&](const std::string& name, const std::vector<int64_t>& shape, Tensor& t) {
    t = get(name, shape);
  });
  return w;
}

}  // namespace dflash
