// The CUDA drafter against the CPU reference in the same precision (bf16 vs the bf16-emulating
// reference, fp8 vs the fp8-emulating reference, which holds the same E4M3 codes): every oracle
// fixture of fixtures/oracle (all steps, every tap), and one step at each real geometry of
// drafter.md §8 with random weights. Tolerance: the bf16-boundary model of docs/cuda-drafter.md
// (gpu_test_util.h), per tap, relative to each row's largest magnitude; draft tokens equal wherever
// the reference's top-1/top-2 margin exceeds twice the logits bound. The first tap out of bounds is
// named. Each run prints its worst numbers (and, for information, the distance to the oracle's
// float64 expectations).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda/cuda_drafter.h"
#include "fixtures/fixture.h"
#include "reference/reference_drafter.h"
#include "tests/gpu/gpu_test_util.h"
#include "fixtures/geometries.h"
#include "fixtures/random_drafter.h"

namespace dflash {
namespace {

namespace fs = std::filesystem;
using gpu_test::bf16_boundaries;
using gpu_test::compare_stage;
using gpu_test::compare_tokens;

struct Replayed {
  std::vector<ProposeOutput> outputs;
  std::vector<const ProposeEntry*> entries;  // the fixture entry of each output
};

Replayed replay(DraftProposer& d, const Fixture& f) {
  Replayed r;
  std::set<int> added;
  for (const FixtureStep& step : f.steps) {
    if (step.kind == FixtureStep::Kind::kRelease) {
      for (int seq : step.release) d.release_sequence(seq);
      continue;
    }
    std::vector<ProposeInput> batch;
    for (const ProposeEntry& e : step.propose) {
      if (e.block_width != step.propose.front().block_width) {
        ADD_FAILURE() << f.name << ": one propose step asks for different block widths";
      }
      if (added.insert(e.seq).second) d.add_sequence(e.seq);
      batch.push_back({e.seq, &e.ctx, e.start, e.anchor});
      r.entries.push_back(&e);
    }
    d.set_block_g(step.propose.front().block_width);
    for (ProposeOutput& out : d.propose(batch, true)) r.outputs.push_back(std::move(out));
  }
  return r;
}

struct Summary {
  double worst_logits = 0, worst_ratio = 0, oracle_logits = 0;
  std::string worst_stage;
  int decisive = 0, decisive_mismatches = 0, close_mismatches = 0;
};

// Compares every tap of the CUDA outputs with the reference's; fails naming the first stage out of
// bounds in forward order.
void compare_outputs(const std::vector<ProposeOutput>& cuda, const std::vector<ProposeOutput>& ref, int num_layers,
                     const std::string& what, Summary* s) {
  ASSERT_EQ(cuda.size(), ref.size()) << what;
  for (size_t i = 0; i < cuda.size(); ++i) {
    ASSERT_EQ(cuda[i].taps.size(), ref[i].taps.size()) << what << " output " << i;
    bool reported = false;
    for (size_t t = 0; t < ref[i].taps.size(); ++t) {
      const Tap& e = ref[i].taps[t];
      const Tap& a = cuda[i].taps[t];
      ASSERT_EQ(a.name, e.name) << what;
      const int n = bf16_boundaries(e.name, num_layers);
      const auto c = compare_stage(a.value, e.value, n);
      const double ratio = n == 0 ? (c.max_rel == 0 ? 0 : INFINITY) : c.max_rel / c.max_bound;
      if (ratio > s->worst_ratio) {
        s->worst_ratio = ratio;
        s->worst_stage = e.name;
      }
      if (!c.ok() && !reported) {
        ADD_FAILURE() << what << " output " << i << " (seq " << ref[i].seq << "): first divergence at " << e.name
                      << ": max |diff|/row max " << c.max_rel << " (bound " << c.max_bound << "), rms " << c.max_rms_rel
                      << " (bound " << c.rms_bound << "), row " << c.worst_row;
        reported = true;
      }
    }
    const int n = bf16_boundaries("logits", num_layers);
    const auto lc = compare_stage(cuda[i].logits, ref[i].logits, n);
    s->worst_logits = std::max(s->worst_logits, lc.max_rel);
    const auto tc = compare_tokens(cuda[i].draft_tokens, ref[i].draft_tokens, ref[i].logits, 2 * lc.max_bound);
    s->decisive += tc.decisive;
    s->decisive_mismatches += tc.decisive_mismatches;
    s->close_mismatches += tc.close_mismatches;
    EXPECT_EQ(tc.decisive_mismatches, 0) << what << " output " << i << ": draft tokens differ where the margin is decisive";
  }
}

std::vector<std::string> oracle_fixtures() {
  std::vector<std::string> dirs;
  const fs::path root = fs::path(DFLASH_SOURCE_DIR) / "fixtures" / "oracle";
  if (!fs::is_directory(root)) return dirs;
  for (const auto& entry : fs::directory_iterator(root)) {
    if (fs::exists(entry.path() / "fixture.json")) dirs.push_back(entry.path().string());
  }
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

TEST(CudaVsReference, EveryOracleFixtureInBothPrecisions) {
  DFLASH_REQUIRE_GPU();
  const std::vector<std::string> dirs = oracle_fixtures();
  ASSERT_GE(dirs.size(), 10u) << "fixtures/oracle is missing fixtures";
  for (const std::string& dir : dirs) {
    Fixture f = read_fixture(dir);
    f.load_weights();
    for (Precision precision : {Precision::kBf16, Precision::kFp8}) {
      HeadSettings settings = f.head;
      settings.precision = precision;
      const std::string what = f.name + " " + precision_name(precision);
      auto ref = make_reference_drafter(f.config, f.weights, settings);
      auto cuda = make_cuda_drafter(f.config, f.weights, settings, CudaOptions{}.with_environment());
      const Replayed r = replay(*ref, f);
      const Replayed c = replay(*cuda, f);
      Summary s;
      compare_outputs(c.outputs, r.outputs, f.config.num_layers, what, &s);
      // For information: the CUDA logits against the oracle's float64 expectations.
      for (size_t i = 0; i < c.outputs.size(); ++i) {
        const ProposeEntry& e = *c.entries[i];
        if (e.expect && e.expect->logits) {
          const auto o = compare_stage(c.outputs[i].logits, *e.expect->logits, 1);
          s.oracle_logits = std::max(s.oracle_logits, o.max_rel);
        }
      }
      std::string attention;
      for (const auto& [k, v] : cuda->describe()) {
        if (k == "kernel.attention") attention = v;
      }
      std::printf("[oracle] %-22s %-4s proposes %2zu  logits max|diff|/rowmax %.2e  worst stage %-12s at %.3f of its bound  "
                  "tokens decisive %d mismatched %d (close-call mismatches %d)  vs fp64 oracle %.2e  attention=%s\n",
                  f.name.c_str(), precision_name(precision), c.outputs.size(), s.worst_logits, s.worst_stage.c_str(),
                  s.worst_ratio, s.decisive, s.decisive_mismatches, s.close_mismatches, s.oracle_logits, attention.c_str());
    }
  }
}

// The NVFP4 head runs on exactly the draft rows of each propose: batch 4 of nvfp4-tiny-gqa
// (gamma 8) at widths 8, 4, 7, 2 (4 x 3 = 12 and 4 x 6 = 24 draft rows: more than gamma, and a
// second 16-row tile). A launch on gamma rows, or on the rows of an earlier, wider propose, leaves
// rows unwritten or stale, which the per-sequence comparison with the reference catches; every
// sequence must get exactly width - 1 logit rows and tokens.
TEST(CudaVsReference, Nvfp4HeadBatchedBelowGamma) {
  DFLASH_REQUIRE_GPU();
  Fixture f = read_fixture(std::string(DFLASH_SOURCE_DIR) + "/fixtures/oracle/nvfp4-tiny-gqa");
  f.load_weights();
  ASSERT_TRUE(f.weights->nvfp4_head());
  const int batch = 4;
  for (Precision precision : {Precision::kBf16, Precision::kFp8}) {
    HeadSettings settings = f.head;
    settings.precision = precision;
    settings.max_batch = batch;
    ASSERT_EQ(settings.gamma, 8);
    auto ref = make_reference_drafter(f.config, f.weights, settings);
    auto cuda = make_cuda_drafter(f.config, f.weights, settings, CudaOptions{});
    std::vector<Tensor> ctx;
    for (int s = 0; s < batch; ++s) ctx.push_back(make_random_context(5 + s, f.config.ctx_feature_dim(), 300 + s));
    for (DraftProposer* d : {ref.get(), cuda.get()}) {
      for (int s = 0; s < batch; ++s) d->add_sequence(s);
    }
    int64_t next[batch] = {0, 0, 0, 0};
    for (int width : {8, 4, 7, 2}) {
      std::vector<ProposeInput> inputs;
      for (int s = 0; s < batch; ++s) next[s] += ctx[static_cast<size_t>(s)].rows();  // the anchor follows its context
      for (int s = 0; s < batch; ++s) inputs.push_back({s, &ctx[static_cast<size_t>(s)], next[s], 17 * (s + 1) + width});
      std::vector<ProposeOutput> outs[2];
      int side = 0;
      for (DraftProposer* d : {cuda.get(), ref.get()}) {
        d->set_block_g(width);
        outs[side++] = d->propose(inputs, true);
      }
      for (const ProposeOutput& o : outs[0]) {
        ASSERT_EQ(o.logits.shape, (std::vector<int64_t>{width - 1, f.config.vocab_size})) << "seq " << o.seq;
        ASSERT_EQ(o.draft_tokens.size(), static_cast<size_t>(width - 1)) << "seq " << o.seq;
      }
      Summary sum;
      const std::string what = std::string("nvfp4 batch 4 width ") + std::to_string(width) + " " + precision_name(precision);
      compare_outputs(outs[0], outs[1], f.config.num_layers, what, &sum);
      std::printf("[nvfp4] %-28s logits max|diff|/rowmax %.2e  tokens decisive %d mismatched %d\n", what.c_str(),
                  sum.worst_logits, sum.decisive, sum.decisive_mismatches);
    }
  }
}

void real_geometry(const DrafterGeometry& g) {
  const DrafterConfig config = make_config(g);
  const auto t0 = std::chrono::steady_clock::now();
  const std::shared_ptr<const DrafterWeights> weights = make_random_weights(config, 2024);
  const int64_t rows = 20;
  const Tensor ctx = make_random_context(rows, config.ctx_feature_dim(), 77);
  for (Precision precision : {Precision::kBf16, Precision::kFp8}) {
    HeadSettings settings;
    settings.gamma = g.block;
    settings.ctx_cap = 4096;
    settings.max_batch = 1;
    settings.precision = precision;
    const std::string what = g.name + " " + precision_name(precision);
    auto cuda = make_cuda_drafter(config, weights, settings, CudaOptions{}.with_environment());
    auto ref = make_reference_drafter(config, weights, settings);
    std::vector<ProposeOutput> outs[2];
    for (int side = 0; side < 2; ++side) {
      DraftProposer& d = side == 0 ? *cuda : *ref;
      d.add_sequence(0);
      outs[side] = d.propose({{0, &ctx, rows, 1234}}, true);
    }
    Summary s;
    compare_outputs(outs[0], outs[1], config.num_layers, what, &s);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("[geometry] %-22s %-4s B=%d C=%lld  logits max|diff|/rowmax %.2e  worst stage %-12s at %.3f of its bound  "
                "tokens decisive %d mismatched %d (close %d)  [%.0f s so far]\n",
                g.name.c_str(), precision_name(precision), g.block, static_cast<long long>(rows), s.worst_logits,
                s.worst_stage.c_str(), s.worst_ratio, s.decisive, s.decisive_mismatches, s.close_mismatches, seconds);
  }
}

TEST(CudaVsReferenceRealGeometry, Qwen3_8B) {
  DFLASH_REQUIRE_GPU();
  real_geometry(qwen3_8b_geometry());
}
TEST(CudaVsReferenceRealGeometry, Qwen3_4B) {
  DFLASH_REQUIRE_GPU();
  real_geometry(qwen3_4b_geometry());
}
TEST(CudaVsReferenceRealGeometry, GptOss20B) {
  DFLASH_REQUIRE_GPU();
  real_geometry(gpt_oss_20b_geometry());
}

}  // namespace
}  // namespace dflash
