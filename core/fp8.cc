#include "core/fp8.h"

#include <cmath>

namespace dflash {

uint8_t float_to_e4m3_satfinite(float value) {
  if (std::isnan(value)) return 0x7f;
  const uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
  const float a = std::fabs(value);
  if (a >= kE4M3Max) return sign | 0x7e;  // satfinite: 448 and everything above
  int exponent;
  std::frexp(a, &exponent);  // a = f · 2^exponent, f in [0.5, 1)
  int e = exponent - 1;      // a = mant · 2^e, mant in [1, 2)
  if (a == 0.0f || e < -6) {
    // Subnormal range: steps of 2^-9. nearbyint rounds half to even in the default mode.
    const int m = static_cast<int>(std::nearbyint(std::ldexp(a, 9)));  // 0..8; 8 is the smallest normal
    return sign | static_cast<uint8_t>(m);
  }
  int m = static_cast<int>(std::nearbyint(std::ldexp(a, 3 - e))) - 8;  // mantissa steps of 2^(e-3)
  if (m == 8) { m = 0; ++e; }
  const int biased = e + 7;
  if (biased > 15 || (biased == 15 && m == 7)) return sign | 0x7e;  // rounds past 448
  return sign | static_cast<uint8_t>((biased << 3) | m);
}

float e4m3_to_float(uint8_t code) {
  const float sign = (code & 0x80) ? -1.0f : 1.0f;
  const int biased = (code >> 3) & 0xf;
  const int m = code & 0x7;
  if (biased == 15 && m == 7) return NAN;
  if (biased == 0) return sign * std::ldexp(static_cast<float>(m), -9);
  return sign * std::ldexp(static_cast<float>(8 + m), biased - 7 - 3);
}

QuantizedRows quantize_rows_e4m3(const Tensor& weight) {
  QuantizedRows q;
  q.rows = weight.rows();
  q.cols = weight.cols();
  q.codes.resize(static_cast<size_t>(q.rows * q.cols));
  q.scales.resize(static_cast<size_t>(q.rows));
  for (int64_t n = 0; n < q.rows; ++n) {
    const float* w = weight.row(n);
    float amax = 0.0f;
    for (int64_t k = 0; k < q.cols; ++k) amax = std::fmax(amax, std::fabs(w[k]));
    const float scale = amax == 0.0f ? 1.0f : amax / kE4M3Max;
    const float inv_scale = 1.0f / scale;
    q.scales[n] = scale;
    for (int64_t k = 0; k < q.cols; ++k) q.codes[n * q.cols + k] = float_to_e4m3_satfinite(w[k] * inv_scale);
  }
  return q;
}

float activation_scale_e4m3(const float* row, int64_t n) {
  float amax = 0.0f;
  for (int64_t k = 0; k < n; ++k) amax = std::fmax(amax, std::fabs(row[k]));
  return std::fmax(amax, kActivationAmaxFloor) / kE4M3Max;
}

void quantize_activation_e4m3(const float* row, int64_t n, float scale, uint8_t* codes) {
  const float inv_scale = 1.0f / scale;
  for (int64_t k = 0; k < n; ++k) codes[k] = float_to_e4m3_satfinite(row[k] * inv_scale);
}

Tensor decode_e4m3_codes(const QuantizedRows& q) {
  Tensor t = Tensor::zeros({q.rows, q.cols});
  for (size_t i = 0; i < q.codes.size(); ++i) t.values[i] = e4m3_to_float(q.codes[i]);
  return t;
}

}  // namespace dflash
