// Faults inside the CUDA drafter, injected through the fault points of testing/fault_points.h
// (a build with -DDFLASH_FAULT_POINTS=ON): a
// failed device allocation is "cannot run here" (exit 125) and a failed kernel launch an internal
// error (exit 3), each naming the call that failed; the drafter is never left half-built, and a
// later drafter runs normally. ci/gpu-gate.sh also injects both into a whole replay
// (DFLASH_FAULT=alloc:N|launch:N) and checks its exit code and JSON report.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "testing/fault_points.h"
#include "cuda/drafter/cuda_drafter.h"
#include "testing/gpu_test_util.h"
#include "fixtures/geometries.h"
#include "fixtures/random_drafter.h"
#include "tests/support/harness_error.h"

namespace dflash {
namespace {

using testing::expect_mentions;
using testing::harness_error_message;

DrafterConfig small_config() {
  DrafterGeometry g;
  g.name = "fault-small";
  g.hidden = 256, g.layers = 2, g.heads = 4, g.kv_heads = 2, g.head_dim = 64, g.intermediate = 384, g.vocab = 1000;
  g.block = 8, g.target_layer_ids = {1, 3}, g.theta = 1e6, g.eps = 1e-6, g.mask_token_id = 7;
  return make_config(g);
}

HeadSettings small_settings() {
  HeadSettings s;
  s.ctx_cap = 64;
  s.max_batch = 1;
  s.precision = Precision::kFp8;
  return s;
}

// One propose of 8 context rows for sequence 0.
std::vector<ProposeOutput> propose_once(DraftProposer& drafter) {
  const Tensor ctx = make_random_context(8, drafter.config().ctx_feature_dim(), 3);
  drafter.add_sequence(0);
  drafter.set_block_g(8);
  return drafter.propose({{0, &ctx, 8, 5}}, false);
}

class CudaFault : public ::testing::Test {
 protected:
  void SetUp() override { DFLASH_REQUIRE_GPU(); }
  void TearDown() override { clear_injected_failure(); }
};

TEST_F(CudaFault, AllocationFailureIsCannotRunNamingCudaMalloc) {
  const DrafterConfig c = small_config();
  const auto w = make_random_weights(c, 21);
  for (long long nth : {1LL, 5LL}) {
    SCOPED_TRACE(nth);
    set_injected_failure(FailureSite::kAlloc, nth);
    const std::string message = harness_error_message(
        [&] { make_cuda_drafter(c, w, small_settings(), CudaOptions{}); }, ErrorKind::kUnsupported);
    expect_mentions(message, "cudaErrorMemoryAllocation");
    expect_mentions(message, "cudaMalloc(");
  }
  // Off again: the same drafter builds and proposes (the negative control of the lever).
  clear_injected_failure();
  auto drafter = make_cuda_drafter(c, w, small_settings(), CudaOptions{});
  EXPECT_EQ(propose_once(*drafter).size(), 1u);
}

TEST_F(CudaFault, LaunchFailureInAProposeIsAnInternalErrorNamingTheLaunch) {
  const DrafterConfig c = small_config();
  const auto w = make_random_weights(c, 22);
  for (bool graphs : {false, true}) {
    SCOPED_TRACE(graphs ? "graphs" : "eager");
    CudaOptions options;
    options.graphs = graphs;
    options.warmup = 0;  // with graphs on, the first propose is captured: the fault hits inside a capture
    auto drafter = make_cuda_drafter(c, w, small_settings(), options);
    set_injected_failure(FailureSite::kLaunch, 3);  // the third launch of the propose
    const std::string message =
        harness_error_message([&] { propose_once(*drafter); }, ErrorKind::kInternal);
    expect_mentions(message, "cudaErrorLaunchFailure");
    expect_mentions(message, "launch");
    clear_injected_failure();
  }
  auto drafter = make_cuda_drafter(c, w, small_settings(), CudaOptions{});
  EXPECT_EQ(propose_once(*drafter).size(), 1u);
}

}  // namespace
}  // namespace dflash
