// Upper bounds on every size the harness reads from a file it did not write (config.json,
// JSON (every file above and the safetensors header)
constexpr int64_t kJsonDepth = 64;                 // nested objects and arrays

// A quantized drafter's module patterns (quantization_config, hf_quant_config.json): each pattern's
// length, and how many one declaration holds (targets and exclusions together)
constexpr int64_t kModulePatternLength = 256;
constexpr int64_t kModulePatterns = 4096;

// safetensors headers, fixture.json). Each is checked, in 64-bit arithmetic, before anything is
// sized from it; a value past its bound is bad input naming the file, the field, the value and
// the bound (docs/limits.md lists them). The bounds sit well above every published DFlash drafter
// and target (docs/spec/drafter.md §8) and low enough that the products formed from them fit in int.
#pragma once
#include <cstdint>
#include <string>

#include "core/error.h"

namespace dflash::limits {

// config.json
constexpr int64_t kHiddenSize = 1 << 16;           // H (and the target's Ht)
constexpr int64_t kIntermediateSize = 1 << 18;     // I
constexpr int64_t kLayers = 256;                   // drafter layers L
constexpr int64_t kHeads = 1024;                   // nh and nkv
constexpr int64_t kHeadDim = 1024;                 // d
constexpr int64_t kProjectionDim = 1 << 18;        // nh·d (nkv·d is at most that)
constexpr int64_t kVocabSize = 1 << 22;            // V
constexpr int64_t kBlockSize = 1024;               // block_size and head.gamma
constexpr int64_t kTargetLayers = 1024;            // target layer ids (each id < this) and their count
constexpr int64_t kCtxFeatureDim = 1 << 22;        // nT·Ht
constexpr int64_t kPositions = int64_t{1} << 31;   // max_position_embeddings, positions in a fixture

// fixture.json "head" and the paged pool sized from it
constexpr int64_t kMaxBatch = 1024;
constexpr int64_t kCtxCap = 1 << 24;               // positions in one window
constexpr int64_t kKvPageSize = 4096;              // positions per page
constexpr int64_t kPoolPages = 1 << 24;            // pages per layer pool
constexpr int64_t kKvCacheElements = int64_t{1} << 31;  // layers · 2 · slots · nkv·d, all pools together

// JSON (every file above and the safetensors header)
constexpr int64_t kJsonDepth = 64;                 // nested objects and arrays

// A quantized drafter's module patterns (quantization_config, hf_quant_config.json): each pattern's
// length, and how many one declaration holds (targets and exclusions together)
constexpr int64_t kModulePatternLength = 256;
constexpr int64_t kModulePatterns = 4096;

// safetensors
constexpr uint64_t kHeaderBytes = 100u << 20;      // the JSON header (the format's own reader caps it there)
constexpr int64_t kTensorRank = 8;
constexpr int64_t kTensorDim = int64_t{1} << 40;   // one dimension (the element count is bounded by the file)

// "<where> = <value> exceeds the limit <limit>" unless value <= limit.
inline void check_at_most(const std::string& where, int64_t value, int64_t limit) {
  if (value > limit) {
    throw bad_input(where + " = " + std::to_string(value) + " exceeds the limit " + std::to_string(limit) +
                    " (docs/limits.md)");
  }
}

// a · b in 64-bit, refused by name when it overflows or exceeds `limit` (both factors >= 0).
inline int64_t checked_product(const std::string& where, int64_t a, int64_t b, int64_t limit) {
  int64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product)) {
    throw bad_input(where + " = " + std::to_string(a) + " x " + std::to_string(b) +
                    " overflows 64-bit arithmetic (limit " + std::to_string(limit) + ", docs/limits.md)");
  }
  if (product > limit) {
    throw bad_input(where + " = " + std::to_string(a) + " x " + std::to_string(b) + " = " + std::to_string(product) +
                    " exceeds the limit " + std::to_string(limit) + " (docs/limits.md)");
  }
  return product;
}

}  // namespace dflash::limits
