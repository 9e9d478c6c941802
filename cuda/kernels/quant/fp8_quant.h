// Per-row E4M3 quantization on the device, with the fp32 operations of core/fp8.cc
// (quantize_rows_e4m3): scale = amax / 448 (IEEE division; 1.0 for an all-zero row),
// inv = 1 / scale, code = round-to-nearest-even-satfinite(w · inv). Bit-identical to the host.
#pragma once
#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

#include "core/fp8.h"
#include "core/tensor.h"

namespace dflash {

// weights: [rows, k_pad] bf16 bits (zeros past k); codes: [rows, k_pad]; scales: [rows].
void launch_quantize_rows_e4m3(cudaStream_t stream, const uint16_t* weights, int64_t rows, int64_t k_pad,
                               uint8_t* codes, float* scales);

// W8A8's per-token activation quantization (docs/spec/drafter.md §6, core/fp8.h's
// activation_scale_e4m3 and quantize_activation_e4m3, bit for bit): a [rows, lda] bf16 bits; codes
// [rows, ld_codes] with zeros in [k, k_pad); scales [rows]. static_scale > 0: the checkpoint's
// per-tensor input_scale for every row; 0: each row's own. pdl: programmatic dependent launch.
void launch_quantize_activations_e4m3(cudaStream_t stream, const uint16_t* a, int64_t lda, int64_t rows, int64_t k,
                                      int64_t k_pad, float static_scale, uint8_t* codes, int64_t ld_codes,
                                      float* scales, bool pdl);

// Test entry: rows of bf16 values quantized on the device (k_pad: k rounded up to 64).
struct ActivationCodes {
  int64_t k_pad = 0;
  std::vector<uint8_t> codes;  // [rows, k_pad]
  std::vector<float> scales;   // [rows]
};
ActivationCodes quantize_activations_e4m3_on_device(const Tensor& rows, float static_scale);

// out[i] = the E4M3 code's value as bf16 bits (exact; the scale is not applied).
void launch_decode_e4m3_to_bf16(cudaStream_t stream, const uint8_t* codes, int64_t count, uint16_t* out);

// Test entry: uploads a bf16-valued weight, quantizes it on the device, and downloads the result
// (same layout as quantize_rows_e4m3).
QuantizedRows quantize_rows_e4m3_on_device(const Tensor& weight);

}  // namespace dflash
