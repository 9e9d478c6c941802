#include "core/fp8_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <set>

#include "core/error.h"
#include "core/fp8.h"
#include "core/json_file.h"
#include "core/limits.h"
#include "core/safetensors.h"

namespace dflash {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

const std::string kModelPrefix = "model.";

std::string in_quotes(const std::string& s) { return "'" + s + "'"; }

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// ---- JSON fields ----

// The value of `key`, or null when absent.
const json& field(const json& object, const std::string& key) {
  static const json kNull;
  const auto it = object.find(key);
  return it == object.end() ? kNull : *it;
}

std::string string_field(const json& object, const std::string& key, const std::string& where) {
  const json& v = field(object, key);
  if (v.is_null()) throw bad_input(where + ": missing key " + in_quotes(key));
  if (!v.is_string()) throw bad_input(where + "." + key + " must be a string, got " + v.dump());
  return v.get<std::string>();
}

// An array of non-empty strings (null or absent: empty).
std::vector<std::string> string_list(const json& object, const std::string& key, const std::string& where) {
  const json& v = field(object, key);
  std::vector<std::string> out;
  if (v.is_null()) return out;
  if (!v.is_array()) throw bad_input(where + "." + key + " must be an array of strings, got " + v.dump());
  for (const json& item : v) {
    if (!item.is_string() || item.get<std::string>().empty()) {
      throw bad_input(where + "." + key + " must hold non-empty strings, holds " + item.dump());
    }
    out.push_back(item.get<std::string>());
  }
  return out;
}

void refuse_unknown_keys(const json& object, const std::set<std::string>& known, const std::string& where) {
  for (const auto& item : object.items()) {
    if (!known.count(item.key())) {
      throw bad_input(where + ": unknown key " + in_quotes(item.key()) + " may change the math; refusing");
    }
  }
}

// ---- pattern matching ----

// A stored module name and the same name with its "model." prefix removed or added.
std::vector<std::string> name_forms(const std::string& module) {
  if (module.rfind(kModelPrefix, 0) == 0) return {module, module.substr(kModelPrefix.size())};
  return {module, kModelPrefix + module};
}

// One character of a wildcard pattern at p[i] ('?', a class "[...]" / "[!...]", or a literal) against c;
// *next is where the pattern goes on. A '[' without its ']' is a literal, as in fnmatch.
bool wildcard_char_matches(const std::string& p, size_t i, char c, size_t* next) {
  if (p[i] == '?') {
    *next = i + 1;
    return true;
  }
  if (p[i] == '[') {
    size_t j = i + 1;
    const bool negated = j < p.size() && p[j] == '!';
    if (negated) ++j;
    const size_t first = j;
    if (j < p.size() && p[j] == ']') ++j;  // a ']' first in the class is a member
    while (j < p.size() && p[j] != ']') ++j;
    if (j < p.size()) {
      bool member = false;
      for (size_t k = first; k < j; ++k) {
        if (k + 2 < j && p[k + 1] == '-') {
          member |= p[k] <= c && c <= p[k + 2];
          k += 2;
        } else {
          member |= p[k] == c;
        }
      }
      *next = j + 1;
      return member != negated;
    }
  }
  *next = i + 1;
  return p[i] == c;
}

// ModelOpt's shell wildcards ('*', '?', '[...]'), as Python's fnmatch on POSIX; in O(pattern · name)
// steps (a '*' resumes from the latest one only, which is enough when every other token is one character).
bool wildcard_matches(const std::string& p, const std::string& s) {
  size_t pi = 0, si = 0, star = std::string::npos, star_s = 0;
  while (si < s.size()) {
    size_t next = 0;
    if (pi < p.size() && p[pi] == '*') {
      star = ++pi, star_s = si;
    } else if (pi < p.size() && wildcard_char_matches(p, pi, s[si], &next)) {
      pi = next, ++si;
    } else if (star != std::string::npos) {
      pi = star, si = ++star_s;
    } else {
      return false;
    }
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

// A compressed-tensors pattern: "re:<regex>" matched from the start of the name (Python's re.match),
// or an exact module name. The regex is compiled once as ECMAScript (which agrees with Python on the
// constructs these lists use) and matched without backtracking where the library offers it.
struct CtPattern {
  std::string text;
  std::optional<std::regex> re;
  bool matches(const std::string& name) const {
    return re ? std::regex_search(name, *re, std::regex_constants::match_continuous) : text == name;
  }
};

CtPattern compile_ct_pattern(const std::string& text, const std::string& where) {
  CtPattern p{text, std::nullopt};
  if (text.rfind("re:", 0) != 0) return p;
  if (text.find('{') != std::string::npos) {
    throw bad_input(where + ": pattern " + in_quotes(text) + " uses counted repetition ('{'), which is not read");
  }
  auto flags = std::regex::ECMAScript;
#ifdef __GLIBCXX__
  flags |= std::regex_constants::__polynomial;  // a breadth-first matcher: time linear in the name
#endif
  try {
    p.re.emplace(text.substr(3), flags);
  } catch (const std::regex_error& e) {
    throw bad_input(where + ": pattern " + in_quotes(text) + " is not a regular expression this harness reads (" +
                    e.what() + ")");
  }
  return p;
}

}  // namespace

// The patterns of a declaration, ready to match: compressed-tensors' compiled, per exclusion and per
// group target (ModelOpt's wildcards match as they are).
struct Fp8Declaration::Compiled {
  std::vector<CtPattern> excluded;
  std::vector<std::vector<CtPattern>> targets;
};

namespace {

// Checks a declaration's patterns against their limits (docs/limits.md) and compiles them once.
void compile_patterns(Fp8Declaration& d, const std::string& where) {
  auto compiled = std::make_shared<Fp8Declaration::Compiled>();
  int64_t count = static_cast<int64_t>(d.excluded.size());
  for (const Fp8Group& g : d.groups) count += static_cast<int64_t>(g.targets.size());
  limits::check_at_most(where + ": module patterns (targets and " + d.exclusion_key + ")", count, limits::kModulePatterns);
  const bool ct = d.layout == Fp8Layout::kCompressedTensors;
  const auto prepare = [&](const std::string& pattern, const std::string& key) {
    limits::check_at_most(where + "." + key + ": length of pattern " + in_quotes(pattern.substr(0, 48)) +
                              (pattern.size() > 48 ? "..." : ""),
                          static_cast<int64_t>(pattern.size()), limits::kModulePatternLength);
    return ct ? compile_ct_pattern(pattern, where + "." + key) : CtPattern{pattern, std::nullopt};
  };
  for (const std::string& p : d.excluded) compiled->excluded.push_back(prepare(p, d.exclusion_key));
  for (const Fp8Group& g : d.groups) {
    compiled->targets.emplace_back();
    for (const std::string& t : g.targets) compiled->targets.back().push_back(prepare(t, g.name + ".targets"));
  }
  d.compiled = std::move(compiled);
}

// ---- compressed-tensors ----

const std::set<std::string> kCtFormats = {"float-quantized", "naive-quantized"};

const std::set<std::string> kCtArgsKeys = {"num_bits",       "type",          "symmetric",   "group_size",
                                           "strategy",       "block_structure", "dynamic",   "actorder",
                                           "observer",       "observer_kwargs", "scale_dtype", "zp_dtype"};

// The parts of QuantizationArgs every FP8 scheme here shares: 8-bit float, symmetric.
void check_fp8_args(const json& args, const std::string& where) {
  if (!args.is_object()) throw bad_input(where + " must be an object, got " + args.dump());
  refuse_unknown_keys(args, kCtArgsKeys, where);
  const json& bits = field(args, "num_bits");
  if (!bits.is_number_integer() || bits.get<int64_t>() != 8) {
    throw bad_input(where + ".num_bits is " + bits.dump() + "; FP8 is 8 bits");
  }
  const json& type = field(args, "type");
  if (type != "float") {
    throw bad_input(where + ".type is " + type.dump() + "; only 'float' (FP8 E4M3) is supported, not integer quantization");
  }
  const json& symmetric = field(args, "symmetric");
  if (!symmetric.is_null() && symmetric != true) {
    throw bad_input(where + ".symmetric is " + symmetric.dump() + "; asymmetric quantization (zero points) is not supported");
  }
  const json& actorder = field(args, "actorder");
  if (!actorder.is_null()) throw bad_input(where + ".actorder is " + actorder.dump() + "; activation ordering is not supported");
}

std::string strategy_of(const json& args, const std::string& where) {
  const json& s = field(args, "strategy");
  if (!s.is_string()) throw bad_input(where + ".strategy must be a string, got " + s.dump());
  return s.get<std::string>();
}

// The weight scheme: one scale per output channel or per tensor, static.
bool ct_weights_per_channel(const json& args, const std::string& where) {
  check_fp8_args(args, where);
  const std::string strategy = strategy_of(args, where);
  const json& blocks = field(args, "block_structure");
  if (strategy == "block" || !blocks.is_null()) {
    throw bad_input(where + ": block-wise weight scales (strategy " + in_quotes(strategy) + ", block_structure " +
                    blocks.dump() + ") are not supported; the harness reads one scale per output row or per tensor");
  }
  if (strategy == "group" || strategy == "tensor_group" || !field(args, "group_size").is_null()) {
    throw bad_input(where + ": group-wise weight scales (strategy " + in_quotes(strategy) + ", group_size " +
                    field(args, "group_size").dump() + ") are not supported; the harness reads one scale per output "
                    "row or per tensor");
  }
  if (strategy != "channel" && strategy != "tensor") {
    throw bad_input(where + ".strategy is " + in_quotes(strategy) + "; FP8 weights need 'channel' or 'tensor'");
  }
  const json& dynamic = field(args, "dynamic");
  if (!dynamic.is_null() && dynamic != false) {
    throw bad_input(where + ".dynamic is " + dynamic.dump() + "; a pre-quantized weight has static scales");
  }
  return strategy == "channel";
}

Fp8Activation ct_activation(const json& args, const std::string& where) {
  if (args.is_null()) return Fp8Activation::kNone;
  check_fp8_args(args, where);
  const std::string strategy = strategy_of(args, where);
  const json& dynamic = field(args, "dynamic");
  if (strategy == "token" && dynamic == true && field(args, "group_size").is_null()) return Fp8Activation::kDynamicPerToken;
  if (strategy == "tensor" && (dynamic.is_null() || dynamic == false) && field(args, "group_size").is_null()) {
    return Fp8Activation::kStaticPerTensor;
  }
  throw bad_input(where + ": activation scheme strategy " + in_quotes(strategy) + " with dynamic " + dynamic.dump() +
                  (field(args, "group_size").is_null() ? std::string() : ", group_size " + field(args, "group_size").dump()) +
                  " is not supported; only dynamic per-token ('token', dynamic true) or static per-tensor ('tensor', "
                  "dynamic false) activations are");
}

Fp8Declaration compressed_tensors_declaration(const json& qc, const std::string& where) {
  refuse_unknown_keys(qc,
                      {"quant_method", "format", "quantization_status", "global_compression_ratio", "version", "provider",
                       "run_compressed", "ignore", "config_groups", "kv_cache_scheme", "sparsity_config",
                       "transform_config"},
                      where);
  Fp8Declaration d;
  d.layout = Fp8Layout::kCompressedTensors;
  d.source = where;
  d.exclusion_key = "ignore";
  if (!field(qc, "kv_cache_scheme").is_null()) {
    throw bad_input(where + ".kv_cache_scheme is set: FP8 KV-cache quantization is not supported (the harness keeps K "
                    "and V in bf16)");
  }
  for (const char* key : {"sparsity_config", "transform_config"}) {
    if (!field(qc, key).is_null()) throw bad_input(where + "." + key + " is set: sparse or transformed weights are not supported");
  }
  const json& status = field(qc, "quantization_status");
  if (!status.is_null() && status != "compressed") {
    throw bad_input(where + ".quantization_status is " + status.dump() + "; only 'compressed' checkpoints (weights stored "
                    "as F8_E4M3) are read");
  }
  const std::string format = string_field(qc, "format", where);
  if (!kCtFormats.count(format) && format != "mixed-precision") {
    throw bad_input(where + ".format is " + in_quotes(format) + "; FP8 weights are read in the 'float-quantized' or "
                    "'naive-quantized' format (F8_E4M3 tensors)");
  }
  const json& groups = field(qc, "config_groups");
  if (!groups.is_object() || groups.empty()) throw bad_input(where + ".config_groups must be a non-empty object");
  for (const auto& [name, group] : groups.items()) {
    const std::string gw = where + ".config_groups." + name;
    if (!group.is_object()) {
      throw bad_input(gw + " must be a scheme object (a preset name with a target list is not read), got " + group.dump());
    }
    refuse_unknown_keys(group, {"targets", "weights", "input_activations", "output_activations", "format"}, gw);
    const json& group_format = field(group, "format");
    if (!group_format.is_null() && !(group_format.is_string() && kCtFormats.count(group_format.get<std::string>()))) {
      throw bad_input(gw + ".format is " + group_format.dump() + "; FP8 weights are read in the 'float-quantized' or "
                      "'naive-quantized' format");
    }
    if (format == "mixed-precision" && group_format.is_null()) {
      throw bad_input(gw + " has no format while " + where + ".format is 'mixed-precision'");
    }
    if (!field(group, "output_activations").is_null()) {
      throw bad_input(gw + ".output_activations is set: output (KV-cache or attention) quantization is not supported");
    }
    if (field(group, "weights").is_null()) throw bad_input(gw + ".weights is missing: a group that quantizes no weights is not supported");
    Fp8Group g;
    g.name = "config_groups." + name;
    g.targets = string_list(group, "targets", gw);
    if (g.targets.empty()) throw bad_input(gw + ".targets is empty");
    g.per_channel = ct_weights_per_channel(group["weights"], gw + ".weights");
    g.activation = ct_activation(field(group, "input_activations"), gw + ".input_activations");
    d.groups.push_back(std::move(g));
  }
  d.excluded = string_list(qc, "ignore", where);
  compile_patterns(d, where);
  return d;
}

// ---- ModelOpt ----

// `q`: config.json's quantization_config (exclusions under "ignore") or hf_quant_config.json's
// "quantization" object (exclusions under "exclude_modules").
Fp8Declaration modelopt_declaration(const json& q, const std::string& where, const std::set<std::string>& known) {
  refuse_unknown_keys(q, known, where);
  Fp8Declaration d;
  d.layout = Fp8Layout::kModelOpt;
  d.source = where;
  const std::string algo = upper(string_field(q, "quant_algo", where));
  Fp8Group g;
  g.name = "quant_algo " + in_quotes(algo);
  g.targets = {"*"};
  if (algo == "FP8") {
    g.per_channel = false, g.activation = Fp8Activation::kStaticPerTensor;
  } else if (algo == "FP8_PER_CHANNEL_PER_TOKEN") {
    g.per_channel = true, g.activation = Fp8Activation::kDynamicPerToken;
  } else if (algo == "FP8_PB_WO") {
    throw bad_input(where + ".quant_algo is 'FP8_PB_WO': block-wise weight scales are not supported; the harness reads "
                    "one scale per output row or per tensor");
  } else {
    throw bad_input(where + ".quant_algo is " + in_quotes(algo) + "; drafter checkpoints are read as FP8 ('FP8' or "
                    "'FP8_PER_CHANNEL_PER_TOKEN') only");
  }
  const json& kv = field(q, "kv_cache_quant_algo");
  if (!kv.is_null()) {
    throw bad_input(where + ".kv_cache_quant_algo is " + kv.dump() + ": FP8 KV-cache scales are not supported (the "
                    "harness keeps K and V in bf16)");
  }
  const json& group_size = field(q, "group_size");
  if (!group_size.is_null()) throw bad_input(where + ".group_size is " + group_size.dump() + "; FP8 has no groups");
  d.groups.push_back(std::move(g));
  const bool has_ignore = q.contains("ignore"), has_exclude = q.contains("exclude_modules");
  d.exclusion_key = has_ignore ? "ignore" : "exclude_modules";
  d.excluded = string_list(q, d.exclusion_key, where);
  if (has_ignore && has_exclude && string_list(q, "exclude_modules", where) != d.excluded) {
    throw bad_input(where + ": 'ignore' and 'exclude_modules' list different modules");
  }
  compile_patterns(d, where);
  return d;
}

// ---- loading ----

std::string hex_byte(uint8_t b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02x", b);
  return buf;
}

bool is_scale_dtype(DType dtype, Fp8Layout layout) {
  if (layout == Fp8Layout::kModelOpt) return dtype == DType::kF32;
  return dtype == DType::kBF16 || dtype == DType::kF16 || dtype == DType::kF32;
}

const char* scale_dtypes(Fp8Layout layout) {
  return layout == Fp8Layout::kModelOpt ? "F32" : "BF16, F16 or F32";
}

bool is_one_element_shape(const std::vector<int64_t>& shape) {
  return shape.empty() || shape == std::vector<int64_t>{1};
}

// The values of a scale tensor (dtype and shape checked by the caller), each finite and > 0.
std::vector<float> read_positive_scales(const SafetensorsFile& file, const std::string& name, const char* role) {
  const Tensor t = file.read_float(name);
  for (size_t i = 0; i < t.values.size(); ++i) {
    const float v = t.values[i];
    if (!std::isfinite(v) || v <= 0.0f) {
      throw bad_input(file.path() + ": tensor " + in_quotes(name) + ": " + role +
                      (t.values.size() > 1 ? " of row " + std::to_string(i) : std::string()) + " is " +
                      std::to_string(v) + "; scales must be finite and > 0");
    }
  }
  return t.values;
}

}  // namespace

const char* fp8_layout_name(Fp8Layout layout) {
  return layout == Fp8Layout::kModelOpt ? "modelopt" : "compressed-tensors";
}

const char* fp8_activation_name(Fp8Activation activation) {
  switch (activation) {
    case Fp8Activation::kNone: return "none (weight-only)";
    case Fp8Activation::kDynamicPerToken: return "dynamic per-token";
    case Fp8Activation::kStaticPerTensor: return "static per-tensor";
  }
  return "?";
}

void fp8_dequantized_row(const Fp8Stored& stored, int64_t n, double* out) {
  const uint8_t* codes = stored.codes.data() + n * stored.cols;
  const double scale = stored.scales[static_cast<size_t>(n)];
  for (int64_t k = 0; k < stored.cols; ++k) out[k] = static_cast<double>(e4m3_to_float(codes[k])) * scale;
}

bool fp8_dequantized_exactly_in_float(const Fp8Stored& stored) {
  std::vector<double> row(static_cast<size_t>(stored.cols));
  for (int64_t n = 0; n < stored.rows; ++n) {
    fp8_dequantized_row(stored, n, row.data());
    for (double v : row) {
      if (static_cast<double>(static_cast<float>(v)) != v) return false;
    }
  }
  return true;
}

void validate_fp8_stored(const Fp8Stored& s, const Tensor& weight, const std::string& where) {
  if (s.rows <= 0 || s.cols <= 0 || weight.shape != std::vector<int64_t>{s.rows, s.cols} ||
      static_cast<int64_t>(s.codes.size()) != s.rows * s.cols || static_cast<int64_t>(s.scales.size()) != s.rows) {
    throw bad_input(where + ": FP8 codes [" + std::to_string(s.rows) + ", " + std::to_string(s.cols) + "] (" +
                    std::to_string(s.codes.size()) + " bytes, " + std::to_string(s.scales.size()) +
                    " scales) do not fit the weight " + shape_string(weight.shape));
  }
  for (size_t n = 0; n < s.scales.size(); ++n) {
    if (!std::isfinite(s.scales[n]) || s.scales[n] <= 0.0f) {
      throw bad_input(where + ": FP8 weight scale of row " + std::to_string(n) + " is " + std::to_string(s.scales[n]) +
                      "; scales must be finite and > 0");
    }
    if (s.per_tensor_scale && s.scales[n] != s.scales[0]) {
      throw bad_input(where + ": a per-tensor FP8 scale differs between rows 0 and " + std::to_string(n));
    }
  }
  if (s.input_scale.has_value() != (s.activation == Fp8Activation::kStaticPerTensor)) {
    throw bad_input(where + ": an FP8 input scale goes with static per-tensor activations only (activation " +
                    fp8_activation_name(s.activation) + ", input scale " + (s.input_scale ? "present" : "absent") + ")");
  }
  if (s.input_scale && (!std::isfinite(*s.input_scale) || *s.input_scale <= 0.0f)) {
    throw bad_input(where + ": FP8 input scale " + std::to_string(*s.input_scale) + " must be finite and > 0");
  }
  std::vector<double> row(static_cast<size_t>(s.cols));
  for (int64_t n = 0; n < s.rows; ++n) {
    for (int64_t k = 0; k < s.cols; ++k) {
      const uint8_t code = s.codes[static_cast<size_t>(n * s.cols + k)];
      if ((code & 0x7f) == 0x7f) {
        throw bad_input(where + ": FP8 code " + hex_byte(code) + " at row " + std::to_string(n) + ", column " +
                        std::to_string(k) + " is NaN");
      }
    }
    fp8_dequantized_row(s, n, row.data());
    for (int64_t k = 0; k < s.cols; ++k) {
      if (weight.values[static_cast<size_t>(n * s.cols + k)] != static_cast<float>(row[static_cast<size_t>(k)])) {
        throw bad_input(where + ": the float weight at row " + std::to_string(n) + ", column " + std::to_string(k) +
                        " is not its FP8 code times its scale");
      }
    }
  }
}

Fp8ModuleScheme Fp8Declaration::scheme_of(const std::string& module) const {
  if (!compiled) throw internal_error(source + ": the declaration's patterns were not compiled");
  const std::vector<std::string> names = name_forms(module);
  const bool modelopt = layout == Fp8Layout::kModelOpt;
  const auto any_name = [&](const auto& matches) { return std::any_of(names.begin(), names.end(), matches); };
  for (size_t i = 0; i < excluded.size(); ++i) {
    if (any_name([&](const std::string& name) {
          return modelopt ? wildcard_matches(excluded[i], name) : compiled->excluded[i].matches(name);
        })) {
      Fp8ModuleScheme s;
      s.why = source + "." + exclusion_key + " pattern " + in_quotes(excluded[i]);
      return s;
    }
  }
  // A compressed-tensors target also names a class: every module asked about is a Linear, and a target
  // names that class when it is contained in "Linear", case aside (as vLLM matches class names).
  const auto names_linear = [](const std::string& t) {
    return t.rfind("re:", 0) != 0 && std::string("linear").find(lower(t)) != std::string::npos;
  };
  const Fp8Group* chosen = nullptr;
  std::string chosen_target;
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t t = 0; t < groups[g].targets.size(); ++t) {
      const std::string& target = groups[g].targets[t];
      const bool hit = modelopt ? any_name([&](const std::string& name) { return wildcard_matches(target, name); })
                                : names_linear(target) || any_name([&](const std::string& name) {
                                    return compiled->targets[g][t].matches(name);
                                  });
      if (!hit) continue;
      if (chosen != nullptr && chosen != &groups[g]) {
        throw bad_input(source + ": module " + in_quotes(module) + " is targeted by both " + chosen->name + " (" +
                        in_quotes(chosen_target) + ") and " + groups[g].name + " (" + in_quotes(target) + ")");
      }
      chosen = &groups[g], chosen_target = target;
      break;
    }
  }
  Fp8ModuleScheme s;
  if (chosen == nullptr) {
    s.why = source + " (no config group targets it)";
    return s;
  }
  s.quantized = true;
  s.per_channel = chosen->per_channel;
  s.activation = chosen->activation;
  s.why = source + "." + chosen->name + (modelopt ? std::string() : " target " + in_quotes(chosen_target));
  return s;
}

