#include "bench/gemm_peak.h"

#include <functional>
#include <string>
#include <vector>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "bench/median.h"
#include "core/error.h"
#include "cuda/runtime/cuda_check.h"
#include "cuda/runtime/device_buffer.h"
#include "cuda/kernels/gemm/gemm.h"

namespace dflash {
namespace {

// Random bytes: bf16 pairs in (-2, 2) (the high byte's exponent bit 6 cleared) or E4M3 codes
// without NaN; the same generator fills both kinds.
std::vector<uint8_t> random_bytes(size_t count, uint64_t seed, bool bf16_pairs) {
  std::vector<uint8_t> out(count);
  uint64_t state = seed;
  for (size_t i = 0; i < count; i += 4) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    for (size_t j = 0; j < 4 && i + j < count; ++j) {
      uint8_t b = static_cast<uint8_t>(state >> (32 + 8 * j));
      if (bf16_pairs && j % 2 == 1) b &= 0xbf;
      if (!bf16_pairs && (b & 0x7f) == 0x7f) b &= 0xfe;
      out[i + j] = b;
    }
  }
  return out;
}

}  // namespace

GemmPeak measure_gemm_peak(int64_t size, int repeats) {
  GemmPeak peak;
  peak.size = size;
  const size_t elements = static_cast<size_t>(size * size);
  DeviceBuffer<uint8_t> w(elements * 2), a(elements * 2);
  DeviceBuffer<float> out(elements);
  DeviceBuffer<uint8_t> workspace(size_t{32} << 20);
  cudaStream_t stream;
  DFLASH_CUDA_CHECK(cudaStreamCreate(&stream));
  cublasLtHandle_t lt;
  DFLASH_CUDA_CHECK(cublasLtCreate(&lt));
  GemmContext ctx;
  ctx.stream = stream;
  ctx.lt = lt;
  ctx.lt_workspace = workspace.get();
  ctx.lt_workspace_bytes = workspace.bytes();
  cudaEvent_t start, stop;
  DFLASH_CUDA_CHECK(cudaEventCreate(&start));
  DFLASH_CUDA_CHECK(cudaEventCreate(&stop));
  auto upload = [&](bool bf16) {
    const size_t bytes = elements * (bf16 ? 2 : 1);
    const std::vector<uint8_t> hw = random_bytes(bytes, 11, bf16), ha = random_bytes(bytes, 13, bf16);
    DFLASH_CUDA_CHECK(cudaMemcpy(w.get(), hw.data(), bytes, cudaMemcpyHostToDevice));
    DFLASH_CUDA_CHECK(cudaMemcpy(a.get(), ha.data(), bytes, cudaMemcpyHostToDevice));
  };
  auto flops_per_s = [&](const std::function<void()>& launch) {
    for (int i = 0; i < 3; ++i) launch();
    std::vector<float> ms;
    for (int i = 0; i < repeats; ++i) {
      DFLASH_CUDA_CHECK(cudaEventRecord(start, stream));
      launch();
      DFLASH_CUDA_CHECK(cudaEventRecord(stop, stream));
      DFLASH_CUDA_CHECK(cudaEventSynchronize(stop));
      float t = 0;
      DFLASH_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
      ms.push_back(t);
    }
    return 2.0 * static_cast<double>(size) * static_cast<double>(size) * static_cast<double>(size) /
           (static_cast<double>(median(ms)) * 1e-3);
  };
  DeviceMatrixView view;
  view.n = size;
  view.k = size;
  view.k_pad = size;
  view.data = w.get();
  try {
    upload(true);
    view.format = WeightFormat::kBf16;
    peak.bf16 = flops_per_s([&] {
      cublaslt_matmul(ctx, reinterpret_cast<const uint16_t*>(a.get()), size, size, view, out.get(), size);
    });
    upload(false);
    view.format = WeightFormat::kE4M3;
    if (cublaslt_matmul_e4m3(ctx, a.get(), size, size, view, out.get(), size)) {
      peak.e4m3 = flops_per_s([&] { cublaslt_matmul_e4m3(ctx, a.get(), size, size, view, out.get(), size); });
    } else {
      peak.e4m3_unavailable = "cuBLASLt has no E4M3 x E4M3 algorithm for m = n = k = " + std::to_string(size);
    }
  } catch (...) {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    cublasLtDestroy(lt);
    cudaStreamDestroy(stream);
    throw;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cublasLtDestroy(lt);
  cudaStreamDestroy(stream);
  return peak;
}

}  // namespace dflash
