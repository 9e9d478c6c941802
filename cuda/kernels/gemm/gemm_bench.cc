// The mma GEMM kernel alone, at the drafter's block-forward shapes (Qwen3-8B-DFlash-b16: q|k|v,
// o, gate|up, down, lm_head), for each CTA width (32 / 64 columns) and weight
// format: the weight bytes each launch must read over its median time, beside the device-to-device
// copy bandwidth measured in the same run. It says which width to use for which shape
// (gemm_mma_columns) and how far each GEMM is from streaming its weights at the copy rate.
//
// Weights are random E4M3 codes (NaN codes excluded) or bf16 values, cut as windows from one
// 2 GiB buffer at rotating offsets, so that consecutive launches never find their weights in L2.
// Each number is the median over 15 repetitions (--reps) of (20 back-to-back launches) / 20.
// --hot reads the same window every launch instead (L2-resident when it fits): the kernel's speed
// when its weights come from L2. Last, the NVFP4 lm_head kernel (gemm_nvfp4.h) at the lm_head's
// shape, with its HBM floor (its bytes at the copy rate). Then the CUTLASS mixed-input GEMM the
// drafter uses from 64 block rows (cuda/kernels/gemm/gemm_cutlass_mixed.h) at every shape and --candidate-m
// (default 64, 128, 512): TFLOP/s and the fraction of the bf16 tensor-core peak of a large cuBLASLt
// GEMM measured in the same run (bench/gemm_peak.h), whose e4m3 peak is printed beside it.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <cuda_runtime_api.h>

#include "bench/copy_bandwidth.h"
#include "bench/gemm_peak.h"
#include "bench/median.h"
#include "core/dtype.h"
#include "core/error.h"
#include "cuda/runtime/cuda_check.h"
#include "cuda/drafter/cuda_drafter.h"
#include "cuda/runtime/device_buffer.h"
#include "cuda/kernels/gemm/gemm.h"
#include "cuda/kernels/gemm/gemm_cutlass_mixed.h"
#include "cuda/kernels/nvfp4/gemm_nvfp4.h"

