// The CUDA drafter as a DraftProposer: graph replay bit-identical to eager across changing
// positions, widths, batches and page tables; batch and page-permutation invariance; determinism;
// errors that leave every sequence unchanged; the width clamp; taps; refused configurations.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "compare/stage_check.h"
#include "core/error.h"
#include "core/stages.h"
#include "cuda/drafter/cuda_drafter.h"
#include "cuda/runtime/cuda_check.h"
#include "testing/cuda_drafter_debug.h"
#include "cuda/drafter/cuda_drafter_impl.h"
#include "cuda/drafter/levers.h"
#include "testing/gpu_test_util.h"
#include "fixtures/fixture.h"
#include "fixtures/geometries.h"
#include "fixtures/random_drafter.h"

namespace dflash {
namespace {

DrafterGeometry small_geometry(int head_dim) {
  DrafterGeometry g;
  g.name = "small-d" + std::to_string(head_dim);
  g.hidden = 256, g.layers = 2, g.heads = 4, g.kv_heads = 2, g.head_dim = head_dim, g.intermediate = 384, g.vocab = 1000;
  g.block = 8, g.target_layer_ids = {1, 3}, g.theta = 1e6, g.eps = 1e-6, g.mask_token_id = 7;
  if (head_dim == 16) g.bias = true, g.yarn_factor = 4, g.yarn_original = 32, g.theta = 10000;
  return g;
}

struct Step {
  int width = 8;
  std::vector<int> release;
  struct Entry {
    int seq;
    int64_t rows, start;
    int anchor;
  };
  std::vector<Entry> entries;
};

// Positions, widths, batch compositions, window slides (ctx_cap 24, pages of 4) and page reuse
// all change between steps; some (width, batch) keys repeat so graphs are captured and replayed.
std::vector<Step> script() {
  return {
      {8, {}, {{0, 10, 10, 1}}},
      {8, {}, {{0, 3, 13, 2}}},
      {8, {}, {{0, 0, 13, 3}}},
      {8, {}, {{0, 7, 20, 4}}},
      {8, {}, {{1, 20, 20, 5}, {0, 5, 25, 6}}},
      {8, {}, {{0, 1, 26, 7}, {1, 9, 29, 8}}},
      {8, {}, {{1, 4, 33, 9}, {0, 30, 56, 10}}},
      {5, {}, {{0, 2, 58, 11}, {1, 1, 34, 12}}},
      {5, {}, {{1, 0, 34, 13}, {0, 0, 58, 14}}},
      {5, {0}, {{1, 6, 40, 15}}},
      {5, {}, {{2, 12, 12, 16}, {1, 3, 43, 17}}},
      {8, {}, {{2, 2, 14, 18}, {1, 0, 43, 19}}},
      {3, {}, {{2, 40, 54, 20}}},
      {3, {}, {{2, 1, 55, 21}}},
      {3, {}, {{2, 1, 56, 22}}},
  };
}

// script() and a step of three sequences at width 8: 24 block rows and 21 draft rows, so the mma
// kernel's 64-row tiles (m > 16, gemm_cols_m64) run too.
std::vector<Step> lever_script() {
  std::vector<Step> steps = script();
  steps.push_back({8, {}, {{1, 5, 48, 23}, {2, 4, 60, 24}, {3, 30, 30, 25}}});
  return steps;
}

HeadSettings small_settings(Precision precision, uint64_t page_seed = 0) {
  HeadSettings s;
  s.gamma = 8;
  s.ctx_cap = 24;
  s.max_batch = 3;
  s.kv_page_size = 4;
  s.precision = precision;
  s.page_order_seed = page_seed;
  return s;
}

// Runs the script; contexts are a function of (seq, first position) so any two drafters see the
// same inputs. `only` restricts to one sequence (for the batch-invariance comparison);
// after_step(i), when set, runs after step i's propose.
std::vector<ProposeOutput> run_script(DraftProposer& d, const std::vector<Step>& steps, bool want_taps = false,
                                      int only = -1, const std::function<void(size_t)>& after_step = nullptr) {
  std::vector<ProposeOutput> all;
  std::map<int, bool> added;
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& step = steps[i];
    for (int seq : step.release) {
      if (only < 0 || seq == only) d.release_sequence(seq);
    }
    std::vector<Tensor> contexts;
    contexts.reserve(step.entries.size());
    std::vector<ProposeInput> batch;
    for (const Step::Entry& e : step.entries) {
      if (only >= 0 && e.seq != only) continue;
      if (!added[e.seq]) {
        d.add_sequence(e.seq);
        added[e.seq] = true;
      }
      contexts.push_back(make_random_context(e.rows, d.config().ctx_feature_dim(), 1000 * e.seq + e.start));
    }
    size_t c = 0;
    for (const Step::Entry& e : step.entries) {
      if (only >= 0 && e.seq != only) continue;
      batch.push_back({e.seq, &contexts[c++], e.start, e.anchor});
    }
    if (batch.empty()) continue;
    d.set_block_g(step.width);
    for (ProposeOutput& out : d.propose(batch, want_taps)) all.push_back(std::move(out));
    if (after_step) after_step(i);
  }
  return all;
}

void expect_bitwise_equal(const std::vector<ProposeOutput>& a, const std::vector<ProposeOutput>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].seq, b[i].seq) << what;
    ASSERT_EQ(a[i].block_width, b[i].block_width) << what;
    ASSERT_EQ(a[i].draft_tokens, b[i].draft_tokens) << what << " output " << i;
    ASSERT_EQ(a[i].logits.shape, b[i].logits.shape) << what;
    for (size_t j = 0; j < a[i].logits.values.size(); ++j) {
      ASSERT_EQ(gpu_test::float_bits(a[i].logits.values[j]), gpu_test::float_bits(b[i].logits.values[j]))
          << what << " output " << i << " (seq " << a[i].seq << ") logit " << j;
    }
  }
}

