#include "cuda/kernels/quant/fp8_quant.h"

#include <cuda_bf16.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "cuda/runtime/cuda_check.h"
#include "cuda/runtime/device_buffer.h"
#include "cuda/runtime/launch.cuh"

namespace dflash {
namespace {

// core/fp8.cc's float_to_e4m3_satfinite, operation for operation (frexp, ldexp and rint are exact).
__device__ uint8_t float_to_e4m3_satfinite_device(float value) {
  if (isnan(value)) return 0x7f;
  const uint8_t sign = signbit(value) ? 0x80 : 0x00;
  const float a = fabsf(value);
  if (a >= kE4M3Max) return sign | 0x7e;
  int exponent;
  frexpf(a, &exponent);
  int e = exponent - 1;
  if (a == 0.0f || e < -6) {
    const int m = static_cast<int>(rintf(ldexpf(a, 9)));
    return sign | static_cast<uint8_t>(m);
  }
  int m = static_cast<int>(rintf(ldexpf(a, 3 - e))) - 8;
  if (m == 8) {
    m = 0;
    ++e;
  }
  const int biased = e + 7;
  if (biased > 15 || (biased == 15 && m == 7)) return sign | 0x7e;
  return sign | static_cast<uint8_t>((biased << 3) | m);
}

constexpr int kThreads = 256;

__global__ void quantize_rows_kernel(const __nv_bfloat16* weights, int64_t k_pad, uint8_t* codes, float* scales) {
  const int64_t row = blockIdx.x;
  const __nv_bfloat16* w = weights + row * k_pad;
  float amax = 0.0f;
  for (int64_t k = threadIdx.x; k < k_pad; k += kThreads) amax = fmaxf(amax, fabsf(__bfloat162float(w[k])));
  // max is exact and order-free: any reduction tree gives the host's value
  for (int offset = 16; offset > 0; offset >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  __shared__ float warp_max[kThreads / 32];
  __shared__ float row_scale;
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x / 32] = amax;
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = warp_max[0];
    for (int i = 1; i < kThreads / 32; ++i) m = fmaxf(m, warp_max[i]);
    const float scale = m == 0.0f ? 1.0f : __fdiv_rn(m, kE4M3Max);
    row_scale = scale;
    scales[row] = scale;
  }
  __syncthreads();
  const float inv_scale = __fdiv_rn(1.0f, row_scale);
  for (int64_t k = threadIdx.x; k < k_pad; k += kThreads) {
    codes[row * k_pad + k] = float_to_e4m3_satfinite_device(__fmul_rn(__bfloat162float(w[k]), inv_scale));
  }
}

// W8A8's per-token quantization (docs/spec/drafter.md §6), one CTA per row, with core/fp8.cc's
// fp32 operations: scale = max(amax, 2^-9) / 448 (fmax ignores NaN, as the host's), or the static
// scale where static_scale > 0; codes of a·(1/scale), zeros past k.
__global__ void quantize_activations_kernel(const __nv_bfloat16* a, int64_t lda, int64_t k, int64_t k_pad,
                                            float static_scale, uint8_t* codes, int64_t ld_codes, float* scales) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t row = blockIdx.x;
  const __nv_bfloat16* x = a + row * lda;
  __shared__ float warp_max[kThreads / 32];
  __shared__ float row_scale;
  if (static_scale > 0.0f) {
    if (threadIdx.x == 0) row_scale = static_scale;
  } else {
    float amax = 0.0f;
    for (int64_t i = threadIdx.x; i < k; i += kThreads) amax = fmaxf(amax, fabsf(__bfloat162float(x[i])));
    for (int offset = 16; offset > 0; offset >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
    if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x / 32] = amax;
    __syncthreads();
    if (threadIdx.x == 0) {
      float m = warp_max[0];
      for (int i = 1; i < kThreads / 32; ++i) m = fmaxf(m, warp_max[i]);
      row_scale = __fdiv_rn(fmaxf(m, kActivationAmaxFloor), kE4M3Max);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) scales[row] = row_scale;
  const float inv_scale = __fdiv_rn(1.0f, row_scale);
  for (int64_t i = threadIdx.x; i < k_pad; i += kThreads) {
    codes[row * ld_codes + i] =
        i < k ? float_to_e4m3_satfinite_device(__fmul_rn(__bfloat162float(x[i]), inv_scale)) : uint8_t{0};
  }
}

__device__ float e4m3_value(uint8_t code) {
  const float sign = (code & 0x80) ? -1.0f : 1.0f;
  const int biased = (code >> 3) & 0xf;
  const int m = code & 0x7;
  if (biased == 15 && m == 7) return NAN;
  if (biased == 0) return sign * ldexpf(static_cast<float>(m), -9);
  return sign * ldexpf(static_cast<float>(8 + m), biased - 10);
}

__global__ void decode_kernel(const uint8_t* codes, int64_t count, __nv_bfloat16* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) out[i] = __float2bfloat16_rn(e4m3_value(codes[i]));  // exact: 4 significant bits
}

}  // namespace