namespace dflash {
namespace {

struct Shape {
  const char* name;
  int64_t n, k;
};

uint64_t next_random(uint64_t& state) {
  state = state * 6364136223846793005ull + 1442695040888963407ull;
  return state >> 33;
}

int main_impl(int argc, char** argv) {
  CLI::App app{"mma GEMM kernel at the drafter's block-forward shapes"};
  std::vector<int64_t> ms = {16, 64};
  app.add_option("--m", ms, "rows per launch (default 16 64)");
  std::string only_shape, only_format;
  int only_columns = -1, reps = 15;
  app.add_option("--shape", only_shape, "only this shape (q|k|v, o, gate|up, down, lm_head)");
  app.add_option("--format", only_format,
                 "only this weight format (e4m3, bf16, nvfp4: the lm_head only, cutlass: the CUTLASS E4M3 GEMM; "
                 "w8a8: W8A8's GEMMs, each algorithm of cuBLASLt's heuristic and CUTLASS's FP8 GEMM, only when named)");
  std::vector<int64_t> candidate_ms = {64, 128, 512};
  app.add_option("--candidate-m", candidate_ms, "rows per launch of the CUTLASS GEMM (default 64 128 512)")
      ->check(CLI::Range(1, 4096));
  std::vector<int> tile_rows = {128, 256};
  app.add_option("--cutlass-tile-rows", tile_rows, "activation rows per CUTLASS tile, each timed (default 128 256)")
      ->check(CLI::IsMember({128, 256}));
  bool hot = false;
  app.add_flag("--hot", hot,
               "every launch reads the same weights (L2-resident when they fit): the kernel's speed from L2, "
               "e.g. after an l2_prefetch");
  app.add_option("--columns", only_columns, "only this CTA width (32, 64)");
  std::vector<int64_t> lt_ms = {16, 128, 512};
  app.add_option("--lt-m", lt_ms, "rows per launch of the w8a8 rows (default 16 128 512)")->check(CLI::Range(1, 4096));
  int lt_algos = 8;
  app.add_option("--lt-algos", lt_algos, "algorithms of cuBLASLt's heuristic the w8a8 rows time (default 8)")
      ->check(CLI::Range(1, 64));
  app.add_option("--reps", reps, "timed repetitions of 20 launches per row (for a profiler: 1)")->check(CLI::Range(1, 1000));
  CLI11_PARSE(app, argc, argv);
  std::string why;
  if (!cuda_device_available(&why)) {
    std::fprintf(stderr, "gemm_bench: %s\n", why.c_str());
    return 125;
  }
  const std::vector<Shape> shapes = {{"q|k|v", 6144, 4096}, {"o", 4096, 4096}, {"gate|up", 24576, 4096},
                                     {"down", 4096, 12288}, {"lm_head", 151936, 4096}};
  const size_t pool_bytes = size_t{2} << 30;
  DeviceBuffer<uint8_t> pool(pool_bytes);
  {
    std::vector<uint8_t> host(pool_bytes);
    uint64_t state = 1;
    for (size_t i = 0; i < host.size(); i += 4) {
      const uint64_t r = next_random(state);
      for (int j = 0; j < 4; ++j) {
        uint8_t code = static_cast<uint8_t>(r >> (8 * j));
        if ((code & 0x7f) == 0x7f) code &= 0xfe;  // no E4M3 NaN
        if (j % 2 == 1) code &= 0xbf;  // read as bf16 pairs: exponent below 2^1, finite
        host[i + j] = code;
      }
    }
    DFLASH_CUDA_CHECK(cudaMemcpy(pool.get(), host.data(), pool_bytes, cudaMemcpyHostToDevice));
  }
  const double bandwidth = measure_copy_bandwidth(size_t{1} << 30);
  int sm_count = 0;
  DFLASH_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0));
  const int64_t max_m = *std::max_element(ms.begin(), ms.end());
  const int64_t max_k = 12288;
  std::vector<uint16_t> a_host(static_cast<size_t>(max_m * max_k));
  uint64_t state = 7;
  for (auto& v : a_host) v = float_to_bf16_bits(static_cast<float>(next_random(state) % 2001) / 1000.0f - 1.0f);
  DeviceBuffer<uint16_t> a(a_host.size());
  DFLASH_CUDA_CHECK(cudaMemcpy(a.get(), a_host.data(), a_host.size() * 2, cudaMemcpyHostToDevice));
  DeviceBuffer<float> scale(151936), out(static_cast<size_t>(max_m * 151936));
  {
    std::vector<float> ones(151936, 1.0f / 64);
    DFLASH_CUDA_CHECK(cudaMemcpy(scale.get(), ones.data(), ones.size() * 4, cudaMemcpyHostToDevice));
  }
  cudaStream_t stream;
  DFLASH_CUDA_CHECK(cudaStreamCreate(&stream));
  prepare_gemm_kernels();
  cudaEvent_t start, stop;
  DFLASH_CUDA_CHECK(cudaEventCreate(&start));
  DFLASH_CUDA_CHECK(cudaEventCreate(&stop));
  // One launch's median time in us: 3 untimed launches, then `reps` times 20 back to back;
  // launch(i) runs launch number i (the weights' window rotates with it).
  auto time_launches = [&](const std::function<void(int)>& launch) {
    for (int i = 0; i < 3; ++i) launch(i);
    std::vector<float> per_launch;
    int next = 0;
    for (int rep = 0; rep < reps; ++rep) {
      DFLASH_CUDA_CHECK(cudaEventRecord(start, stream));
      for (int i = 0; i < 20; ++i) launch(next++);
      DFLASH_CUDA_CHECK(cudaEventRecord(stop, stream));
      DFLASH_CUDA_CHECK(cudaEventSynchronize(stop));
      float t = 0;
      DFLASH_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
      per_launch.push_back(t * 1000.0f / 20);
    }
    return median(per_launch);
  };

