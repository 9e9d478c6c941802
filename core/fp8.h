// OCP E4M3 (max 448, no infinities) and the per-row weight quantization of docs/spec/drafter.md §6:
//   scale[n] = max_k |W[n,k]| / 448   (fp32 division; 1.0 for an all-zero row)
//   q[n,k]   = e4m3_rne_satfinite(W[n,k] * (1 / scale[n]))   (fp32 reciprocal, fp32 product,
//              one round-to-nearest-even to E4M3, magnitudes past 448 saturate to 448)
//   C[m,n]   = scale[n] * sum_k A[m,k] * q[n,k]
// The CUDA drafter quantizes on the device with the same fp32 operations, so both hold the same
// bytes (tested bit for bit).
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace dflash {

constexpr float kE4M3Max = 448.0f;

// Round-to-nearest-even to E4M3 with saturation to ±448; NaN maps to 0x7f.
uint8_t float_to_e4m3_satfinite(float value);
float e4m3_to_float(uint8_t code);

struct QuantizedRows {
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> codes;  // [rows, cols] E4M3
  std::vector<float> scales;   // [rows]
};

QuantizedRows quantize_rows_e4m3(const Tensor& weight);
// codes decoded to float, [rows, cols] (the scale is not applied: it multiplies the dot product).
Tensor decode_e4m3_codes(const QuantizedRows& q);

// W8A8 (docs/spec/drafter.md §6): a GEMM's input rows quantized per token, each row on its own:
//   scale   = max(amax, 2^-9) / 448   (fp32 division; amax = max_k |x[k]|, NaN ignored)
//           or the projection's static per-tensor input_scale
//   code[k] = e4m3_rne_satfinite(x[k] * (1 / scale))   (fp32 reciprocal, fp32 product)
//   C[m,n]  = act_scale[m] * (weight_scale[n] * sum_k code[m,k] * q[n,k])   (fp32 sum)
// The floor 2^-9 is vLLM's: its per-token kernel takes max(amax / 448, 1 / (448 · 512)), the same
// fp32 value as max(amax, 2^-9) / 448 (448 · 2^9 is exact and division by 448 is monotone), so an
// all-zero row gets a finite scale and all-zero codes.
constexpr float kActivationAmaxFloor = 0x1p-9f;

// The dynamic scale of one row of n values.
float activation_scale_e4m3(const float* row, int64_t n);
// codes[k] = e4m3_rne_satfinite(row[k] * (1 / scale)) for k < n; scale > 0.
void quantize_activation_e4m3(const float* row, int64_t n, float scale, uint8_t* codes);

}  // namespace dflash
