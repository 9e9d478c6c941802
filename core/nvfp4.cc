#include "core/nvfp4.h"

#include <cmath>
#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "core/fp8.h"

namespace dflash {
namespace {

using nlohmann::json;

std::string in_quotes(const std::string& s) { return "'" + s + "'"; }

// ModelOpt's spellings of the NVFP4 algorithm (W4A4 and weight-only).
bool is_nvfp4_algo(const std::string& algo) {
  return algo == "NVFP4" || algo == "W4A16_NVFP4" || algo == "NVFP4_W4A16";
}
bool is_mxfp4_algo(const std::string& algo) { return algo.find("MXFP4") != std::string::npos; }

// '*' matches any run of characters (ModelOpt's exclusion patterns); everything else literally.
bool glob_match(const char* pattern, const char* text) {
  if (*pattern == '\0') return *text == '\0';
  if (*pattern == '*') return glob_match(pattern + 1, text) || (*text != '\0' && glob_match(pattern, text + 1));
  return *text == *pattern && glob_match(pattern + 1, text + 1);
}

std::string string_at(const json& object, const std::string& key, const std::string& where) {
  if (!object.contains(key)) throw bad_input(where + ": missing key " + in_quotes(key));
  if (!object[key].is_string()) throw bad_input(where + "." + key + " must be a string, got " + object[key].dump());
  return object[key].get<std::string>();
}

// group_size, where given, must be 16 (NVFP4 is defined by 16-element blocks).
void check_group_size(const json& object, const std::string& where, bool required) {
  if (!object.contains("group_size")) {
    if (required) throw bad_input(where + ": missing key 'group_size' (required for NVFP4)");
    return;
  }
  const json& g = object["group_size"];
  if (!g.is_number_integer() || g.get<int64_t>() != kNvFp4GroupSize) {
    throw bad_input(where + ".group_size is " + g.dump() + "; NVFP4 blocks are 16 elements (group_size 16)");
  }
}

// The lm_head matched by one of the patterns of `list` (an array of strings), if any.
std::optional<std::string> excluding_pattern(const json& object, const std::string& key, const std::string& where) {
  if (!object.contains(key)) return std::nullopt;
  const json& list = object[key];
  if (!list.is_array()) throw bad_input(where + "." + key + " must be an array of module patterns");
  for (const json& p : list) {
    if (!p.is_string()) throw bad_input(where + "." + key + " must be an array of strings, holds " + p.dump());
    if (glob_match(p.get<std::string>().c_str(), "lm_head")) return p.get<std::string>();
  }
  return std::nullopt;
}

// ModelOpt's declaration (config.json quantization_config or hf_quant_config.json quantization):
// `exclusion_key` is "ignore" or "exclude_modules"; `legacy` is hf_quant_config.json, whose NVFP4
// form requires group_size, kv_cache_quant_algo and exclude_modules.
LmHeadDeclaration modelopt_declaration(const json& q, const std::string& where, const char* exclusion_key,
                                       bool legacy) {
  const std::string algo = string_at(q, "quant_algo", where);
  if (is_mxfp4_algo(algo)) throw bad_input(where + ".quant_algo is " + in_quotes(algo) + ": MXFP4 is not supported");
  if (algo == "MIXED_PRECISION") {
    const std::string layers_where = where + ".quantized_layers";
    if (!q.contains("quantized_layers") || !q["quantized_layers"].is_object()) {
      throw bad_input(where + ": quant_algo MIXED_PRECISION needs the object 'quantized_layers'");
    }
    const json& layers = q["quantized_layers"];
    if (!layers.contains("lm_head")) return {false, layers_where + " (no 'lm_head' entry)"};
    const std::string head_where = layers_where + ".lm_head";
    if (!layers["lm_head"].is_object()) throw bad_input(head_where + " must be an object");
    const std::string head_algo = string_at(layers["lm_head"], "quant_algo", head_where);
    if (is_mxfp4_algo(head_algo)) {
      throw bad_input(head_where + ".quant_algo is " + in_quotes(head_algo) + ": MXFP4 is not supported");
    }
    if (!is_nvfp4_algo(head_algo)) return {false, head_where + ".quant_algo"};
    check_group_size(layers["lm_head"], head_where, false);
    return {true, head_where + ".quant_algo"};
  }
  if (!is_nvfp4_algo(algo)) return {false, where + ".quant_algo"};
  check_group_size(q, where, legacy);
  if (legacy) {
    if (!q.contains("kv_cache_quant_algo")) throw bad_input(where + ": missing key 'kv_cache_quant_algo' (required for NVFP4)");
    if (!q.contains("exclude_modules")) throw bad_input(where + ": missing key 'exclude_modules' (required for NVFP4)");
  }
  if (q.contains("config_groups")) {
    const json& groups = q["config_groups"];
    if (!groups.is_object()) throw bad_input(where + ".config_groups must be an object");
    for (const auto& [name, group] : groups.items()) {
      if (group.is_object() && group.contains("weights") && group["weights"].is_object()) {
        check_group_size(group["weights"], where + ".config_groups." + name + ".weights", false);
      }
    }
  }
  if (const auto pattern = excluding_pattern(q, exclusion_key, where)) {
    return {false, where + "." + exclusion_key + " (pattern " + in_quotes(*pattern) + ")"};
  }
  return {true, where + ".quant_algo"};
}

uint32_t scalar_bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  return u;
}

// A one-element F32 tensor ([] or [1]); a split per-partition scale ([p], p > 1) is refused.
std::optional<float> read_scalar_scale(const TensorStore& store, const std::string& name, bool required,
                                       const char* role) {
  if (name.empty() || !store.has(name)) {
    if (required) {
      throw bad_input("target " + store.description() + ": missing tensor " + in_quotes(name) + " (the NVFP4 " + role +
                      " of the U8 lm_head)");
    }
    return std::nullopt;
  }
  const SafetensorsFile& file = store.file_of(name);
  const TensorInfo& info = file.info(name);
  const std::string where = file.path() + ": tensor " + in_quotes(name);
  if (info.dtype != DType::kF32) {
    throw bad_input(where + " has dtype " + dtype_name(info.dtype) + "; the NVFP4 " + role + " must be F32");
  }
  if (info.numel() != 1) {
    throw bad_input(where + " has shape " + shape_string(info.shape) + "; the NVFP4 " + role +
                    " must hold exactly one element ([] or [1]; a split per-partition scale is not supported)");
  }
  float value;
  std::memcpy(&value, file.data(name), sizeof value);
  if (!std::isfinite(value) || value <= 0.0f) {
    throw bad_input(where + " is " + std::to_string(value) + " (bits 0x" + [&] {
      char hex[9];
      std::snprintf(hex, sizeof hex, "%08x", scalar_bits(value));
      return std::string(hex);
    }() + "); the NVFP4 " + role + " must be finite and > 0");
  }
  return value;
}

}  // namespace