  std::printf("device-to-device copy: %.0f GB/s (read + write)\n", bandwidth / 1e9);
  std::printf("| shape | n x k | format | m | columns | median us | weight GB/s | x copy rate |\n|---|---|---|---|---|---|---|---|\n");
  for (bool fp8 : {true, false}) {
    if (!only_format.empty() && only_format != (fp8 ? "e4m3" : "bf16")) continue;
    for (const Shape& s : shapes) {
      if (!only_shape.empty() && only_shape != s.name) continue;
      const int64_t element = fp8 ? 1 : 2;
      const int64_t bytes = s.n * s.k * element;
      for (int64_t m : ms) {
        for (int columns : {32, 64}) {
          // m > 16 (64-row tiles): 32 columns, or 64 with E4M3 weights (gemm_cols_m64).
          if (m > 16 && columns != 32 && !(columns == 64 && fp8)) continue;
          if (only_columns >= 0 && columns != only_columns) continue;
          GemmContext ctx;
          ctx.stream = stream;
          ctx.mma_columns = columns;
          ctx.mma_columns_m64 = columns == 64 ? 64 : 32;
          ctx.sm_count = sm_count;
          GemmEpilogue ep;
          ep.out = out.get();
          ep.ld_out = s.n;
          const int64_t windows = hot ? 1 : std::max<int64_t>(1, static_cast<int64_t>(pool_bytes) / bytes);
          auto view_at = [&](int i) {
            DeviceMatrixView w;
            w.format = fp8 ? WeightFormat::kE4M3 : WeightFormat::kBf16;
            w.n = s.n;
            w.k = s.k;
            w.k_pad = s.k;
            w.data = pool.get() + (i % windows) * bytes;
            w.scale = fp8 ? scale.get() : nullptr;
            return w;
          };
          const double us = time_launches([&](int i) { gemm(GemmKernel::kMma, ctx, a.get(), max_k, m, view_at(i), ep); });
          const double rate = static_cast<double>(bytes) / (us * 1e-6);
          std::printf("| %s | %lld x %lld | %s | %lld | %d | %.1f | %.0f | %.2f |\n", s.name, static_cast<long long>(s.n),
                      static_cast<long long>(s.k), fp8 ? "e4m3" : "bf16", static_cast<long long>(m), columns, us,
                      rate / 1e9, bandwidth / rate);
          std::fflush(stdout);
        }
      }
    }
  }

  // The target's lm_head in NVFP4 (cuda/kernels/nvfp4/gemm_nvfp4.h) at the same geometry: codes and block scales
  // are windows of the same pool (timing only: any byte is a code, a scale byte may be NaN). Floor:
  // its bytes (V·K/2 + V·K/16) at the copy rate.
  if ((only_format.empty() || only_format == "nvfp4") && (only_shape.empty() || only_shape == "lm_head") &&
      only_columns < 0) {
    const Shape& s = shapes.back();
    const int64_t code_bytes = s.n * s.k / 2, bytes = code_bytes + s.n * s.k / 16;
    const int64_t windows = hot ? 1 : std::max<int64_t>(1, static_cast<int64_t>(pool_bytes) / bytes);
    auto view_at = [&](int i) {
      DeviceNvFp4View w;
      w.n = s.n;
      w.k = s.k;
      w.k_pad = nvfp4_pad_k(s.k);
      w.codes = pool.get() + (i % windows) * bytes;
      w.block_scales = w.codes + code_bytes;
      w.global_scale = 1.0f / 2688;
      return w;
    };
    std::printf("\n| shape | n x k | format | m | median us | weight GB/s | x copy rate | HBM floor us | x floor |\n"
                "|---|---|---|---|---|---|---|---|---|\n");
    for (int64_t m : ms) {
      GemmEpilogue ep;
      ep.out = out.get();
      ep.ld_out = s.n;
      const double us = time_launches([&](int i) { launch_gemm_nvfp4(stream, false, a.get(), max_k, m, view_at(i), ep); });
      const double rate = static_cast<double>(bytes) / (us * 1e-6);
      const double floor_us = static_cast<double>(bytes) / bandwidth * 1e6;
      std::printf("| lm_head | %lld x %lld | nvfp4 | %lld | %.1f | %.0f | %.2f | %.1f | %.2f |\n", static_cast<long long>(s.n),
                  static_cast<long long>(s.k), static_cast<long long>(m), us, rate / 1e9, bandwidth / rate, floor_us,
                  us / floor_us);
      std::fflush(stdout);
    }
  }

