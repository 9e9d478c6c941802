// The optimized drafter on an NVIDIA GPU (sm_90): FP8 row-scaled or bf16 weights, a paged bf16 KV
// cache, CUDA graphs per block width and batch size. Plain C++ header: callers need no CUDA headers.
#pragma once
#include <map>
#include <memory>
#include <string>

#include "core/proposer.h"
#include "core/weights.h"

namespace dflash {

// The engine's levers, reported by describe(). with_environment() applies the environment
// variables (docs/cuda-drafter.md); the factory takes the options as given, so a caller decides
// what the environment may change.
struct CudaOptions {
  bool graphs = true;  // DFLASH_CUDA_GRAPHS=0 turns graph capture off
  int warmup = 2;      // DFLASH_CUDA_WARMUP: eager passes before a width/batch graph is captured
  // Value per lever, e.g. {"gemm": "cublaslt"} or {"attention": "simple"}; empty = default. The
  // levers and their values: cuda/drafter/levers.h. DFLASH_CUDA_KERNELS="gemm=cublaslt,attention=simple"
  // sets them from the environment.
  std::map<std::string, std::string> kernels;
  int device = 0;
  // "" keeps HeadSettings::precision; "bf16" or "fp8" overrides it (DFLASH_CUDA_PRECISION).
  std::string precision;

  // Options with the environment variables applied on top of these values.
  CudaOptions with_environment() const;
};

// True when a CUDA device can run this build; otherwise `why` says what is missing.
bool cuda_device_available(std::string* why);

// `options` as given (apply with_environment() first for the environment's levers). Throws
// HarnessError(kUnsupported) when no device can run it, kBadInput for a geometry the kernels were
// not built for (e.g. a head_dim other than 64, 128, 256).
std::unique_ptr<DraftProposer> make_cuda_drafter(const DrafterConfig& config,
                                                 std::shared_ptr<const DrafterWeights> weights,
                                                 const HeadSettings& settings, const CudaOptions& options);

}  // namespace dflash