bool Fp8Declaration::same_rules(const Fp8Declaration& o) const {
  if (layout != o.layout || excluded != o.excluded || groups.size() != o.groups.size()) return false;
  for (size_t i = 0; i < groups.size(); ++i) {
    const Fp8Group &a = groups[i], &b = o.groups[i];
    if (a.name != b.name || a.targets != b.targets || a.per_channel != b.per_channel || a.activation != b.activation) {
      return false;
    }
  }
  return true;
}

Fp8Declaration fp8_declaration_from_quantization_config(const json& qc, const std::string& where) {
  if (!qc.is_object()) throw bad_input(where + " must be a JSON object");
  const std::string method = lower(string_field(qc, "quant_method", where));
  if (method == "compressed-tensors") return compressed_tensors_declaration(qc, where);
  if (method == "modelopt") {
    return modelopt_declaration(qc, where,
                                {"quant_method", "quant_algo", "kv_cache_quant_algo", "ignore", "exclude_modules",
                                 "group_size", "producer", "config_groups"});
  }
  throw bad_input(where + ".quant_method is " + in_quotes(method) + "; a quantized drafter is read as FP8 in the "
                  "'compressed-tensors' or 'modelopt' layout only");
}

Fp8Declaration fp8_declaration_from_hf_quant_config(const json& hf, const std::string& where) {
  if (!hf.is_object() || !hf.contains("quantization") || !hf["quantization"].is_object()) {
    throw bad_input(where + ": expected an object with the object 'quantization'");
  }
  refuse_unknown_keys(hf, {"producer", "quantization"}, where);
  return modelopt_declaration(hf["quantization"], where + ": quantization",
                              {"quant_algo", "kv_cache_quant_algo", "exclude_modules", "group_size"});
}