  // The CUTLASS mixed-input GEMM (E4M3 weights x bf16 activations, fp32 accumulation, the row
  // scale in the epilogue) against the tensor cores' peak.
  if ((only_format.empty() || only_format == "cutlass") && only_columns < 0) {
    std::string why;
    if (!cutlass_mixed_supported(&why)) {
      std::printf("\nCUTLASS GEMM: not run: %s\n", why.c_str());
    } else {
      const GemmPeak peak = measure_gemm_peak();
      std::printf("\ncuBLASLt GEMM peak (m = n = k = %lld): bf16 %.0f TFLOP/s, e4m3 ", static_cast<long long>(peak.size),
                  peak.bf16 / 1e12);
      if (peak.e4m3 > 0) {
        std::printf("%.0f TFLOP/s\n", peak.e4m3 / 1e12);
      } else {
        std::printf("unavailable (%s)\n", peak.e4m3_unavailable.c_str());
      }
      const int64_t cand_max_m = *std::max_element(candidate_ms.begin(), candidate_ms.end());
      std::vector<uint16_t> cand_a_host(static_cast<size_t>(cand_max_m * max_k));
      for (auto& v : cand_a_host) v = float_to_bf16_bits(static_cast<float>(next_random(state) % 2001) / 1000.0f - 1.0f);
      DeviceBuffer<uint16_t> cand_a(cand_a_host.size());
      DFLASH_CUDA_CHECK(cudaMemcpy(cand_a.get(), cand_a_host.data(), cand_a_host.size() * 2, cudaMemcpyHostToDevice));
      DeviceBuffer<float> cand_out(static_cast<size_t>(cand_max_m * 151936));
      size_t workspace_bytes = 1;
      for (const Shape& s : shapes) {
        for (int64_t m : candidate_ms) workspace_bytes = std::max(workspace_bytes, cutlass_mixed_workspace_bytes(m, s.n, s.k));
      }
      DeviceBuffer<uint8_t> workspace(workspace_bytes);
      std::printf("| shape | n x k | format | m | tile rows | median us | TFLOP/s | x bf16 peak | weight GB/s "
                  "| x copy rate |\n|---|---|---|---|---|---|---|---|---|---|\n");
      for (const Shape& s : shapes) {
        if (!only_shape.empty() && only_shape != s.name) continue;
        const int64_t bytes = s.n * s.k;
        const int64_t windows = hot ? 1 : std::max<int64_t>(1, static_cast<int64_t>(pool_bytes) / bytes);
        for (int64_t m : candidate_ms) {
          for (int tile : tile_rows) {
            // One prepared launch per weight window: the timed loop only launches.
            std::vector<CutlassMixedGemm> plans;
            for (int64_t i = 0; i < windows; ++i) {
              DeviceMatrixView w;
              w.format = WeightFormat::kE4M3;
              w.n = s.n;
              w.k = s.k;
              w.k_pad = s.k;
              w.data = pool.get() + i * bytes;
              w.scale = scale.get();
              plans.emplace_back(cand_a.get(), max_k, m, w, cand_out.get(), s.n, workspace.get(), workspace.bytes(),
                                 stream, tile);
            }
            const double us = time_launches([&](int i) { plans[static_cast<size_t>(i % windows)].run(stream); });
            const double flops =
                2.0 * static_cast<double>(m) * static_cast<double>(s.n) * static_cast<double>(s.k) / (us * 1e-6);
            const double rate = static_cast<double>(bytes) / (us * 1e-6);
            std::printf("| %s | %lld x %lld | e4m3 x bf16 (cutlass) | %lld | %d | %.1f | %.0f | %.2f | %.0f | %.2f |\n",
                        s.name, static_cast<long long>(s.n), static_cast<long long>(s.k), static_cast<long long>(m),
                        tile, us, flops / 1e12, flops / peak.bf16, rate / 1e9, bandwidth / rate);
            std::fflush(stdout);
          }
        }
      }
    }
  }
  // W8A8's library GEMMs (E4M3 activations x E4M3 weights, fp32 out, as gemm_w8a8 runs them): each
  // of the first --lt-algos algorithms cuBLASLt's heuristic offers at every shape and --lt-m (rank
  // 0 is the one the drafter runs), then CUTLASS's FP8 GEMM with both scales in its epilogue at
  // each --cutlass-tile-rows. The GEMM alone: the activation quantization and the epilogue kernel
  // (which cuBLASLt's product still needs for its scales) are not in these times.
  if (only_format == "w8a8") {
    cublasLtHandle_t lt;
    DFLASH_CUDA_CHECK(cublasLtCreate(&lt));
    DeviceBuffer<uint8_t> workspace(32u << 20);  // the drafter's cuBLASLt workspace
    const int64_t lt_max_m = *std::max_element(lt_ms.begin(), lt_ms.end());
    DeviceBuffer<uint8_t> codes(static_cast<size_t>(lt_max_m * max_k));
    DFLASH_CUDA_CHECK(cudaMemcpy(codes.get(), pool.get(), codes.bytes(), cudaMemcpyDeviceToDevice));
    DeviceBuffer<float> lt_out(static_cast<size_t>(lt_max_m * 151936));
    DeviceBuffer<float> token_scale(static_cast<size_t>(lt_max_m));
    {
      std::vector<float> ones(static_cast<size_t>(lt_max_m), 1.0f / 448);
      DFLASH_CUDA_CHECK(cudaMemcpy(token_scale.get(), ones.data(), ones.size() * 4, cudaMemcpyHostToDevice));
    }
    size_t cutlass_bytes = 16;
    for (const Shape& s : shapes) {
      for (int64_t m : lt_ms) cutlass_bytes = std::max(cutlass_bytes, cutlass_mixed_workspace_bytes(m, s.n, s.k));
    }
    DeviceBuffer<uint8_t> cutlass_workspace(cutlass_bytes);
    std::string no_cutlass;
    const bool cutlass = cutlass_mixed_supported(&no_cutlass);
    GemmContext ctx;
    ctx.stream = stream;
    ctx.lt = lt;
    ctx.lt_workspace = workspace.get();
    ctx.lt_workspace_bytes = workspace.bytes();
    std::printf("\n| shape | n x k | m | rank | configuration | waves | median us | weight GB/s | x copy rate |\n"
                "|---|---|---|---|---|---|---|---|---|\n");
    for (const Shape& s : shapes) {
      if (!only_shape.empty() && only_shape != s.name) continue;
      const int64_t bytes = s.n * s.k;
      const int64_t windows = hot ? 1 : std::max<int64_t>(1, static_cast<int64_t>(pool_bytes) / bytes);
      auto view_at = [&](int i) {
        DeviceMatrixView w;
        w.format = WeightFormat::kE4M3;
        w.n = s.n;
        w.k = s.k;
        w.k_pad = s.k;
        w.data = pool.get() + (i % windows) * bytes;
        w.scale = scale.get();
        return w;
      };
      for (int64_t m : lt_ms) {
        const std::vector<LtAlgorithm> algorithms = cublaslt_e4m3_algorithms(ctx, m, max_k, view_at(0), lt_algos);
        if (algorithms.empty()) std::printf("| %s | %lld x %lld | %lld | - | no algorithm | | | | |\n", s.name,
                                            static_cast<long long>(s.n), static_cast<long long>(s.k),
                                            static_cast<long long>(m));
        for (size_t r = 0; r < algorithms.size(); ++r) {
          const double us = time_launches([&](int i) {
            if (!cublaslt_matmul_e4m3(ctx, codes.get(), max_k, m, view_at(i), lt_out.get(), s.n, &algorithms[r].algo)) {
              throw internal_error("gemm_bench: cuBLASLt refused a handle-less launch");
            }
          });
          const double rate = static_cast<double>(bytes) / (us * 1e-6);
          std::printf("| %s | %lld x %lld | %lld | %zu | cuBLASLt %s | %.2f | %.1f | %.0f | %.2f |\n", s.name,
                      static_cast<long long>(s.n), static_cast<long long>(s.k), static_cast<long long>(m), r,
                      algorithms[r].description.c_str(), algorithms[r].waves, us, rate / 1e9, bandwidth / rate);
          std::fflush(stdout);
        }
        if (!cutlass) {
          std::printf("| %s | | %lld | - | CUTLASS not run: %s | | | | |\n", s.name, static_cast<long long>(m),
                      no_cutlass.c_str());
          continue;
        }
        for (int tile : tile_rows) {
          std::vector<CutlassMixedGemm> plans;  // one prepared launch per weight window
          for (int64_t i = 0; i < windows; ++i) {
            plans.emplace_back(codes.get(), max_k, m, view_at(static_cast<int>(i)), token_scale.get(), lt_out.get(),
                               s.n, cutlass_workspace.get(), cutlass_workspace.bytes(), stream, tile);
          }
          const double us = time_launches([&](int i) { plans[static_cast<size_t>(i % windows)].run(stream); });
          const double rate = static_cast<double>(bytes) / (us * 1e-6);
          std::printf("| %s | %lld x %lld | %lld | - | CUTLASS FP8, tiles of %d rows, stream-K | | %.1f | %.0f | %.2f |\n",
                      s.name, static_cast<long long>(s.n), static_cast<long long>(s.k), static_cast<long long>(m), tile,
                      us, rate / 1e9, bandwidth / rate);
          std::fflush(stdout);
        }
      }
    }
    cublasLtDestroy(lt);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
  return 0;
}

}  // namespace
}  // namespace dflash

int main(int argc, char** argv) { return dflash::run_program("gemm_bench", dflash::main_impl, argc, argv); }
