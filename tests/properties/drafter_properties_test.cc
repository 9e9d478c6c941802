// The proposer properties on the drafters: the same bodies (proposer_properties.h) instantiated for
// the CPU reference in CI and for the CUDA drafter when this build has it and a device is present
// (otherwise those instances skip, saying why); properties 7 and 8 on CUDA only; and every
// property against its deliberately broken variant of the reference.
#include <gtest/gtest.h>

#include <functional>
#include <ostream>
#include <string>

#include "tests/properties/backends.h"
#include "tests/properties/broken_proposers.h"
#include "tests/properties/broken_variants.h"
#include "tests/properties/property_check.h"
#include "tests/properties/proposer_properties.h"
#include "tests/properties/serving_loop.h"
#include "reference/reference_drafter.h"

namespace dflash::prop {
namespace {

struct BackendParam {
  std::string name;
  std::function<Backend()> make;
};
void PrintTo(const BackendParam& param, std::ostream* os) { *os << param.name; }

class DrafterProperties : public ::testing::TestWithParam<BackendParam> {
 protected:
  void SetUp() override {
    backend_ = GetParam().make();
    if (!backend_.unavailable.empty()) GTEST_SKIP() << backend_.unavailable;
  }
  Backend backend_;
};

// Default case counts (Backend::default_cases) keep the reference's whole suite to a few seconds on
// 2 cores; DFLASH_PROP_CASES=N or RC_PARAMS="max_success=N" run N per property.
TEST_P(DrafterProperties, P1_ClampAndOutputShapes) { check_property(backend_.default_cases, [this] { clamp_property(backend_); }); }
TEST_P(DrafterProperties, P2_ContextWindow) { check_property(backend_.default_cases, [this] { context_window_property(backend_); }); }
TEST_P(DrafterProperties, P3_CacheSlotsOnSmallPools) { check_property(backend_.default_cases, [this] { cache_slots_property(backend_); }); }
TEST_P(DrafterProperties, P4_BatchInvariance) { check_property(backend_.default_cases, [this] { batch_invariance_property(backend_); }); }
TEST_P(DrafterProperties, P5_PagePermutation) { check_property(backend_.default_cases, [this] { page_permutation_property(backend_); }); }
TEST_P(DrafterProperties, P6_Determinism) { check_property(backend_.default_cases, [this] { determinism_property(backend_); }); }
TEST_P(DrafterProperties, P10_ArgmaxTies) { check_property(backend_.default_cases, [this] { argmax_ties_property(backend_); }); }

std::string param_name(const ::testing::TestParamInfo<BackendParam>& info) { return info.param.name; }

// The CUDA drafter with the reference's K/V recomputation, so its stored state is checked too.
Backend cuda_checked(bool graphs) {
  Backend b = cuda_backend(graphs);
  b.kv_oracle = make_reference_context_kv;
  return b;
}

INSTANTIATE_TEST_SUITE_P(Reference, DrafterProperties,
                         ::testing::Values(BackendParam{"reference", [] { return reference_backend(); }}), param_name);
INSTANTIATE_TEST_SUITE_P(Cuda, DrafterProperties,
                         ::testing::Values(BackendParam{"cuda", [] { return cuda_checked(/*graphs=*/true); }},
                                           BackendParam{"cuda_eager", [] { return cuda_checked(/*graphs=*/false); }}),
                         param_name);

TEST(CudaProperties, P7_MatchesTheReferenceWithinTolerance) {
  const Backend cuda = cuda_backend(/*graphs=*/true);
  if (!cuda.unavailable.empty()) GTEST_SKIP() << cuda.unavailable;
  check_property(cuda.default_cases, [&] { matches_reference_property(reference_backend(), cuda); });
}

TEST(CudaProperties, P8_GraphReplayEqualsEagerBitForBit) {
  const Backend graphs = cuda_backend(/*graphs=*/true);
  if (!graphs.unavailable.empty()) GTEST_SKIP() << graphs.unavailable;
  int cases = 0, changed = 0;
  check_property(graphs.default_cases, [&] {
    ++cases;
    same_bits_property(cuda_backend(/*graphs=*/false), graphs, &changed);
  });
  // A replay needs a third propose of one (width, batch) (warmup 1); traces of 1-10 steps over two
  // widths reach it often but not always. A tenth is the floor that shows replays were judged: no
  // graph path at all (graphs off, a warmup past every trace) gives none.
  EXPECT_GE(changed * 10, cases) << changed << " of " << cases << " cases replayed a graph with new positions";
}

// Property 11, the serving loop: the reference serving a trace against a fresh reference fed each
// history (CI); the CUDA drafter with graphs against a fresh one without, on a device.
TEST(ReferenceProperties, P11_ServingLoop) {
  const Backend reference = reference_backend();
  check_property(reference.default_cases, [&] { serving_loop_property(reference, reference); });
}

TEST(CudaProperties, P11_ServingLoop) {
  const Backend graphs = cuda_backend(/*graphs=*/true);
  if (!graphs.unavailable.empty()) GTEST_SKIP() << graphs.unavailable;
  const Backend eager = cuda_backend(/*graphs=*/false);
  int cases = 0, replays = 0;
  check_property(graphs.default_cases, [&] {
    ++cases;
    serving_loop_property(graphs, eager, &replays);
  });
  // A replay needs a shape's third propose (warmup 1); the traces of up to 14 steps over three
  // widths reach one often. A tenth of the cases is the floor that shows replays were judged.
  EXPECT_GE(replays * 10, cases) << replays << " of " << cases << " cases replayed a graph";
}

// Each property must fail on its broken variant of the reference (none can pass vacuously).
class ReferenceBrokenVariants : public ::testing::TestWithParam<BrokenVariant> {};
TEST_P(ReferenceBrokenVariants, AreCaught) { expect_caught(reference_backend(), GetParam()); }
INSTANTIATE_TEST_SUITE_P(Reference, ReferenceBrokenVariants, ::testing::ValuesIn(generic_broken_variants()),
                         [](const ::testing::TestParamInfo<BrokenVariant>& info) { return info.param.name; });

// The stored-state checks, each against a fault planted in the reference whose bookkeeping stays
// right (reference_options.h): P3 sees a wrong slot and a kept block row by name, and a stale read
// as NaN in the outputs (freed pages are poisoned); P2 sees attention reading one row too many.
INSTANTIATE_TEST_SUITE_P(ReferencePlantedFaults, ReferenceBrokenVariants,
                         ::testing::ValuesIn(planted_fault_variants()),
                         [](const ::testing::TestParamInfo<BrokenVariant>& info) { return info.param.name; });

// Property 11 against its four plants (the stale-graph classes), each with a shrunk counterexample.
INSTANTIATE_TEST_SUITE_P(ReferenceServingLoopPlants, ReferenceBrokenVariants, ::testing::ValuesIn(serving_loop_variants()),
                         [](const ::testing::TestParamInfo<BrokenVariant>& info) { return info.param.name; });

// Property 7's body, run on the CPU: a candidate that took rope_theta from its default must be
// caught by the tolerance comparison, at a stage no later than L0.q.
TEST(ReferenceBrokenVariantsOfDeviceProperties, P7_CatchesADefaultedRopeTheta) {
  const BrokenVariant variant{"DefaultRopeTheta",
                              [](const Backend& base, const Backend& broken) { matches_reference_property(base, broken); },
                              default_rope_theta, "first stage over its bound is"};
  expect_caught(reference_backend(), variant);
}

}  // namespace
}  // namespace dflash::prop
