#include "core/dtype.h"

#include <cmath>

namespace dflash {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kBF16: case DType::kF16: return 2;
    case DType::kF32: case DType::kI32: return 4;
    case DType::kF64: case DType::kI64: return 8;
    case DType::kF8E4M3: case DType::kU8: return 1;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
    case DType::kF32: return "F32";
    case DType::kF64: return "F64";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
    case DType::kF8E4M3: return "F8_E4M3";
    case DType::kU8: return "U8";
  }
  return "?";
}

bool parse_dtype(const std::string& name, DType* out) {
  static const struct { const char* name; DType dtype; } kTable[] = {
      {"BF16", DType::kBF16}, {"F16", DType::kF16}, {"F32", DType::kF32}, {"F64", DType::kF64},
      {"I32", DType::kI32}, {"I64", DType::kI64}, {"F8_E4M3", DType::kF8E4M3}, {"U8", DType::kU8}};
  for (const auto& entry : kTable) {
    if (name == entry.name) { *out = entry.dtype; return true; }
  }
  return false;
}

float f16_bits_to_float(uint16_t bits) {
  const int sign = (bits >> 15) & 1;
  const int exponent = (bits >> 10) & 0x1f;
  const int mantissa = bits & 0x3ff;
  float value;
  if (exponent == 0) value = std::ldexp(static_cast<float>(mantissa), -24);
  else if (exponent == 31) value = mantissa ? NAN : INFINITY;
  else value = std::ldexp(static_cast<float>(mantissa | 0x400), exponent - 25);
  return sign ? -value : value;
}

}  // namespace dflash
