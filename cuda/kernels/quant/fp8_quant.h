// Per-row E4M3 quantization on the device, with the fp32 operations of core/fp8.cc
// (quantize_rows_e4m3): scale = amax / 448 (IEEE division; 1.0 for an all-zero row),
// inv = 1 / scale, code = round-to-nearest-even-satfinite(w · inv). Bit-identical to the host.
#pragma once
#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/fp8.h"
#include "core/tensor.h"

namespace dflash {

// weights: [rows, k_pad] bf16 bits (zeros past k); codes: [rows, k_pad]; scales: [rows].
void launch_quantize_rows_e4m3(cudaStream_t stream, const uint16_t* weights, int64_t rows, int64_t k_pad,
                               uint8_t* codes, float* scales);

// out[i] = the E4M3 code's value as bf16 bits (exact; the scale is not applied).
void launch_decode_e4m3_to_bf16(cudaStream_t stream, const uint8_t* codes, int64_t count, uint16_t* out);

// Test entry: uploads a bf16-valued weight, quantizes it on the device, and downloads the result
// (same layout as quantize_rows_e4m3).
QuantizedRows quantize_rows_e4m3_on_device(const Tensor& weight);

}  // namespace dflash