std::string module_of(const std::string& weight_name) {
  const std::string suffix = ".weight";
  const size_t n = weight_name.size();
  return n > suffix.size() && weight_name.compare(n - suffix.size(), suffix.size(), suffix) == 0
             ? weight_name.substr(0, n - suffix.size())
             : weight_name;
}

NvFp4Names NvFp4Names::beside(const std::string& weight) {
  NvFp4Names names;
  const std::string prefix = module_of(weight);
  names.weight = weight;
  names.weight_scale = prefix + ".weight_scale";
  names.weight_scale_2 = prefix + ".weight_scale_2";
  names.input_scale = prefix + ".input_scale";
  return names;
}

float e2m1_to_float(uint8_t code) {
  static const float kMagnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float m = kMagnitude[code & 7];
  return (code & 8) ? -m : m;
}

void nvfp4_block_scaled_row(const NvFp4Weight& w, int64_t n, float* out) {
  const uint8_t* codes = w.codes.data() + n * (w.cols / 2);
  const uint8_t* scales = w.block_scales.data() + n * (w.cols / kNvFp4GroupSize);
  for (int64_t k = 0; k < w.cols; ++k) {
    const uint8_t code = (codes[k / 2] >> (4 * (k % 2))) & 0xF;
    out[k] = e2m1_to_float(code) * e4m3_to_float(scales[k / kNvFp4GroupSize]);
  }
}

