// Pre-quantized FP8 drafter checkpoints (docs/spec/fp8-checkpoints.md): the compressed-tensors and NVIDIA
// ModelOpt layouts as this harness reads them, how a drafter directory declares them, and loading each
// quantized projection as its stored E4M3 codes and scales plus its exactly dequantized weight.
//   <module>.weight        F8_E4M3 [rows, cols]
//   <module>.weight_scale  per channel [rows, 1] (compressed-tensors) or [rows] (ModelOpt
//                          FP8_PER_CHANNEL_PER_TOKEN), or per tensor [] / [1]; finite and > 0
//   <module>.input_scale   [] / [1], only with a static per-tensor activation scheme
//   W[n, k] = e4m3(code[n, k]) · scale[n]
// The product has at most 4 + p significant bits for a p-bit scale significand (BF16 8, F16 11, F32 24):
// always exact in fp64; in fp32 exact for BF16 and F16 scales (short of fp32's subnormal range) and for
// an F32 scale only where the product happens to fit 24 bits. The float weight holds the product
// rounded once to fp32 (the same value where it is exact); the fp64 reference takes the exact products
// from the stored codes (fp8_dequantized_row).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/tensor.h"

namespace dflash {

class TensorStore;

enum class Fp8Layout { kCompressedTensors, kModelOpt };
const char* fp8_layout_name(Fp8Layout layout);  // "compressed-tensors", "modelopt"

// How the checkpoint declares a projection's input is quantized when the engine runs it.
enum class Fp8Activation {
  kNone,             // weight-only (W8A16): no activation quantization declared
  kDynamicPerToken,  // per token, scale = amax / 448 at run time
  kStaticPerTensor,  // one calibrated input_scale
};
const char* fp8_activation_name(Fp8Activation activation);

// One projection as the checkpoint stores it, kept beside the dequantized float weight so that an
// fp8 / w8a8 drafter can run the stored codes instead of quantizing again.
struct Fp8Stored {
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> codes;        // [rows, cols] E4M3 bytes, as stored
  std::vector<float> scales;         // [rows] weight scales (a per-tensor scale repeated on every row); exact
                                     // copies of the stored BF16 / F16 / F32 values
  bool per_tensor_scale = false;     // the checkpoint stores one scale for the whole tensor
  Fp8Activation activation = Fp8Activation::kNone;
  std::optional<float> input_scale;  // the static per-tensor activation scale (kStaticPerTensor only)
};

// Row n exactly: e4m3(code) · scale (at most 28 significant bits, in fp64's normal range).
void fp8_dequantized_row(const Fp8Stored& stored, int64_t n, double* out);
// Whether every product of `stored` is a float, i.e. a float weight tensor can hold them exactly.
bool fp8_dequantized_exactly_in_float(const Fp8Stored& stored);
// Checks an in-memory Fp8Stored against the float weight it came with: sizes, finite codes, scales
// finite and > 0, the input scale present iff static and then finite and > 0, and every weight value the
// product rounded to fp32. Errors are bad_input prefixed by `where`.
void validate_fp8_stored(const Fp8Stored& stored, const Tensor& weight, const std::string& where);

// What a declaration says about one Linear module of the drafter.
struct Fp8ModuleScheme {
  bool quantized = false;
  bool per_channel = false;  // weight scale per output row; otherwise one per tensor
  Fp8Activation activation = Fp8Activation::kNone;
  std::string why;           // the key and pattern that decided it, for messages
};

// One compressed-tensors config group, or the ModelOpt algorithm (one group targeting every Linear module).
struct Fp8Group {
  std::string name;                  // "config_groups.group_0" / "quant_algo 'FP8'", for messages
  std::vector<std::string> targets;  // compressed-tensors: module names, "re:" patterns or the class "Linear"
  bool per_channel = false;
  Fp8Activation activation = Fp8Activation::kNone;
};

// A drafter directory's FP8 declaration: config.json `quantization_config` and/or hf_quant_config.json.
struct Fp8Declaration {
  Fp8Layout layout = Fp8Layout::kCompressedTensors;
  std::string source;                // "<path>: quantization_config", for messages
  std::vector<Fp8Group> groups;
  std::string exclusion_key;         // "ignore" or "exclude_modules", for messages
  std::vector<std::string> excluded; // compressed-tensors: names or "re:" patterns; ModelOpt: '*' / '?' wildcards
  // The scheme of the Linear module whose weight is stored as `<module>.weight`. Patterns match the
  // stored name or the name with its "model." prefix added or removed. A module two groups target is
  // refused (bad_input naming both).
  Fp8ModuleScheme scheme_of(const std::string& module) const;
  // The same layout, groups and exclusions (what two declaring files must share).
  bool same_rules(const Fp8Declaration& other) const;

  struct Compiled;                          // the patterns above, ready to match (core/fp8_checkpoint.cc)
  std::shared_ptr<const Compiled> compiled;
};

// From a `quantization_config` object (config.json) with quant_method "compressed-tensors" or "modelopt";
// `where` prefixes every error. Anything but FP8 weights with per-channel or per-tensor scales, and
// dynamic per-token or static per-tensor activations (or none), is refused by key.
Fp8Declaration fp8_declaration_from_quantization_config(const nlohmann::json& quantization_config,
                                                        const std::string& where);
// From ModelOpt's hf_quant_config.json ({"quantization": {"quant_algo", "kv_cache_quant_algo", "exclude_modules"}}).
Fp8Declaration fp8_declaration_from_hf_quant_config(const nlohmann::json& hf_quant_config, const std::string& where);
// The drafter directory's declaration: none when neither file declares quantization; both declaring
// must agree (the same layout, algorithm and exclusions). A path that is a file has no declaration.
std::optional<Fp8Declaration> read_drafter_fp8_declaration(const std::string& drafter_path);

// The Linear modules of a drafter (docs/spec/drafter.md §2, canonical names without "model."): fc, the
// seven projections, DFlash2's kernel projections and the selector's hidden projection.
bool is_linear_module(const std::string& canonical_module);
// The seven projections fp8 modes quantize (q/k/v/o, gate/up/down); fc and DFlash2's projections stay bf16.
bool is_fp8_projection(const std::string& canonical_module);

// Loads module `module` (its stored name, without ".weight") of [rows, cols] as `scheme` says, from `store`:
// the E4M3 weight `<module>.weight`, its `<module>.weight_scale` and `<module>.input_scale`, every name,
// shape, dtype and value checked (errors name the file, the tensor and the reason). Sets *weight to the
// dequantized floats.
Fp8Stored load_fp8_projection(const TensorStore& store, const std::string& module, int64_t rows, int64_t cols,
                              const Fp8ModuleScheme& scheme, Fp8Layout layout, Tensor* weight);

// Why an unused drafter tensor named `canonical` (no "model." prefix) cannot be read, where its name says it
// belongs to quantization: an FP8 KV-cache scale, a zero point, or the scale of a module the declaration
// (null: none) leaves unquantized. nullopt for any other name.
std::optional<std::string> explain_unused_quantization_tensor(const std::string& canonical,
                                                              const Fp8Declaration* declaration);

}  // namespace dflash
