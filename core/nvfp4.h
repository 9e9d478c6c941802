// The target's LM head in NVFP4 (docs/spec/nvfp4-lm-head.md): ModelOpt's checkpoint layout, how a
// config declares it, its exact dequantization, and loading with every refusal of the contract (§7).
//   weight          U8      [V, K/2]  two E2M1 codes per byte, element 2j in the low nibble
//   weight_scale    F8_E4M3 [V, K/16] per-16 block scales, row-major (not swizzled), finite, >= 0
//   weight_scale_2  F32     [] or [1] the global scale, a multiplier, finite and > 0
//   input_scale     F32     [] or [1] optional (W4A4 exports); validated and recorded, never used
//   W[n, k] = e2m1(code[n, k]) · e4m3(weight_scale[n, k/16]) · weight_scale_2
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/safetensors.h"

namespace dflash {

constexpr int64_t kNvFp4GroupSize = 16;

struct NvFp4Weight {
  int64_t rows = 0, cols = 0;         // V, K
  std::vector<uint8_t> codes;         // [V, K/2]
  std::vector<uint8_t> block_scales;  // [V, K/16] E4M3 codes
  float global_scale = 0.0f;          // weight_scale_2
  std::optional<float> input_scale;
  bool empty() const { return rows == 0; }
};

// The tensor names of one NVFP4 head: a fixture's target.lm_head_nvfp4, or ModelOpt's names beside
// the weight in a target directory.
struct NvFp4Names {
  std::string weight = "lm_head.weight";
  std::string weight_scale = "lm_head.weight_scale";
  std::string weight_scale_2 = "lm_head.weight_scale_2";
  std::string input_scale = "lm_head.input_scale";  // empty: none
  // ModelOpt's names beside a weight named `weight` ("<prefix>.weight" -> "<prefix>.weight_scale", ...).
  static NvFp4Names beside(const std::string& weight);
};

// A weight's module: "lm_head.weight" -> "lm_head" (a name without ".weight" stays as it is).
std::string module_of(const std::string& weight_name);

// The magnitude-and-sign value of a 4-bit E2M1 code (0, ±0.5, ±1, ±1.5, ±2, ±3, ±4, ±6).
float e2m1_to_float(uint8_t code);

// Row n without the global scale: e2m1 · e4m3, exact in float (at most 6 significant bits).
void nvfp4_block_scaled_row(const NvFp4Weight& w, int64_t n, float* out);
// Row n exactly: e2m1 · e4m3 · weight_scale_2 needs at most 30 significant bits, exact in double.
void nvfp4_dequantized_row(const NvFp4Weight& w, int64_t n, double* out);

// What a target's configuration says about its lm_head.
struct LmHeadDeclaration {
  bool nvfp4 = false;
  std::string source;  // the file and key that decided it ("<path>: quantization_config.quant_algo"), for messages
};

// From config.json's `quantization_config` object (also a fixture's target.quantization_config).
// Refuses a group size other than 16 and MXFP4 by key; anything that is not ModelOpt declares
// no NVFP4 head.
LmHeadDeclaration declaration_from_quantization_config(const nlohmann::json& quantization_config,
                                                       const std::string& where);
// From the legacy hf_quant_config.json (its `quantization` object; group_size,
// kv_cache_quant_algo and exclude_modules required for NVFP4).
LmHeadDeclaration declaration_from_hf_quant_config(const nlohmann::json& hf_quant_config, const std::string& where);

// Reads and checks the head of `vocab` rows and `hidden` columns (the group size the declaration
// gave was checked already; the shapes must imply 16 too). Errors name the store and the tensor.
NvFp4Weight load_nvfp4_head(const TensorStore& store, const NvFp4Names& names, int64_t vocab, int64_t hidden);

// Checks an in-memory head: sizes, block scales finite and >= 0, global scale finite and > 0.
void validate_nvfp4_head(const NvFp4Weight& w, int64_t vocab, int64_t hidden, const std::string& where);

}  // namespace dflash
