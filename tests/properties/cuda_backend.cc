// The CUDA drafter as a property backend. Compiled in every build: without CUDA it reports why
// its property instances skip.
#include "tests/properties/backends.h"

#ifdef DFLASH_HAVE_CUDA
#include "cuda/drafter/cuda_drafter.h"
#endif

namespace dflash::prop {

Backend cuda_backend(bool graphs) {
  Backend b;
  b.name = graphs ? "cuda" : "cuda-eager";
  b.precisions = {Precision::kFp8, Precision::kBf16};
  // The tuned attention instantiations (64, 128) and the generic kernel (any even d <= 256); GEMM
  // inner lengths are padded to 64 inside the drafter, so any size is valid. Still tiny for a GPU.
  b.limits.head_dims = {4, 8, 16, 64, 128};
  b.limits.hidden_sizes = {16, 32, 64, 128};
  b.limits.intermediate_sizes = {32, 64, 128, 192};
  b.limits.min_vocab = 64;
  b.limits.max_vocab = 320;
#ifdef DFLASH_HAVE_CUDA
  std::string why;
  if (!cuda_device_available(&why)) {
    b.unavailable = "no CUDA device can run this build: " + why;
    return b;
  }
  // The environment may choose kernels (DFLASH_CUDA_KERNELS, the gate's variants) and the device;
  // graphs, their warmup and the precision are the property's (make_cuda_drafter applies no
  // environment of its own).
  CudaOptions options = CudaOptions{}.with_environment();
  options.graphs = graphs;
  options.warmup = 1;
  options.precision = "";  // HeadSettings::precision is the case's
  if (graphs) b.graph_warmup = options.warmup;
  b.make = [options](const DrafterConfig& config, std::shared_ptr<const DrafterWeights> weights,
                     const HeadSettings& settings) { return make_cuda_drafter(config, std::move(weights), settings, options); };
#else
  b.unavailable = "this build has no CUDA drafter (configured without CUDA, or nvcc was not found)";
#endif
  return b;
}

}  // namespace dflash::prop