std::optional<Fp8Declaration> read_drafter_fp8_declaration(const std::string& drafter_path) {
  std::error_code ec;
  if (!fs::is_directory(drafter_path, ec)) return std::nullopt;
  const fs::path dir(drafter_path);
  std::vector<Fp8Declaration> found;
  if (fs::exists(dir / "config.json", ec)) {
    const std::string path = (dir / "config.json").string();
    const json config = read_json_file_strict(path);
    if (config.is_object() && config.contains("quantization_config") && !config["quantization_config"].is_null()) {
      found.push_back(fp8_declaration_from_quantization_config(config["quantization_config"], path + ": quantization_config"));
    }
  }
  if (fs::exists(dir / "hf_quant_config.json", ec)) {
    const std::string path = (dir / "hf_quant_config.json").string();
    found.push_back(fp8_declaration_from_hf_quant_config(read_json_file_strict(path), path));
  }
  if (found.empty()) return std::nullopt;
  if (found.size() == 2 && !found[0].same_rules(found[1])) {
    throw bad_input("drafter " + drafter_path + ": " + found[0].source + " and " + found[1].source +
                    " declare different quantization");
  }
  return std::move(found.front());
}

bool is_fp8_projection(const std::string& m) {
  if (m.rfind("layers.", 0) != 0) return false;
  for (const char* suffix : {".self_attn.q_proj", ".self_attn.k_proj", ".self_attn.v_proj", ".self_attn.o_proj",
                             ".mlp.gate_proj", ".mlp.up_proj", ".mlp.down_proj"}) {
    if (ends_with(m, suffix)) return true;
  }
  return false;
}

