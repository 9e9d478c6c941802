// The tensor-core GEMM of the block forward from 64 rows (GemmKernel::kCutlass through gemm(),
// cuda/kernels/gemm/gemm.h; cuda/kernels/gemm/gemm_bench.cc times it, cuda/kernels/gemm/gemm_cutlass_mixed_gpu_test.cc checks it
// against the plain fallback): E4M3 weights × bf16 activations through CUTLASS's mixed-input
// Hopper collective (TMA loads, the E4M3 codes converted to bf16 in registers, wgmma with fp32
// accumulation), and out = acc · scale[col] (+ a source) in the epilogue, tiles of 128 or 256
// activation rows spread by stream-K (a shape's bits are the same run to run, but may change with m
// and the tile). Built for sm_90a only.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <cuda_runtime_api.h>

#include "cuda/kernels/gemm/gemm.h"

namespace dflash {

// Whether the current device can run the CUTLASS GEMM (compute capability 9.0: sm_90a code runs
// nowhere else); `why` says why not.
bool cutlass_mixed_supported(std::string* why);

// The workspace a launch of m rows of an [n, k_pad] weight needs (CUTLASS's own query; stream-K's
// split, and so its workspace, follows m).
size_t cutlass_mixed_workspace_bytes(int64_t m, int64_t n, int64_t k_pad);

// Enqueues out[r, c] = (Σ_k a[r, k]·w[c, k]) · w.scale[c] for r < m, c < w.n, over k < w.k_pad
// (the padding is zero in both operands). a: [m, lda] bf16 bits, lda >= w.k_pad and a multiple
// of 8; w: E4M3 with scales, no bias, n a multiple of 4; out: fp32 [m, ld_out], ld_out >= n and a
// multiple of 4; every pointer 16-byte aligned; the workspace at least cutlass_mixed_workspace_bytes.
// Anything else is refused (kBadInput) before the device is touched. Stream-K clears its
// workspace on `stream` first. The caller has asked cutlass_mixed_supported once (the drafter at
// construction): on another device the launch fails with the CUDA error. With a source (fp32
// [m, ld_out], 16-byte aligned; it may be out itself) the epilogue adds it to the scaled product,
// rounding each of the two operations (as the fallbacks' residual epilogue). tile_rows: activation
// rows per tile, 128 or 256 (gemm_cutlass_tile_rows; anything else is refused).
void launch_gemm_cutlass_mixed(cudaStream_t stream, const uint16_t* a, int64_t lda, int64_t m,
                               const DeviceMatrixView& w, float* out, int64_t ld_out, void* workspace,
                               size_t workspace_bytes, const float* source = nullptr, int tile_rows = 128);

// W8A8 (gemm_w8a8): out[r, c] = row_scale[r] · ((Σ_k a[r, k]·w[c, k]) · w.scale[c]), each product
// rounded to nearest in that order, through CUTLASS's FP8 × FP8 Hopper GEMM (fp32 accumulators
// promoted every few k-blocks). a: E4M3 codes [m, lda] (zeros past w.k), lda >= w.k_pad and a
// multiple of 16; row_scale: [m] fp32, 16-byte aligned; no source; the rest as above.
void launch_gemm_cutlass_w8a8(cudaStream_t stream, const uint8_t* a, int64_t lda, int64_t m, const DeviceMatrixView& w,
                              const float* row_scale, float* out, int64_t ld_out, void* workspace,
                              size_t workspace_bytes, int tile_rows = 128);

// The same launch prepared once: the arguments checked (as above) and CUTLASS's parameters (the
// TMA descriptors) built at construction, so that run() only clears the workspace (stream-K) and
// launches. The benchmark times run(): building the descriptors costs host time comparable to
// the small shapes' kernels.
class CutlassMixedGemm {
 public:
  CutlassMixedGemm(const uint16_t* a, int64_t lda, int64_t m, const DeviceMatrixView& w, float* out, int64_t ld_out,
                   void* workspace, size_t workspace_bytes, cudaStream_t stream, int tile_rows = 128);
  // W8A8's launch (launch_gemm_cutlass_w8a8).
  CutlassMixedGemm(const uint8_t* a, int64_t lda, int64_t m, const DeviceMatrixView& w, const float* row_scale,
                   float* out, int64_t ld_out, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                   int tile_rows = 128);
  ~CutlassMixedGemm();
  CutlassMixedGemm(CutlassMixedGemm&&) noexcept;
  CutlassMixedGemm& operator=(CutlassMixedGemm&&) noexcept;
  void run(cudaStream_t stream);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dflash