void launch_quantize_rows_e4m3(cudaStream_t stream, const uint16_t* weights, int64_t rows, int64_t k_pad,
                               uint8_t* codes, float* scales) {
  if (rows < 1) return;
  quantize_rows_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      reinterpret_cast<const __nv_bfloat16*>(weights), k_pad, codes, scales);
  DFLASH_CUDA_CHECK_LAUNCH("quantize_rows_kernel");
}

void launch_quantize_activations_e4m3(cudaStream_t stream, const uint16_t* a, int64_t lda, int64_t rows, int64_t k,
                                      int64_t k_pad, float static_scale, uint8_t* codes, int64_t ld_codes,
                                      float* scales, bool pdl) {
  if (rows < 1) return;
  if (k > k_pad || k_pad > ld_codes || k > lda || !(static_scale == 0.0f || (std::isfinite(static_scale) && static_scale > 0.0f))) {
    throw internal_error("quantize_activations_e4m3: k " + std::to_string(k) + ", k_pad " + std::to_string(k_pad) +
                         ", lda " + std::to_string(lda) + ", ld_codes " + std::to_string(ld_codes) + ", static scale " +
                         std::to_string(static_scale));
  }
  launch_kernel(DFLASH_KERNEL_SITE("quantize_activations_kernel"), quantize_activations_kernel,
                dim3(static_cast<unsigned>(rows)), dim3(kThreads), 0, stream, pdl,
                reinterpret_cast<const __nv_bfloat16*>(a), lda, k, k_pad, static_scale, codes, ld_codes, scales);
}

ActivationCodes quantize_activations_e4m3_on_device(const Tensor& rows, float static_scale) {
  const int64_t m = rows.rows(), k = rows.cols(), k_pad = (k + 63) / 64 * 64;
  std::vector<uint16_t> bits(static_cast<size_t>(m * k));
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = float_to_bf16_bits(rows.values[i]);
  DeviceBuffer<uint16_t> d_rows(bits.size());
  DeviceBuffer<uint8_t> d_codes(static_cast<size_t>(m * k_pad));
  DeviceBuffer<float> d_scales(static_cast<size_t>(m));
  DFLASH_CUDA_CHECK(cudaMemcpy(d_rows.get(), bits.data(), bits.size() * 2, cudaMemcpyHostToDevice));
  launch_quantize_activations_e4m3(nullptr, d_rows.get(), k, m, k, k_pad, static_scale, d_codes.get(), k_pad,
                                   d_scales.get(), false);
  ActivationCodes out;
  out.k_pad = k_pad;
  out.codes.resize(static_cast<size_t>(m * k_pad));
  out.scales.resize(static_cast<size_t>(m));
  DFLASH_CUDA_CHECK(cudaMemcpy(out.codes.data(), d_codes.get(), out.codes.size(), cudaMemcpyDeviceToHost));
  DFLASH_CUDA_CHECK(cudaMemcpy(out.scales.data(), d_scales.get(), out.scales.size() * 4, cudaMemcpyDeviceToHost));
  return out;
}

void launch_decode_e4m3_to_bf16(cudaStream_t stream, const uint8_t* codes, int64_t count, uint16_t* out) {
  if (count < 1) return;
  decode_kernel<<<static_cast<unsigned>((count + 255) / 256), 256, 0, stream>>>(codes, count,
                                                                                reinterpret_cast<__nv_bfloat16*>(out));
  DFLASH_CUDA_CHECK_LAUNCH("decode_kernel");
}

QuantizedRows quantize_rows_e4m3_on_device(const Tensor& weight) {
  const int64_t rows = weight.rows(), cols = weight.cols();
  std::vector<uint16_t> bits(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < bits.size(); ++i) {
    bits[i] = float_to_bf16_bits(weight.values[i]);
    if (bf16_bits_to_float(bits[i]) != weight.values[i] && !std::isnan(weight.values[i])) {
      throw bad_input("quantize_rows_e4m3_on_device: element " + std::to_string(i) + " is not a bf16 value");
    }
  }
  DeviceBuffer<uint16_t> d_weights(bits.size());
  DeviceBuffer<uint8_t> d_codes(bits.size());
  DeviceBuffer<float> d_scales(static_cast<size_t>(rows));
  DFLASH_CUDA_CHECK(cudaMemcpy(d_weights.get(), bits.data(), bits.size() * 2, cudaMemcpyHostToDevice));
  launch_quantize_rows_e4m3(nullptr, d_weights.get(), rows, cols, d_codes.get(), d_scales.get());
  QuantizedRows q;
  q.rows = rows;
  q.cols = cols;
  q.codes.resize(bits.size());
  q.scales.resize(static_cast<size_t>(rows));
  DFLASH_CUDA_CHECK(cudaMemcpy(q.codes.data(), d_codes.get(), q.codes.size(), cudaMemcpyDeviceToHost));
  DFLASH_CUDA_CHECK(cudaMemcpy(q.scales.data(), d_scales.get(), q.scales.size() * 4, cudaMemcpyDeviceToHost));
  return q;
}

}  // namespace dflash