bool is_linear_module(const std::string& m) {
  if (m == "fc" || m == "candidate_selector.hidden_projection" || is_fp8_projection(m)) return true;
  return m.rfind("layers.", 0) == 0 && (ends_with(m, ".attention_conv.kernel_projection") ||
                                        ends_with(m, ".mlp_conv.kernel_projection"));
}

Fp8Stored load_fp8_projection(const TensorStore& store, const std::string& module, int64_t rows, int64_t cols,
                              const Fp8ModuleScheme& scheme, Fp8Layout layout, Tensor* weight) {
  const std::string weight_name = module + ".weight", scale_name = module + ".weight_scale",
                    input_name = module + ".input_scale";
  const SafetensorsFile& wfile = store.file_of(weight_name);
  const TensorInfo& winfo = wfile.info(weight_name);
  const std::string wwhere = wfile.path() + ": tensor " + in_quotes(weight_name);
  if (winfo.dtype != DType::kF8E4M3) {
    throw bad_input(wwhere + " has dtype " + dtype_name(winfo.dtype) + " but " + scheme.why +
                    " declares it quantized, which needs F8_E4M3");
  }
  if (winfo.shape != std::vector<int64_t>{rows, cols}) {
    throw bad_input(wwhere + ": wrong shape, expected " + shape_string({rows, cols}) + ", got " + shape_string(winfo.shape));
  }
  Fp8Stored s;
  s.rows = rows, s.cols = cols;
  s.per_tensor_scale = !scheme.per_channel;
  s.activation = scheme.activation;
  const uint8_t* codes = wfile.data(weight_name);
  s.codes.assign(codes, codes + rows * cols);

  // The weight scale.
  if (!store.has(scale_name)) {
    throw bad_input("drafter " + store.description() + ": missing tensor " + in_quotes(scale_name) +
                    " (the FP8 weight scale of " + in_quotes(weight_name) + ", quantized by " + scheme.why + ")");
  }
  const SafetensorsFile& sfile = store.file_of(scale_name);
  const TensorInfo& sinfo = sfile.info(scale_name);
  const std::string swhere = sfile.path() + ": tensor " + in_quotes(scale_name);
  if (!is_scale_dtype(sinfo.dtype, layout)) {
    throw bad_input(swhere + " has dtype " + dtype_name(sinfo.dtype) + "; " + fp8_layout_name(layout) +
                    " FP8 weight scales are " + scale_dtypes(layout));
  }
  const std::vector<int64_t> channel_shape =
      layout == Fp8Layout::kModelOpt ? std::vector<int64_t>{rows} : std::vector<int64_t>{rows, 1};
  const bool block_like = sinfo.shape.size() == 2 && sinfo.shape[1] != 1;
  if (block_like) {
    throw bad_input(swhere + " has shape " + shape_string(sinfo.shape) + " for a " + shape_string({rows, cols}) +
                    " weight: block-wise or group-wise scales are not supported; the harness reads one scale per "
                    "output row " + shape_string(channel_shape) + " or per tensor ([] or [1])");
  }
  if (scheme.per_channel ? sinfo.shape != channel_shape : !is_one_element_shape(sinfo.shape)) {
    throw bad_input(swhere + ": wrong shape, expected " +
                    (scheme.per_channel ? shape_string(channel_shape) + " (one scale per output row" : "[] or [1] (one scale per tensor") +
                    ", as " + scheme.why + " declares), got " + shape_string(sinfo.shape));
  }
  const std::vector<float> scales = read_positive_scales(sfile, scale_name, "the weight scale");
  s.scales = scheme.per_channel ? scales : std::vector<float>(static_cast<size_t>(rows), scales[0]);

  // The input scale: with a static per-tensor activation scheme only.
  if (scheme.activation == Fp8Activation::kStaticPerTensor) {
    if (!store.has(input_name)) {
      throw bad_input("drafter " + store.description() + ": missing tensor " + in_quotes(input_name) +
                      " (the static per-tensor activation scale " + scheme.why + " declares)");
    }
    const SafetensorsFile& ifile = store.file_of(input_name);
    const TensorInfo& iinfo = ifile.info(input_name);
    const std::string iwhere = ifile.path() + ": tensor " + in_quotes(input_name);
    if (!is_scale_dtype(iinfo.dtype, layout)) {
      throw bad_input(iwhere + " has dtype " + dtype_name(iinfo.dtype) + "; " + fp8_layout_name(layout) +
                      " FP8 input scales are " + scale_dtypes(layout));
    }
    if (!is_one_element_shape(iinfo.shape)) {
      throw bad_input(iwhere + ": wrong shape, expected [] or [1] (one static activation scale per tensor), got " +
                      shape_string(iinfo.shape));
    }
    s.input_scale = read_positive_scales(ifile, input_name, "the input scale")[0];
  } else if (store.has(input_name)) {
    throw bad_input(store.file_of(input_name).path() + ": tensor " + in_quotes(input_name) + " is a static activation "
                    "scale but " + scheme.why + " declares " + fp8_activation_name(scheme.activation) + " activations");
  }

  // Codes, then the products: exact in fp64, rounded once to fp32 for the float weight.
  *weight = Tensor::zeros({rows, cols});
  std::vector<double> row(static_cast<size_t>(cols));
  for (int64_t n = 0; n < rows; ++n) {
    for (int64_t k = 0; k < cols; ++k) {
      const uint8_t code = s.codes[static_cast<size_t>(n * cols + k)];
      if ((code & 0x7f) == 0x7f) {
        throw bad_input(wwhere + ": code " + hex_byte(code) + " at row " + std::to_string(n) + ", column " +
                        std::to_string(k) + " is NaN; FP8 weights must be finite");
      }
    }
    fp8_dequantized_row(s, n, row.data());
    for (int64_t k = 0; k < cols; ++k) {
      const float v = static_cast<float>(row[static_cast<size_t>(k)]);
      if (!std::isfinite(v)) {
        throw bad_input(wwhere + ": the dequantized value at row " + std::to_string(n) + ", column " + std::to_string(k) +
                        " (" + std::to_string(row[static_cast<size_t>(k)]) + ") overflows fp32");
      }
      weight->values[static_cast<size_t>(n * cols + k)] = v;
    }
  }
  return s;
}

