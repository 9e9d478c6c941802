#include "tools/backends.h"

#include "core/error.h"
#include "reference/reference_drafter.h"
#if DFLASH_HAVE_CUDA
#include "cuda/drafter/cuda_drafter.h"
#endif

namespace dflash {
namespace {

// The fixture's head at `precision`, with freed pages poisoned (the debug mode the stored-state
// checks read: a stale read then shows as NaN).
HeadSettings head_for(const Fixture& fixture, Precision precision) {
  HeadSettings head = fixture.head;
  head.precision = precision;
  head.poison_freed_pages = true;
  return head;
}

// The reference's K/V of context rows at the lane's precision, for windows as long as the lane's.
ContextKvFunction recompute_for(const Fixture& fixture, Precision precision) {
  const int64_t window = head_for(fixture, precision).resolved(fixture.config).max_window(fixture.config);
  return make_reference_context_kv(fixture.config, fixture.weights, precision, window);
}

std::unique_ptr<DraftProposer> make_cuda(Fixture& fixture, Precision precision, int warmup) {
  if (warmup < 0) throw bad_input("--warmup " + std::to_string(warmup) + ": expected an integer >= 0");
#if DFLASH_HAVE_CUDA
  CudaOptions options = CudaOptions{}.with_environment();
  options.warmup = warmup;
  return make_cuda_drafter(fixture.config, std::shared_ptr<const DrafterWeights>(fixture.weights),
                           head_for(fixture, precision), options);
#else
  (void)fixture;
  (void)precision;
  throw unsupported("this dflash-harness was built without the CUDA drafter; --backend cuda/both cannot run here");
#endif
}

}  // namespace

BackendChoice parse_backend(const std::string& name) {
  if (name == "reference") return BackendChoice::kReference;
  if (name == "cuda") return BackendChoice::kCuda;
  if (name == "both") return BackendChoice::kBoth;
  throw bad_input("--backend '" + name + "' is not one of reference, cuda, both");
}

Precision resolve_precision(BackendChoice backend, const std::optional<std::string>& precision) {
  if (!precision) return backend == BackendChoice::kReference ? Precision::kFp64 : Precision::kFp8;
  Precision p;
  if (!parse_precision(*precision, &p)) throw bad_input("--precision '" + *precision + "' is not one of fp64, fp32, bf16, fp8");
  return p;
}

void check_backend_runs_here(BackendChoice backend, Precision precision) {
  if (backend == BackendChoice::kReference) return;
  if (precision != Precision::kBf16 && precision != Precision::kFp8) {
    throw bad_input(std::string("--precision ") + precision_name(precision) +
                    ": the CUDA drafter runs bf16 or fp8 (fp64 and fp32 are the reference's alone)");
  }
#if DFLASH_HAVE_CUDA
  std::string why;
  if (!cuda_device_available(&why)) throw unsupported("no CUDA device can run the CUDA drafter here: " + why);
#else
  throw unsupported("this dflash-harness was built without the CUDA drafter (configured with DFLASH_ENABLE_CUDA=OFF "
                    "or without nvcc); --backend cuda/both cannot run here: use --backend reference, or a build "
                    "with the CUDA drafter (ci/build with nvcc) on a machine with a GPU");
#endif
}

DrafterSet make_drafters(Fixture& fixture, BackendChoice backend, Precision precision, int cuda_warmup) {
  fixture.load_weights();
  DrafterSet set;
  const auto add = [&](std::unique_ptr<DraftProposer> drafter, Precision p, bool with_fixture) {
    set.lanes.push_back({drafter.get(), p, with_fixture, recompute_for(fixture, p)});
    set.drafters.push_back(std::move(drafter));
  };
  switch (backend) {
    case BackendChoice::kReference:
      add(make_reference_drafter(fixture.config, fixture.weights, head_for(fixture, precision)), precision, true);
      break;
    case BackendChoice::kCuda:
      add(make_cuda(fixture, precision, cuda_warmup), precision, true);
      break;
    case BackendChoice::kBoth:
      add(make_reference_drafter(fixture.config, fixture.weights, head_for(fixture, Precision::kFp64)),
          Precision::kFp64, true);
      add(make_reference_drafter(fixture.config, fixture.weights, head_for(fixture, precision)), precision, false);
      add(make_cuda(fixture, precision, cuda_warmup), precision, false);
      set.cross_checks.push_back({1, 2});
      if (precision == Precision::kFp8) {  // the fp8 envelope: CUDA fp8 against the bf16 reference
        add(make_reference_drafter(fixture.config, fixture.weights, head_for(fixture, Precision::kBf16)),
            Precision::kBf16, false);
        set.cross_checks.push_back({3, 2});
      }
      break;
  }
  return set;
}

}  // namespace dflash
