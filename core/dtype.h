// Element types of safetensors files and the exact conversions between them and float.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace dflash {

enum class DType { kBF16, kF16, kF32, kF64, kI32, kI64, kF8E4M3, kU8 };

// Size in bytes of one element.
size_t dtype_size(DType dtype);
// Safetensors spelling: "BF16", "F16", "F32", "F64", "I32", "I64", "F8_E4M3", "U8".
const char* dtype_name(DType dtype);
// Parses the safetensors spelling; returns false for anything else (the caller names the tensor).
bool parse_dtype(const std::string& name, DType* out);

inline float bf16_bits_to_float(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Round to nearest even, as PyTorch's float -> bfloat16 cast; NaN stays NaN (quiet).
inline uint16_t float_to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// f rounded to the nearest bf16 value, returned as float.
inline float round_to_bf16(float f) { return bf16_bits_to_float(float_to_bf16_bits(f)); }
inline double round_to_bf16(double d) { return round_to_bf16(static_cast<float>(d)); }

float f16_bits_to_float(uint16_t bits);

}  // namespace dflash