// The outputs of sequence `seq`, in order.
std::vector<ProposeOutput> outputs_of(const std::vector<ProposeOutput>& outputs, int seq) {
  std::vector<ProposeOutput> kept;
  for (const ProposeOutput& out : outputs) {
    if (out.seq == seq) kept.push_back(out);
  }
  return kept;
}

// The launch plan one propose reports (ForwardPath::plan): kernel class -> what ran.
std::map<std::string, std::string> plan_of(const ProposeOutput& out) {
  return std::map<std::string, std::string>(out.path.plan.begin(), out.path.plan.end());
}
const char* const kBlockGemms[] = {"qkv", "o", "gate_up", "down", "lm_head"};

struct Variant {
  int head_dim;
  Precision precision;
};

class DrafterGpu : public ::testing::TestWithParam<Variant> {
 protected:
  void SetUp() override { DFLASH_REQUIRE_GPU(); }
  DrafterConfig config() const { return make_config(small_geometry(GetParam().head_dim)); }
};

TEST_P(DrafterGpu, GraphReplayIsBitIdenticalToEager) {
  const DrafterConfig c = config();
  const auto w = make_random_weights(c, 5);
  CudaOptions graphs;
  graphs.graphs = true;
  graphs.warmup = 1;
  CudaOptions eager;
  eager.graphs = false;
  CudaDrafter with_graphs(c, w, small_settings(GetParam().precision), graphs);
  CudaDrafter without(c, w, small_settings(GetParam().precision), eager);
  const auto graphed = run_script(with_graphs, script()), eager_outputs = run_script(without, script());
  expect_bitwise_equal(graphed, eager_outputs, "graphs vs eager");
  // A graph runs the launch plan its capture recorded: the eager drafter's, shape by shape.
  for (size_t i = 0; i < graphed.size(); ++i) {
    EXPECT_FALSE(graphed[i].path.plan.empty()) << "output " << i;
    EXPECT_EQ(graphed[i].path.plan, eager_outputs[i].path.plan) << "output " << i << " (" << graphed[i].path.mode << ")";
  }
  EXPECT_TRUE(drafter_graph_captured(with_graphs, 8, 1));
  EXPECT_TRUE(drafter_graph_captured(with_graphs, 8, 2));
  EXPECT_TRUE(drafter_graph_captured(with_graphs, 5, 2));
  EXPECT_TRUE(drafter_graph_captured(with_graphs, 3, 1));
  EXPECT_FALSE(drafter_graph_captured(without, 8, 1));
}

// A propose that asks for taps is judged on the shipped path (graph replays, PDL) and its taps
// come from a second, eager pass whose logits and tokens equal the judged ones bit for bit.
TEST_P(DrafterGpu, TappedProposesAreJudgedOnTheGraphPath) {
  const DrafterConfig c = config();
  const auto w = make_random_weights(c, 5);
  CudaOptions graphs;
  graphs.warmup = 1;
  CudaDrafter tapped(c, w, small_settings(GetParam().precision), graphs);
  CudaDrafter plain(c, w, small_settings(GetParam().precision), graphs);
  const auto with = run_script(tapped, script(), true);
  expect_bitwise_equal(with, run_script(plain, script()), "tapped vs untapped, graphs on");
  std::map<std::string, int> modes;
  for (const ProposeOutput& out : with) {
    ++modes[out.path.mode];
    EXPECT_TRUE(out.path.taps_from_second_pass);
    EXPECT_EQ(out.path.tap_pass_difference, "") << "seq " << out.seq;
    EXPECT_EQ(out.path.pdl, drafter_kernel_plan(tapped).pdl);
    ASSERT_FALSE(out.taps.empty());
  }
  // Outputs (one per sequence) of script()'s shapes under warmup 1: the first propose of each
  // (width, batch) eager, the second captured, later ones replayed with new positions and pages.
  EXPECT_EQ(modes["eager"], 7);
  EXPECT_EQ(modes["graph-capture"], 6);
  EXPECT_EQ(modes["graph-replay"], 9);
}