void nvfp4_dequantized_row(const NvFp4Weight& w, int64_t n, double* out) {
  const uint8_t* codes = w.codes.data() + n * (w.cols / 2);
  const uint8_t* scales = w.block_scales.data() + n * (w.cols / kNvFp4GroupSize);
  const double global = w.global_scale;
  for (int64_t k = 0; k < w.cols; ++k) {
    const uint8_t code = (codes[k / 2] >> (4 * (k % 2))) & 0xF;
    const double block = static_cast<double>(e2m1_to_float(code)) * e4m3_to_float(scales[k / kNvFp4GroupSize]);
    out[k] = block * global;
  }
}

LmHeadDeclaration declaration_from_quantization_config(const json& qc, const std::string& where) {
  if (!qc.is_object()) throw bad_input(where + " must be a JSON object");
  if (!qc.contains("quant_method")) throw bad_input(where + ": missing key 'quant_method'");
  const std::string method = string_at(qc, "quant_method", where);
  if (method != "modelopt") {
    // compressed-tensors NVFP4 is refused by its tensor names when the head carries them.
    if (qc.contains("quant_algo") && qc["quant_algo"].is_string() && is_mxfp4_algo(qc["quant_algo"].get<std::string>())) {
      throw bad_input(where + ".quant_algo is " + in_quotes(qc["quant_algo"].get<std::string>()) +
                      ": MXFP4 is not supported");
    }
    return {false, where + ".quant_method"};
  }
  return modelopt_declaration(qc, where, "ignore", false);
}

LmHeadDeclaration declaration_from_hf_quant_config(const json& hf, const std::string& where) {
  if (!hf.is_object() || !hf.contains("quantization") || !hf["quantization"].is_object()) {
    throw bad_input(where + ": expected an object with the object 'quantization'");
  }
  return modelopt_declaration(hf["quantization"], where + ": quantization", "exclude_modules", true);
}

void validate_nvfp4_head(const NvFp4Weight& w, int64_t vocab, int64_t hidden, const std::string& where) {
  if (hidden % kNvFp4GroupSize != 0) {
    throw bad_input(where + ": hidden size " + std::to_string(hidden) +
                    " is not a multiple of 16, so it cannot hold NVFP4 blocks of 16");
  }
  if (w.rows != vocab || w.cols != hidden) {
    throw bad_input(where + ": head is [" + std::to_string(w.rows) + ", " + std::to_string(w.cols) + "], expected [" +
                    std::to_string(vocab) + ", " + std::to_string(hidden) + "]");
  }
  if (static_cast<int64_t>(w.codes.size()) != vocab * hidden / 2 ||
      static_cast<int64_t>(w.block_scales.size()) != vocab * hidden / kNvFp4GroupSize) {
    throw bad_input(where + ": " + std::to_string(w.codes.size()) + " code bytes and " +
                    std::to_string(w.block_scales.size()) + " block scales for [" + std::to_string(vocab) + ", " +
                    std::to_string(hidden) + "]");
  }
  const int64_t blocks = hidden / kNvFp4GroupSize;
  for (size_t i = 0; i < w.block_scales.size(); ++i) {
    const uint8_t s = w.block_scales[i];
    const char* problem = (s & 0x7F) == 0x7F ? "is NaN" : (s & 0x80) ? "has its sign bit set" : nullptr;
    if (problem != nullptr) {
      char byte[8];
      std::snprintf(byte, sizeof byte, "0x%02x", s);
      throw bad_input(where + ": block scale of row " + std::to_string(static_cast<int64_t>(i) / blocks) + ", block " +
                      std::to_string(static_cast<int64_t>(i) % blocks) + " (" + byte + ") " + problem +
                      "; NVFP4 block scales are finite and >= 0");
    }
  }
  if (!std::isfinite(w.global_scale) || w.global_scale <= 0.0f) {
    throw bad_input(where + ": weight_scale_2 " + std::to_string(w.global_scale) + " must be finite and > 0");
  }
  if (w.input_scale && (!std::isfinite(*w.input_scale) || *w.input_scale <= 0.0f)) {
    throw bad_input(where + ": input_scale " + std::to_string(*w.input_scale) + " must be finite and > 0");
  }
}

