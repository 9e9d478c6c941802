// The weight-only NVFP4 GEMM of the target's LM head (w4a16; docs/spec/nvfp4-lm-head.md §5):
//   C[m, n] = weight_scale_2 · Σ_k A[m, k] · (e2m1(code[n, k]) · e4m3(block_scale[n, k/16]))
// A is the bf16 final-norm output; the codes and block scales are decoded to bf16 in registers
// (exact: e2m1 · e4m3 has at most 6 significant bits), mma.sync m16n8k16 accumulates in fp32, the
// global scale multiplies each finished sum once, then the GemmEpilogue (logits, argmax partials)
// finishes it as for the other heads. It runs on exactly the m rows it is given. Each CTA reads its
// weights (V·K/2 code bytes + V·K/16 scale bytes over the grid) for 16 activation rows up to 32
// rows, for 64 beyond (the grid order that lets row tiles share them: gemm_nvfp4.cu).
#pragma once
#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/nvfp4.h"
#include "cuda/runtime/device_buffer.h"
#include "cuda/kernels/gemm/gemm.h"
#include "cuda/kernels/nvfp4/nvfp4_layout.h"

namespace dflash {

struct DeviceNvFp4View {
  int64_t n = 0, k = 0, k_pad = 0;
  const uint8_t* codes = nullptr;         // [n, k_pad/2] in the device layout (nvfp4_layout.h)
  const uint8_t* block_scales = nullptr;  // [n, k_pad/16] E4M3, in the device layout
  float global_scale = 0.0f;
};

struct DeviceNvFp4Linear {
  int64_t n = 0, k = 0, k_pad = 0;
  DeviceBuffer<uint8_t> codes, block_scales;
  float global_scale = 0.0f;
  bool present() const { return n > 0; }
  DeviceNvFp4View view() const;
  int64_t storage_bytes() const { return static_cast<int64_t>(codes.bytes() + block_scales.bytes()); }
};

// Copies a validated head to the device in the device layout; returns when it is there.
DeviceNvFp4Linear upload_nvfp4(const NvFp4Weight& w);

// Enqueues C = A·Wᵀ on `stream` with the epilogue (its scale and bias are none). A: [m, lda] bf16
// bits, 16-byte aligned, lda >= w.k and a multiple of 8; only columns [0, w.k) are read. m >= 1.
void launch_gemm_nvfp4(cudaStream_t stream, bool pdl, const uint16_t* a, int64_t lda, int64_t m,
                       const DeviceNvFp4View& w, const GemmEpilogue& epilogue);

}  // namespace dflash