std::optional<std::string> explain_unused_quantization_tensor(const std::string& canonical,
                                                              const Fp8Declaration* declaration) {
  const std::string quoted = "tensor " + in_quotes(canonical);
  // ModelOpt and vLLM name KV-cache scales k_scale / v_scale; compressed-tensors stores them as the
  // output_scale of k_proj and v_proj (output activation quantization).
  for (const char* suffix : {".k_scale", ".v_scale", ".kv_scale", ".q_scale", ".prob_scale", ".output_scale"}) {
    if (ends_with(canonical, suffix)) {
      return quoted + " is an FP8 KV-cache (attention) scale: KV-cache quantization is not supported (the harness "
                      "keeps K and V in bf16)";
    }
  }
  for (const char* suffix : {".weight_zero_point", ".input_zero_point", ".output_zero_point"}) {
    if (ends_with(canonical, suffix)) return quoted + " is a zero point: asymmetric quantization is not supported";
  }
  for (const char* suffix : {".weight_scale", ".input_scale", ".weight_scale_2", ".weight_global_scale"}) {
    if (!ends_with(canonical, suffix)) continue;
    const std::string module = canonical.substr(0, canonical.size() - std::string(suffix).size());
    if (declaration == nullptr) {
      return quoted + " is a quantization scale but the drafter declares no quantization (no quantization_config in "
                      "its config.json, no hf_quant_config.json)";
    }
    if (!is_linear_module(module)) return std::nullopt;
    const Fp8ModuleScheme scheme = declaration->scheme_of(module);
    if (!scheme.quantized) return quoted + " belongs to " + in_quotes(module) + ", which " + scheme.why + " leaves unquantized";
    return quoted + " is not part of FP8 quantization with per-channel or per-tensor scales";
  }
  return std::nullopt;
}

}  // namespace dflash