NvFp4Weight load_nvfp4_head(const TensorStore& store, const NvFp4Names& names, int64_t vocab, int64_t hidden) {
  const std::string target = "target " + store.description();
  if (hidden % kNvFp4GroupSize != 0) {
    throw bad_input(target + ": lm_head " + in_quotes(names.weight) + " is NVFP4 but the hidden size " +
                    std::to_string(hidden) + " is not a multiple of 16");
  }
  // The weight.
  const SafetensorsFile& wfile = store.file_of(names.weight);
  const TensorInfo& winfo = wfile.info(names.weight);
  const std::string wwhere = wfile.path() + ": tensor " + in_quotes(names.weight);
  if (winfo.dtype != DType::kU8) {
    throw bad_input(wwhere + " has dtype " + dtype_name(winfo.dtype) + "; an NVFP4 weight is U8 (two E2M1 codes a byte)");
  }
  const std::vector<int64_t> wshape{vocab, hidden / 2};
  if (winfo.shape != wshape) {
    throw bad_input(wwhere + ": wrong shape for an NVFP4 head, expected " + shape_string(wshape) + " ([vocab_size, K/2]), got " +
                    shape_string(winfo.shape));
  }
  // The block scales.
  if (!store.has(names.weight_scale)) {
    throw bad_input(target + ": missing tensor " + in_quotes(names.weight_scale) + " (the NVFP4 block scales of the U8 " +
                    in_quotes(names.weight) + ")");
  }
  const SafetensorsFile& sfile = store.file_of(names.weight_scale);
  const TensorInfo& sinfo = sfile.info(names.weight_scale);
  const std::string swhere = sfile.path() + ": tensor " + in_quotes(names.weight_scale);
  if (sinfo.shape.size() != 2) {
    throw bad_input(swhere + " has shape " + shape_string(sinfo.shape) +
                    "; block scales must be the 2-D checkpoint layout [V, K/16] (a 1-D one is a swizzled runtime layout)");
  }
  if (sinfo.dtype == DType::kU8) {
    throw bad_input(swhere + " has dtype U8, a swizzled runtime layout; checkpoint block scales are F8_E4M3");
  }
  if (sinfo.dtype != DType::kF8E4M3) {
    throw bad_input(swhere + " has dtype " + dtype_name(sinfo.dtype) + "; NVFP4 block scales are F8_E4M3");
  }
  if (sinfo.shape[0] != vocab || sinfo.shape[1] * kNvFp4GroupSize != hidden) {
    std::string group;
    if (sinfo.shape[1] > 0 && hidden % sinfo.shape[1] == 0) {
      group = " (it implies group size " + std::to_string(hidden / sinfo.shape[1]) + "; NVFP4 needs 16)";
    }
    throw bad_input(swhere + ": wrong shape, expected " + shape_string({vocab, hidden / kNvFp4GroupSize}) +
                    " ([vocab_size, K/16]), got " + shape_string(sinfo.shape) + group);
  }

  NvFp4Weight w;
  w.rows = vocab;
  w.cols = hidden;
  const uint8_t* codes = wfile.data(names.weight);
  w.codes.assign(codes, codes + vocab * hidden / 2);
  const uint8_t* scales = sfile.data(names.weight_scale);
  w.block_scales.assign(scales, scales + vocab * hidden / kNvFp4GroupSize);
  w.global_scale = *read_scalar_scale(store, names.weight_scale_2, true, "global scale weight_scale_2");
  w.input_scale = read_scalar_scale(store, names.input_scale, false, "input_scale");
  validate_nvfp4_head(w, vocab, hidden, swhere);
  return w;
}

}  // namespace dflash