TEST_P(DrafterGpu, BatchPagePermutationAndRunToRunInvariance) {
  const DrafterConfig c = config();
  const auto w = make_random_weights(c, 6);
  CudaOptions o;
  o.warmup = 1;
  CudaDrafter batched(c, w, small_settings(GetParam().precision), o);
  CudaDrafter shuffled(c, w, small_settings(GetParam().precision, 99), o);
  CudaDrafter alone(c, w, small_settings(GetParam().precision), o);
  CudaDrafter again(c, w, small_settings(GetParam().precision), o);
  const auto all = run_script(batched, script());
  expect_bitwise_equal(all, run_script(shuffled, script()), "page order permuted");
  expect_bitwise_equal(all, run_script(again, script()), "run to run");
  expect_bitwise_equal(outputs_of(all, 1), run_script(alone, script(), false, 1), "sequence 1 alone vs batched");
}

TEST_P(DrafterGpu, TapsComeInForwardOrderWithTheirShapesAndChangeNothing) {
  const DrafterConfig c = config();
  const auto w = make_random_weights(c, 7);
  CudaDrafter plain(c, w, small_settings(GetParam().precision), CudaOptions{});
  CudaDrafter tapped(c, w, small_settings(GetParam().precision), CudaOptions{});
  const std::vector<Step> steps = script();
  const auto without = run_script(plain, steps);
  const auto with = run_script(tapped, steps, true);
  expect_bitwise_equal(without, with, "taps on vs off");
  const std::vector<std::string> names = forward_stage_order(c.num_layers);
  const ProposeOutput& first = with.front();  // step 0: 10 context rows, width 8
  ASSERT_EQ(first.taps.size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(first.taps[i].name, names[i]);
  const int64_t b = first.block_width;
  EXPECT_EQ(first.taps[0].value.shape, (std::vector<int64_t>{10, c.hidden_size}));
  EXPECT_EQ(first.taps[1].value.shape, (std::vector<int64_t>{b, c.hidden_size}));
  EXPECT_EQ(first.taps[3].value.shape, (std::vector<int64_t>{b, c.q_dim()}));
  EXPECT_EQ(first.taps[4].value.shape, (std::vector<int64_t>{b, c.kv_dim()}));
  EXPECT_EQ(first.taps.back().value.shape, (std::vector<int64_t>{b - 1, c.vocab_size}));
  for (size_t j = 0; j < first.logits.values.size(); ++j) ASSERT_EQ(first.taps.back().value.values[j], first.logits.values[j]);
  // Embedding rows are exact copies of embed_tokens rows: anchor, then mask tokens.
  for (int64_t col = 0; col < c.hidden_size; ++col) {
    ASSERT_EQ(first.taps[1].value.row(0)[col], w->embed_tokens.row(1)[col]);
    ASSERT_EQ(first.taps[1].value.row(3)[col], w->embed_tokens.row(c.mask_token_id)[col]);
  }
  // A window longer than the cap: step 6 brings 30 rows for sequence 0, only the last 24 enter.
  for (const ProposeOutput& out : with) {
    if (out.seq == 0 && out.taps[0].value.rows() == 24) return;
  }
  ADD_FAILURE() << "no propose admitted exactly ctx_cap rows";
}

INSTANTIATE_TEST_SUITE_P(Variants, DrafterGpu,
                         ::testing::Values(Variant{64, Precision::kFp8}, Variant{64, Precision::kBf16},
                                           Variant{16, Precision::kFp8}, Variant{16, Precision::kBf16}),
                         [](const auto& info) {
                           return "d" + std::to_string(info.param.head_dim) + "_" + precision_name(info.param.precision);
                         });

// DFlash2 (d2-sliding-batch's drafter: convolutions, sliding layers with W = gamma = 8, the
// selector) on the same script: graphs vs eager, page order, run to run, sequence 1 alone vs in
// its batches, the plain top-K kernel (selector_topk=plain) against the default, all bit for bit
// (the walk included: draft tokens are compared exactly); the tapped
// pass changes nothing and gives every DFlash2 stage in forward order with its shape.
TEST(DrafterGpuDflash2, GraphsPagesRunsAndBatchesChangeNoBit) {
  DFLASH_REQUIRE_GPU();
  Fixture f = read_fixture(std::string(DFLASH_SOURCE_DIR) + "/fixtures/oracle/d2-sliding-batch");
  f.load_weights();
  const DrafterConfig& c = f.config;
  ASSERT_TRUE(c.dflash2.enabled);
  for (Precision precision : {Precision::kBf16, Precision::kFp8}) {
    const std::string what = std::string("dflash2 ") + precision_name(precision) + ": ";
    CudaOptions graphs;
    graphs.warmup = 1;
    CudaOptions eager;
    eager.graphs = false;
    CudaDrafter batched(c, f.weights, small_settings(precision), graphs);
    CudaDrafter without(c, f.weights, small_settings(precision), eager);
    CudaDrafter shuffled(c, f.weights, small_settings(precision, 99), graphs);
    CudaDrafter again(c, f.weights, small_settings(precision), graphs);
    CudaDrafter alone(c, f.weights, small_settings(precision), graphs);
    CudaDrafter tapped(c, f.weights, small_settings(precision), graphs);
    const auto all = run_script(batched, script());
    expect_bitwise_equal(all, run_script(without, script()), what + "graphs vs eager");
    expect_bitwise_equal(all, run_script(shuffled, script()), what + "page order permuted");
    expect_bitwise_equal(all, run_script(again, script()), what + "run to run");
    expect_bitwise_equal(outputs_of(all, 1), run_script(alone, script(), false, 1), what + "sequence 1 alone vs batched");
    const auto with = run_script(tapped, script(), true);
    expect_bitwise_equal(all, with, what + "taps on vs off");
    CudaOptions plain = graphs;
    plain.kernels["selector_topk"] = "plain";
    CudaDrafter plain_topk(c, f.weights, small_settings(precision), plain);
    expect_bitwise_equal(all, run_script(plain_topk, script()), what + "selector_topk=plain vs threshold");
    const std::vector<std::string> names = forward_stage_order(c.num_layers, true);
    for (const ProposeOutput& out : with) {
      EXPECT_EQ(out.path.tap_pass_difference, "") << what << "seq " << out.seq;
      ASSERT_EQ(out.taps.size(), names.size()) << what;
      for (size_t i = 0; i < names.size(); ++i) {
        ASSERT_EQ(out.taps[i].name, names[i]) << what;
        StageId id;
        ASSERT_TRUE(parse_stage_name(names[i], c.num_layers, &id, true)) << names[i];
        const int64_t context_rows = out.taps.front().value.rows();  // ctx_proj: the rows admitted
        EXPECT_EQ(out.taps[i].value.shape, stage_shape(id, c, out.block_width, context_rows)) << what << names[i];
      }
    }
  }
}

// Ten sequences: widths 8 (80 block rows, 70 draft rows: the library GEMMs under gemm_m64=library)
// and 5 (50 and 40 rows: the mma kernel), contexts that slide past ctx_cap 24.
std::vector<Step> large_batch_script() {
  std::vector<Step> steps(4);
  const int widths[] = {8, 8, 5, 8};
  for (int i = 0; i < 4; ++i) steps[static_cast<size_t>(i)].width = widths[i];
  for (int seq = 0; seq < 10; ++seq) {
    const int64_t rows[] = {10 + seq, 3, 2, 20};
    int64_t start = 0;
    for (int i = 0; i < 4; ++i) {
      start += rows[i];
      steps[static_cast<size_t>(i)].entries.push_back({seq, rows[i], start, 100 * i + seq + 1});
    }
  }
  return steps;
}

// gemm_m64=library (the default) hands block GEMMs of 64 rows and more to CUTLASS (E4M3) or
// cuBLASLt (bf16): graph replay still equals eager and runs repeat bit for bit, but a sequence's
// outputs alone (8 rows: the mma kernel) and in a batch of ten (80 rows: the library) agree only
// within the same-precision bound, the bound describe() states; gemm_m64=mma keeps them bitwise.
// The epilogue kernel's two forms give the same bits. The library results must differ from the mma kernel's somewhere (else the library never ran).
TEST(DrafterGpuLargeBatch, LibraryGemmsFrom64RowsHoldTheirBound) {
  DFLASH_REQUIRE_GPU();
  const DrafterConfig c = make_config(small_geometry(64));
  const auto w = make_random_weights(c, 14);
  const std::vector<Step> steps = large_batch_script();
  for (Precision precision : {Precision::kFp8, Precision::kBf16}) {
    const std::string what = std::string(precision_name(precision)) + ": ";
    HeadSettings s = small_settings(precision);
    s.max_batch = 10;
    CudaOptions graphs;
    graphs.warmup = 1;
    CudaOptions eager = graphs;
    eager.graphs = false;
    CudaOptions bitwise = graphs;
    bitwise.kernels["gemm_m64"] = "mma";
    CudaDrafter library(c, w, s, graphs);
    std::string large, invariance;
    for (const auto& [key, value] : library.describe()) {
      if (key == "kernel.gemm_m64") large = value;
      if (key == "batch_invariance") invariance = value;
    }
    EXPECT_EQ(large.rfind("library: ", 0), 0u) << what << large;
    EXPECT_NE(large.find(precision == Precision::kFp8 ? "here: cutlass for E4M3 weights" : "cublaslt for bf16 weights"),
              std::string::npos)
        << what << large;
    EXPECT_NE(invariance.find("within a rounding bound"), std::string::npos) << what << invariance;
    const auto all = run_script(library, steps);
    CudaDrafter library_eager(c, w, s, eager), library_again(c, w, s, graphs);
    expect_bitwise_equal(all, run_script(library_eager, steps), what + "library: graphs vs eager");
    expect_bitwise_equal(all, run_script(library_again, steps), what + "library: run to run");
    CudaOptions warp_epilogue = graphs;  // the library GEMMs' products finished one column per lane
    warp_epilogue.kernels["gemm_epilogue"] = "warp";
    CudaDrafter library_warp(c, w, s, warp_epilogue);
    EXPECT_EQ(drafter_kernel_plan(library_warp).gemm_epilogue, EpilogueKernel::kWarp) << what;
    expect_bitwise_equal(all, run_script(library_warp, steps), what + "gemm_epilogue=warp vs vector");
    CudaDrafter mma(c, w, s, bitwise), mma_alone(c, w, s, bitwise), library_alone(c, w, s, graphs);
    const auto all_mma = run_script(mma, steps);
    // The recorded plans: at 80 block rows (70 draft rows) the library GEMMs ran, at 50 (40) and
    // under gemm_m64=mma the mma kernel.
    const std::string library_kernel = precision == Precision::kFp8 ? "cutlass e4m3" : "cublaslt bf16";
    for (size_t i = 0; i < all.size(); ++i) {
      const auto library_plan = plan_of(all[i]), mma_plan = plan_of(all_mma[i]);
      for (const char* gemm : kBlockGemms) {
        const std::string want = all[i].block_width == 8 ? library_kernel : "mma ";
        EXPECT_EQ(library_plan.at(gemm).rfind(want, 0), 0u) << what << "output " << i << " " << gemm << ": " << library_plan.at(gemm);
        EXPECT_EQ(mma_plan.at(gemm).rfind("mma ", 0), 0u) << what << "gemm_m64=mma, output " << i << " " << gemm;
      }
    }
    expect_bitwise_equal(outputs_of(all_mma, 3), run_script(mma_alone, steps, false, 3), what + "gemm_m64=mma: alone vs batched");
    const auto alone = run_script(library_alone, steps, false, 3);
    const auto batched = outputs_of(all, 3);
    ASSERT_EQ(alone.size(), batched.size());
    double worst = 0;
    for (size_t i = 0; i < alone.size(); ++i) {
      const StageBound bound = gpu_test::same_precision_logits_bound(c, precision, s.ctx_cap, alone[i].block_width);
      const StageCheck cmp = check_stage("logits", 0, alone[i].logits, batched[i].logits, bound);
      EXPECT_TRUE(cmp.passed) << what << "step " << i << ": " << cmp.fail_criterion << " " << cmp.fail_value << " > "
                              << cmp.fail_bound;
      worst = std::max(worst, cmp.ratio);
    }
    size_t differing = 0;
    for (size_t i = 0; i < all.size(); ++i) {
      for (size_t j = 0; j < all[i].logits.values.size(); ++j) {
        differing += gpu_test::float_bits(all[i].logits.values[j]) != gpu_test::float_bits(all_mma[i].logits.values[j]);
      }
    }
    EXPECT_GT(differing, 0u) << what << "the library GEMMs gave the mma kernel's bits everywhere: did they run?";
    std::printf("[large batch] %s sequence 3 alone vs in a batch of 10: worst logits error/bound %.3g; %zu logits of the "
                "batch differ in bits from gemm_m64=mma\n",
                precision_name(precision), worst, differing);
  }
}

TEST(DrafterGpuErrors, FailedProposesLeaveEverySequenceUnchanged) {
  DFLASH_REQUIRE_GPU();
  const DrafterConfig c = make_config(small_geometry(64));
  const auto w = make_random_weights(c, 8);
  HeadSettings s = small_settings(Precision::kFp8);
  s.pool_pages = 5;  // 20 slots
  s.ctx_cap = 16;
  CudaDrafter d(c, w, s, CudaOptions{});
  CudaDrafter fresh(c, w, s, CudaOptions{});
  d.add_sequence(0);
  d.add_sequence(1);
  fresh.add_sequence(0);
  const int64_t width = c.ctx_feature_dim();
  const Tensor c12 = make_random_context(12, width, 1), c8 = make_random_context(8, width, 2), c2 = make_random_context(2, width, 3);
  d.propose({{0, &c12, 12, 1}}, false);
  fresh.propose({{0, &c12, 12, 1}}, false);
  const SequenceView before = d.sequence_view(0);
  const PoolView pool_before = d.pool_view();
  auto expect_unchanged = [&](const std::string& what) {
    const SequenceView after = d.sequence_view(0);
    EXPECT_EQ(after.next_position, before.next_position) << what;
    EXPECT_EQ(after.block_table, before.block_table) << what;
    EXPECT_EQ(d.pool_view().free_pages, pool_before.free_pages) << what;
    EXPECT_EQ(d.pool_view().page_owner, pool_before.page_owner) << what;
  };
  auto expect_error = [&](ErrorKind kind, const std::vector<ProposeInput>& batch, const std::string& needle) {
    try {
      d.propose(batch, false);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const HarnessError& e) {
      EXPECT_EQ(static_cast<int>(e.kind()), static_cast<int>(kind)) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    expect_unchanged(needle);
  };
  // 12 + 8 rows need 3 + 2 pages of the 5, with sequence 0 sliding: sequence 1 alone (8 rows) after
  // 0 takes 3 more pages would exhaust the pool. Pool exhaustion is atomic over the whole batch.
  expect_error(ErrorKind::kPoolExhausted, {{0, &c12, 24, 2}, {1, &c8, 8, 3}}, "exhausted");
  expect_error(ErrorKind::kBadInput, {{0, &c2, 20, 2}}, "gap");
  expect_error(ErrorKind::kBadInput, {{0, &c2, 13, 2}}, "overlap");
  Tensor bad = c2;
  bad.values[static_cast<size_t>(width + 5)] = NAN;
  expect_error(ErrorKind::kBadInput, {{0, &bad, 14, 2}}, "row 1, column 5 is NaN");
  expect_error(ErrorKind::kBadInput, {{0, &c2, 14, c.vocab_size}}, "anchor");
  expect_error(ErrorKind::kBadInput, {{0, &c2, 14, 1}, {0, &c2, 14, 1}}, "twice");
  expect_error(ErrorKind::kBadInput, {{5, &c2, 2, 1}}, "not active");
  // Afterwards the sequence continues exactly as on a drafter that never saw the errors.
  expect_bitwise_equal(d.propose({{0, &c2, 14, 4}}, false), fresh.propose({{0, &c2, 14, 4}}, false), "after errors");
}

TEST(DrafterGpuErrors, WidthClampAndRefusedConfigurations) {
  DFLASH_REQUIRE_GPU();
  const DrafterConfig c = make_config(small_geometry(64));
  const auto w = make_random_weights(c, 9);
  for (int gamma : {0, 1, 2, 8}) {
    HeadSettings s = small_settings(Precision::kBf16);
    s.gamma = gamma;
    CudaDrafter d(c, w, s, CudaOptions{});
    d.add_sequence(0);
    int64_t start = 0;
    for (int requested : {0, 1, 2, gamma, gamma + 1, 1000}) {
      d.set_block_g(requested);
      const int expected = std::clamp(requested, 2, std::max(gamma, 2));
      ASSERT_EQ(d.block_g(), expected);
      const Tensor ctx = make_random_context(3, c.ctx_feature_dim(), static_cast<uint64_t>(start));
      start += 3;
      const auto out = d.propose({{0, &ctx, start, 1}}, false);
      ASSERT_EQ(out[0].block_width, expected);
      ASSERT_EQ(out[0].logits.shape, (std::vector<int64_t>{expected - 1, c.vocab_size}));
      ASSERT_EQ(out[0].draft_tokens.size(), static_cast<size_t>(expected - 1));
      for (int32_t t : out[0].draft_tokens) ASSERT_TRUE(t >= 0 && t < c.vocab_size);
    }
  }
  auto expect_refused = [&](const DrafterConfig& config, const HeadSettings& s, const CudaOptions& o, const std::string& needle) {
    try {
      CudaDrafter d(config, w, s, o);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const HarnessError& e) {
      EXPECT_EQ(static_cast<int>(e.kind()), static_cast<int>(ErrorKind::kBadInput)) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_refused(c, small_settings(Precision::kFp32), CudaOptions{}, "fp32");
  CudaOptions tuned;
  tuned.kernels["attention"] = "tuned";
  const DrafterConfig c16 = make_config(small_geometry(16));
  expect_refused(c16, small_settings(Precision::kFp8), tuned, "head_dim 16");
  CudaOptions unknown;
  unknown.kernels["gemmm"] = "mma";
  expect_refused(c, small_settings(Precision::kFp8), unknown, "gemmm");
}

TEST(DrafterGpuErrors, EveryKernelLeverRunsAndIsDescribed) {
  DFLASH_REQUIRE_GPU();
  // Each stage switched to its plain fallback alone gives results within the same-precision
  // (bf16-boundary) bound of the default drafter (docs/tolerances.md), and describe() names the choice.
  const DrafterConfig c = make_config(small_geometry(64));
  const auto w = make_random_weights(c, 10);
  CudaDrafter base(c, w, small_settings(Precision::kFp8), CudaOptions{});
  const auto expected = run_script(base, script());
  const std::vector<std::pair<std::string, std::string>> levers = {
      {"gemm", "cublaslt"}, {"gemm", "simple"}, {"gemm_m64", "mma"}, {"ctx_gemm", "mma"}, {"ctx_gemm", "simple"}, {"ctx_gemm", "cublaslt"},
      {"attention", "generic"}, {"attention", "simple"}, {"rmsnorm", "simple"}, {"qk_norm_rope", "simple"},
      {"swiglu", "separate"}, {"argmax", "separate"}};
  for (const auto& [stage, kernel] : levers) {
    CudaOptions o;
    o.kernels[stage] = kernel;
    CudaDrafter d(c, w, small_settings(Precision::kFp8), o);
    bool described = false;
    for (const auto& [key, value] : d.describe()) {
      if (key == "kernel." + stage && value.find(kernel) != std::string::npos) described = true;
    }
    EXPECT_TRUE(described) << stage << "=" << kernel;
    const auto got = run_script(d, script());
    // The kernel asked for is the one that ran: the recorded launch plan of every propose (the
    // context GEMMs run before the block forward: the resolved plan says theirs).
    const std::string what = stage + "=" + kernel;
    if (stage == "ctx_gemm") {
      EXPECT_EQ(find_lever("ctx_gemm").held(drafter_kernel_plan(d)).name, kernel) << what;
    }
    for (const ProposeOutput& out : got) {
      const auto plan = plan_of(out);
      ASSERT_FALSE(plan.empty()) << what;
      if (stage == "gemm" || stage == "gemm_m64") {
        for (const char* gemm : kBlockGemms) {
          EXPECT_EQ(plan.at(gemm).rfind(stage == "gemm" ? kernel + " " : "mma ", 0), 0u) << what << ": " << gemm
                                                                                        << " ran " << plan.at(gemm);
        }
      } else if (stage == "attention") {
        EXPECT_EQ(plan.at("attention_chunks"), kernel == "generic" ? "generic split-KV" : "simple") << what;
        EXPECT_EQ(plan.at("combine"), kernel == "generic" ? "merge of the chunks' partials" : "none (no partials)") << what;
      } else if (stage == "rmsnorm") {
        EXPECT_EQ(plan.at("rmsnorm"), "simple") << what;
        EXPECT_EQ(plan.at("embed"), "embed, simple rmsnorm") << what;
      } else if (stage == "qk_norm_rope") {
        EXPECT_EQ(plan.at("qk_norm_rope"), "simple") << what;
      } else if (stage == "swiglu") {
        EXPECT_EQ(plan.at("swiglu"), "separate") << what;
        EXPECT_EQ(plan.at("gate_up").find("swiglu"), std::string::npos) << what << ": " << plan.at("gate_up");
      } else if (stage == "argmax") {
        EXPECT_EQ(plan.at("argmax"), "separate") << what;
        EXPECT_EQ(plan.at("lm_head").find("argmax"), std::string::npos) << what << ": " << plan.at("lm_head");
      } else if (stage != "ctx_gemm") {
        ADD_FAILURE() << "no check of what ran for " << what;
      }
    }
    ASSERT_EQ(got.size(), expected.size());
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const StageBound bound = gpu_test::same_precision_logits_bound(c, Precision::kFp8, small_settings(Precision::kFp8).ctx_cap,
                                                                     got[i].block_width);
      const StageCheck cmp = check_stage("logits", 0, expected[i].logits, got[i].logits, bound);
      EXPECT_TRUE(cmp.passed) << stage << "=" << kernel << " output " << i << ": " << cmp.fail_criterion << " "
                              << cmp.fail_value << " > " << cmp.fail_bound;
      worst = std::max(worst, cmp.metrics.max_rel);
    }
    std::printf("[levers] %s=%s: logits max |diff| / row max vs default %.3g\n", stage.c_str(), kernel.c_str(), worst);
  }
}

TEST(DrafterGpuErrors, LaunchLeversChangeNoBit) {
  DFLASH_REQUIRE_GPU();
  // The GEMM's CTA widths, the attention's walking CTAs and form (whole-window or split-KV) and
  // programmatic dependent launch change only how work is run: the drafter's outputs must be the
  // same bits as the default's, graphs on and off, in both modes, head_dim 64 and 128. Each
  // propose's recorded launch plan must show the value asked for (else the lever never ran).
  const std::vector<std::pair<std::string, std::string>> levers = {
      {"gemm_cols", "32"},     {"gemm_cols", "64"},         {"gemm_cols_m64", "32"},
      {"gemm_cols_m64", "64"}, {"pdl", "off"},              {"attention_whole_window", "on"},
      {"attention_whole_window", "off"},                    {"attention_walk_ctas", "off"}};
  // What the plan of one propose must say for stage=value; returns the checks made.
  auto ran = [](const ProposeOutput& out, const std::string& stage, const std::string& value, Precision precision,
                const std::string& what) {
    const auto plan = plan_of(out);
    int checked = 0;
    if (stage == "gemm_cols" || stage == "gemm_cols_m64") {
      for (const char* gemm : kBlockGemms) {
        const std::string& runs = plan.at(gemm);
        const bool tiles = runs.find("64-row tiles") != std::string::npos;  // m > 16
        if ((stage == "gemm_cols_m64") != tiles) continue;                   // the other lever's rows
        // bf16 weights have no 64-column tiles: gemm_cols_m64=64 falls back to 32 (fallbacks say so).
        const std::string width = stage == "gemm_cols_m64" && precision == Precision::kBf16 ? "32" : value;
        const std::string want = stage == "gemm_cols" ? ", " + width + " columns" : "64-row tiles of " + width + " columns";
        EXPECT_NE(runs.find(want), std::string::npos) << what << ": " << gemm << " ran " << runs;
        ++checked;
      }
    } else if (stage == "pdl") {
      EXPECT_EQ(plan.at("pdl"), value) << what;
      EXPECT_EQ(out.path.pdl, value == "on") << what;
      ++checked;
    } else if (stage == "attention_whole_window" || stage == "attention_walk_ctas") {
      const bool whole = stage == "attention_whole_window" && value == "on";
      EXPECT_EQ(plan.at("attention_chunks"), whole ? "tuned whole-window" : "tuned split-KV, one CTA per chunk") << what;
      EXPECT_EQ(plan.at("combine"), whole ? "none (no partials)" : "merge of the chunks' partials") << what;
      ++checked;
    } else {
      ADD_FAILURE() << "no check of what ran for " << what;
    }
    return checked;
  };
  for (int head_dim : {64, 128}) {
    const DrafterConfig c = make_config(small_geometry(head_dim));
    const auto w = make_random_weights(c, 12);
    for (Precision precision : {Precision::kFp8, Precision::kBf16}) {
      for (bool graphs : {true, false}) {
        CudaOptions defaults;
        defaults.graphs = graphs;
        CudaDrafter base(c, w, small_settings(precision), defaults);
        const auto expected = run_script(base, lever_script());
        for (const auto& [stage, value] : levers) {
          CudaOptions o = defaults;
          o.kernels[stage] = value;
          CudaDrafter d(c, w, small_settings(precision), o);
          const std::string what = stage + "=" + value + (graphs ? " graphs" : " eager") + " " +
                                   precision_name(precision) + " d" + std::to_string(head_dim);
          const auto got = run_script(d, lever_script());
          expect_bitwise_equal(expected, got, what);
          int checked = 0;
          for (const ProposeOutput& out : got) checked += ran(out, stage, value, precision, what);
          EXPECT_GT(checked, 0) << what << ": no propose ran what the lever shapes";
        }
      }
    }
  }
}

// The benchmark's block forward without some kernel classes (testing/cuda_drafter_debug.h) is a graph
// of its own: enqueued between proposes, it leaves the drafter's next outputs the bits of a
// drafter that never ran it (the next propose recomputes every block buffer it spoils), and it
// refuses classes the forward cannot leave out, by name.
TEST(DrafterGpuDebug, BlockForwardWithoutLeavesTheDrafterUntouched) {
  DFLASH_REQUIRE_GPU();
  const DrafterConfig c = make_config(small_geometry(64));
  const auto w = make_random_weights(c, 16);
  CudaOptions o;
  o.warmup = 1;
  CudaDrafter fresh(c, w, small_settings(Precision::kFp8), o);
  CudaDrafter timed(c, w, small_settings(Precision::kFp8), o);
  try {
    BlockForwardWithout before(timed, {});
    ADD_FAILURE() << "a block forward was captured before any propose";
  } catch (const HarnessError& e) {
    EXPECT_NE(std::string(e.what()).find("no propose has run yet"), std::string::npos) << e.what();
  }
  const auto expected = run_script(fresh, script());
  int enqueued = 0;
  const auto got = run_script(timed, script(), false, -1, [&](size_t step) {
    if (step % 3 != 1) return;
    for (const std::set<std::string>& without :
         std::vector<std::set<std::string>>{{}, {"o", "down"}, {"attention_chunks", "combine", "rmsnorm"}, {"lm_head"}}) {
      BlockForwardWithout forward(timed, without);
      forward.enqueue();
      forward.enqueue();
      ++enqueued;
    }
    DFLASH_CUDA_CHECK(cudaStreamSynchronize(drafter_stream(timed)));
  });
  EXPECT_GT(enqueued, 0);
  expect_bitwise_equal(expected, got, "proposes after block forwards without kernel classes");
  for (const auto& [classes, named] : std::vector<std::pair<std::set<std::string>, std::string>>{
           {{"embed"}, "'embed'"}, {{"softmax"}, "'softmax'"}, {{"swiglu"}, "'swiglu'"}}) {
    try {
      BlockForwardWithout refused(timed, classes);
      ADD_FAILURE() << named << " accepted";
    } catch (const HarnessError& e) {
      EXPECT_EQ(static_cast<int>(e.kind()), static_cast<int>(ErrorKind::kBadInput)) << e.what();
      EXPECT_NE(std::string(e.what()).find(named + ": not a kernel class this forward can leave out (qkv, "
                                                    "qk_norm_rope, attention_chunks, combine, o, rmsnorm, gate_up, "
                                                    "down, lm_head, argmax)"),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(parse_kernel_classes("o+down"), (std::set<std::string>{"o", "down"}));
  EXPECT_TRUE(parse_kernel_classes("none").empty());
}

}  // namespace
}  // namespace dflash
