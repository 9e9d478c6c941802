// CPU-side tests of the CUDA drafter (they run in CI, where there is no GPU): lever parsing, the
// attention dispatch and its head_dim check, the environment, and the refusal without a device.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "tests/support/harness_error.h"
#include "core/error.h"
#include "cuda/attention.h"
#include "cuda/cuda_drafter.h"
#include "cuda/kernel_plan.h"
#include "cuda/layer_chain.h"

namespace dflash {
namespace {

using testing::harness_error_message;

// The mma kernel's CTA width at m <= 16: by shape under auto (wide only for wide weights), clamped
// to what the format supports when forced, and always 32 above 16 rows (the 64-row tiles).
TEST(KernelPlan, MmaColumnsFollowTheWeightShape) {
  const WeightFormat e4m3 = WeightFormat::kE4M3, bf16 = WeightFormat::kBf16;
  // Qwen3-8B on 132 SMs: the busiest SM's weight rows decide (ties go to 64 for E4M3, 32 for bf16).
  EXPECT_EQ(gemm_mma_columns(0, 16, 151936, e4m3, 132), 64);  // lm_head: 36 x 32 = 18 x 64
  EXPECT_EQ(gemm_mma_columns(0, 16, 151936, bf16, 132), 32);
  EXPECT_EQ(gemm_mma_columns(0, 16, 6144, bf16, 132), 32);    // q|k|v: 2 x 32 = 1 x 64
  EXPECT_EQ(gemm_mma_columns(0, 16, 4096, bf16, 16), 32);     // 16 SMs: 8 x 32 = 4 x 64
  EXPECT_EQ(gemm_mma_columns(0, 16, 24576, e4m3, 132), 64);   // gate|up: 6 x 32 = 3 x 64
  EXPECT_EQ(gemm_mma_columns(0, 1, 6144, e4m3, 132), 64);     // q|k|v: 192 CTAs = 2 x 32, 96 = 1 x 64
  EXPECT_EQ(gemm_mma_columns(0, 16, 4096, e4m3, 132), 32);    // o, down: 128 CTAs = 1 x 32 < 1 x 64
  EXPECT_EQ(gemm_mma_columns(0, 16, 4096, e4m3, 16), 64);     // 16 SMs: 8 x 32 = 4 x 64
  EXPECT_EQ(gemm_mma_columns(0, 17, 151936, e4m3, 132), 32);  // 64-row tiles: always 32
  EXPECT_EQ(gemm_mma_columns(128, 16, 4096, e4m3, 132), 128);
  EXPECT_EQ(gemm_mma_columns(128, 16, 4096, bf16, 132), 64);
  EXPECT_EQ(gemm_mma_columns(96, 16, 4096, e4m3, 132), 96);
  EXPECT_EQ(gemm_mma_columns(96, 16, 4096, bf16, 132), 64);
  EXPECT_EQ(gemm_mma_columns(96, 64, 4096, e4m3, 132), 32);
  EXPECT_EQ(gemm_mma_columns(32, 16, 151936, e4m3, 132), 32);
  EXPECT_EQ(gemm_mma_columns(128, 64, 151936, e4m3, 132), 32);
}

TEST(KernelPlan, DefaultsAndEveryLever) {
  const KernelPlan d = resolve_kernel_plan({}, 128);
  EXPECT_EQ(d.block_gemm, GemmKernel::kMma);
  EXPECT_FALSE(d.ctx_gemm_auto);  // own kernel by default: bitwise batch invariance
  EXPECT_EQ(d.attention.kernel, AttentionKernel::kTuned);
  EXPECT_EQ(d.attention.compiled_head_dim, 128);
  EXPECT_EQ(d.attention.name(), "tuned-d128");
  EXPECT_TRUE(d.swiglu_fused);
  EXPECT_TRUE(d.argmax_fused);
  EXPECT_EQ(d.ctx_kernel(65, WeightFormat::kBf16), GemmKernel::kMma);
  EXPECT_EQ(d.ctx_kernel(1024, WeightFormat::kE4M3), GemmKernel::kMma);
  // auto hands bf16 context GEMMs of more than 64 rows to cuBLASLt, E4M3 ones never.
  const KernelPlan a = resolve_kernel_plan({{"ctx_gemm", "auto"}}, 128);
  EXPECT_TRUE(a.ctx_gemm_auto);
  EXPECT_EQ(a.ctx_kernel(64, WeightFormat::kBf16), GemmKernel::kMma);
  EXPECT_EQ(a.ctx_kernel(65, WeightFormat::kBf16), GemmKernel::kCublasLt);
  EXPECT_EQ(a.ctx_kernel(256, WeightFormat::kE4M3), GemmKernel::kMma);

  const KernelPlan p = resolve_kernel_plan({{"gemm", "cublas"}, {"ctx_gemm", "simple"}, {"attention", "simple"},
                                            {"rmsnorm", "simple"}, {"qk_norm_rope", "simple"}, {"swiglu", "separate"},
                                            {"argmax", "separate"}},
                                           64);
  EXPECT_EQ(p.block_gemm, GemmKernel::kCublasLt);
  EXPECT_FALSE(p.ctx_gemm_auto);
  EXPECT_EQ(p.ctx_kernel(1, WeightFormat::kBf16), GemmKernel::kSimple);
  EXPECT_EQ(p.attention.kernel, AttentionKernel::kSimple);
  EXPECT_EQ(p.rmsnorm, RowKernel::kSimple);
  EXPECT_EQ(p.qk_norm_rope, RowKernel::kSimple);
  EXPECT_FALSE(p.swiglu_fused);
  EXPECT_FALSE(p.argmax_fused);
  EXPECT_TRUE(p.cublaslt_reads_e4m3(true));
  EXPECT_FALSE(p.cublaslt_reads_e4m3(false));
  bool described = false;
  for (const auto& [k, v] : describe_kernel_plan(p, true)) {
    if (k == "batch_invariance") described = v.find("within a rounding bound") != std::string::npos;
  }
  EXPECT_TRUE(described);
  EXPECT_EQ(resolve_kernel_plan({{"gemm", "fp8-small-m"}}, 64).block_gemm, GemmKernel::kMma);

  // gemm_cols and pdl: launch shapes only (bits do not change with them), resolved and described.
  EXPECT_EQ(d.gemm_columns, 0);
  EXPECT_TRUE(d.pdl);
  EXPECT_EQ(d.gemm_pipeline, GemmPipeline::kDeep);
  EXPECT_EQ(d.gemm_columns_m64, 0);  // auto: by weight shape
  EXPECT_EQ(resolve_kernel_plan({{"gemm_cols_m64", "32"}}, 128).gemm_columns_m64, 32);
  EXPECT_EQ(resolve_kernel_plan({{"gemm_cols_m64", "auto"}}, 128).gemm_columns_m64, 0);
  const KernelPlan w = resolve_kernel_plan(
      {{"gemm_cols", "128"}, {"pdl", "off"}, {"gemm_pipeline", "ring"}, {"gemm_cols_m64", "64"}}, 128);
  EXPECT_EQ(w.gemm_columns, 128);
  EXPECT_EQ(w.gemm_columns_m64, 64);
  EXPECT_FALSE(w.pdl);
  EXPECT_EQ(w.gemm_pipeline, GemmPipeline::kRing);
  int launch_entries = 0;
  for (const auto& [k, v] : describe_kernel_plan(w, true)) {
    if (k == "kernel.gemm_cols") launch_entries += v == "128 (m <= 16)";
    if (k == "kernel.gemm_cols_m64") launch_entries += v == "64 (m > 16: 64-row tiles)";
    if (k == "kernel.pdl") launch_entries += v == "off";
    if (k == "kernel.gemm_pipeline") launch_entries += v.rfind("ring", 0) == 0;
  }
  EXPECT_EQ(launch_entries, 4);
  // attention_pass_ctas: at most one CTA per 64-column pass, named in the attention's description.
  EXPECT_EQ(d.attention.pass_ctas, 1);
  EXPECT_EQ(resolve_kernel_plan({{"attention_pass_ctas", "2"}}, 128).attention.pass_ctas, 2);
  EXPECT_EQ(resolve_kernel_plan({{"attention_pass_ctas", "2"}}, 128).attention.name(), "tuned-d128 (P·V passes over 2 CTAs)");
  EXPECT_EQ(resolve_kernel_plan({{"attention_pass_ctas", "4"}}, 128).attention.name(), "tuned-d128 (P·V passes over 2 CTAs)");
  EXPECT_EQ(resolve_kernel_plan({{"attention_pass_ctas", "2"}}, 64).attention.name(), "tuned-d64");
  EXPECT_EQ(resolve_kernel_plan({{"attention_pass_ctas", "auto"}}, 256).attention.name(), "tuned-d256");
  EXPECT_EQ(attention_pass_ctas(4, 256), 4);
  EXPECT_EQ(attention_pass_ctas(4, 128), 2);
  EXPECT_EQ(attention_pass_ctas(2, 64), 1);
  EXPECT_EQ(attention_pass_ctas(0, 128), 1);
  EXPECT_EQ(harness_error_message([] { resolve_kernel_plan({{"attention_pass_ctas", "3"}}, 128); }),
            "CUDA kernels: attention_pass_ctas=3 is not a count (auto, 1, 2, 4)");
  EXPECT_EQ(harness_error_message([] { resolve_kernel_plan({{"gemm_cols_m64", "128"}}, 128); }),
            "CUDA kernels: gemm_cols_m64=128 is not a width (auto, 32, 64)");
  // 64 columns at m > 16 exist for E4M3 weights only; m <= 16 never asks this rule.
  const WeightFormat e4m3 = WeightFormat::kE4M3, bf16 = WeightFormat::kBf16;
  EXPECT_EQ(gemm_mma_columns_m64(0, 64, 6144, e4m3, 132), 64);     // q|k|v: 192 CTAs = 2 waves at 32, 96 = 1 at 64
  EXPECT_EQ(gemm_mma_columns_m64(0, 64, 24576, e4m3, 132), 64);    // gate|up: 6 waves at 32, 3 at 64
  EXPECT_EQ(gemm_mma_columns_m64(0, 64, 151936, e4m3, 132), 64);   // lm_head
  EXPECT_EQ(gemm_mma_columns_m64(0, 64, 4096, e4m3, 132), 32);     // o, down at m = 64: 128 CTAs fill one wave
  EXPECT_EQ(gemm_mma_columns_m64(0, 128, 4096, e4m3, 132), 64);    // batch 8: 256 CTAs at 32 = 2 waves
  EXPECT_EQ(gemm_mma_columns_m64(0, 512, 4096, e4m3, 132), 64);    // batch 32
  EXPECT_EQ(gemm_mma_columns_m64(0, 64, 4096, e4m3, 0), 64);       // SMs unknown: the fewest activation reads
  EXPECT_EQ(gemm_mma_columns_m64(64, 64, 4096, e4m3, 132), 64);    // asked for: taken
  EXPECT_EQ(gemm_mma_columns_m64(32, 512, 151936, e4m3, 132), 32);
  EXPECT_EQ(gemm_mma_columns_m64(0, 512, 151936, bf16, 132), 32);  // bf16: always 32
  EXPECT_EQ(gemm_mma_columns_m64(64, 512, 151936, bf16, 132), 32);
  EXPECT_EQ(harness_error_message([] { resolve_kernel_plan({{"gemm_pipeline", "wide"}}, 128); }),
            "CUDA kernels: gemm_pipeline=wide is not a pipeline (ring, deep, deep-shared)");
  EXPECT_EQ(resolve_kernel_plan({{"gemm_pipeline", "deep-shared"}}, 128).gemm_pipeline, GemmPipeline::kDeepShared);
  EXPECT_EQ(resolve_kernel_plan({{"gemm_pipeline", "deep"}}, 128).gemm_pipeline, GemmPipeline::kDeep);
  EXPECT_EQ(resolve_kernel_plan({{"gemm_pipeline", "auto"}}, 128).gemm_pipeline, KernelPlan{}.gemm_pipeline);
  EXPECT_EQ(resolve_kernel_plan({{"gemm_cols", "auto"}}, 128).gemm_columns, 0);
  EXPECT_EQ(harness_error_message([] { resolve_kernel_plan({{"gemm_cols", "48"}}, 128); }),
            "CUDA kernels: gemm_cols=48 is not a width (auto, 32, 64, 96, 128)");
  EXPECT_EQ(d.gemm_trigger, GemmTrigger::kLastIssue);
  EXPECT_EQ(resolve_kernel_plan({{"gemm_trigger", "start"}}, 128).gemm_trigger, GemmTrigger::kStart);
  EXPECT_EQ(resolve_kernel_plan({{"gemm_trigger", "loop-end"}}, 128).gemm_trigger, GemmTrigger::kLoopEnd);
  EXPECT_EQ(resolve_kernel_plan({{"gemm_trigger", "auto"}}, 128).gemm_trigger, KernelPlan{}.gemm_trigger);
  EXPECT_EQ(harness_error_message([] { resolve_kernel_plan({{"gemm_trigger", "early"}}, 128); }),
            "CUDA kernels: gemm_trigger=early is not a trigger point (loop-end, last-issue, start)");
  EXPECT_TRUE(d.gemm_lean_solo);
  EXPECT_FALSE(resolve_kernel_plan({{"gemm_solo_smem", "full"}}, 128).gemm_lean_solo);
  EXPECT_TRUE(resolve_kernel_plan({{"gemm_solo_smem", "lean"}}, 128).gemm_lean_solo);
  EXPECT_EQ(resolve_kernel_plan({{"gemm_solo_smem", "auto"}}, 128).gemm_lean_solo, KernelPlan{}.gemm_lean_solo);
  EXPECT_EQ(harness_error_message([] { resolve_kernel_plan({{"gemm_solo_smem", "small"}}, 128); }),
            "CUDA kernels: gemm_solo_smem=small is not a size (full, lean)");
  // ablate (timing only): parsed, described loudly, unknown kernels refused.
  EXPECT_TRUE(d.ablate.empty());
  const KernelPlan ab = resolve_kernel_plan({{"ablate", "rmsnorm+attention"}}, 128);
  EXPECT_TRUE(ab.ablated("rmsnorm"));
  EXPECT_TRUE(ab.ablated("attention"));
  EXPECT_FALSE(ab.ablated("o"));
  bool loud = false;
  for (const auto& [k, v] : describe_kernel_plan(ab, true)) {
    if (k == "kernel.ablate") loud = v.find("attention+rmsnorm NOT LAUNCHED") == 0;
  }
  EXPECT_TRUE(loud);
  EXPECT_TRUE(resolve_kernel_plan({{"ablate", "none"}}, 128).ablate.empty());
  EXPECT_EQ(harness_error_message([] { resolve_kernel_plan({{"ablate", "rmsnorm+softmax"}}, 128); }),
            "CUDA kernels: ablate=rmsnorm+softmax: 'softmax' is not a block-forward kernel (rmsnorm, qk_norm_rope, "
            "attention, attention_chunks, combine, qkv, o, gate_up, down, lm_head, argmax; '+' between them, or none)");
  EXPECT_EQ(harness_error_message([] { resolve_kernel_plan({{"pdl", "maybe"}}, 128); }),
            "CUDA kernels: pdl=maybe is not a setting (auto, on, off)");

  // The split-K lever, for block and context rows; still our own kernels, so bitwise invariant.
  const KernelPlan s = resolve_kernel_plan({{"gemm", "mma-splitk"}, {"ctx_gemm", "mma-splitk"}}, 128);
  EXPECT_EQ(s.block_gemm, GemmKernel::kMmaSplitK);
  EXPECT_FALSE(s.ctx_gemm_auto);
  EXPECT_EQ(s.ctx_kernel(256, WeightFormat::kBf16), GemmKernel::kMmaSplitK);
  EXPECT_FALSE(s.uses_cublaslt());
  int checked = 0;
  for (const auto& [k, v] : describe_kernel_plan(s, true)) {
    if (k == "kernel.gemm") {
      EXPECT_EQ(v.rfind("mma-splitk", 0), 0u) << v;
      ++checked;
    } else if (k == "kernel.ctx_gemm") {
      EXPECT_EQ(v, "mma-splitk");
      ++checked;
    } else if (k == "batch_invariance") {
      EXPECT_EQ(v, "bitwise for block rows (own kernels, fixed reduction order); context rows bitwise");
      ++checked;
    }
  }
  EXPECT_EQ(checked, 3);
  GemmKernel parsed = GemmKernel::kMma;
  EXPECT_TRUE(parse_gemm_kernel("mma-splitk", &parsed));
  EXPECT_EQ(parsed, GemmKernel::kMmaSplitK);
}

// Expected split counts worked by hand from the rule in gemm_mma.cu: the smallest power of two S
// with ceil(n / 32) · S >= 512, at most 8 and at most the k-tiles (k_pad / 64), then the empty
// splits of ceil(k_tiles / S)-tile splits dropped.
TEST(GemmSplitK, SplitCountIsAFunctionOfTheWeightShape) {
  // Qwen3-8B geometry (H 4096, I 12288, 32/8 heads of 128, V 151936, 5 target layers).
  EXPECT_EQ(gemm_split_count(6144, 4096), 4);     // q|k|v: 192 column blocks -> 768 CTAs
  EXPECT_EQ(gemm_split_count(4096, 4096), 4);     // o: 128 -> 512
  EXPECT_EQ(gemm_split_count(4096, 12288), 4);    // down: 128 -> 512, 48 k-tiles each
  EXPECT_EQ(gemm_split_count(4096, 20480), 4);    // fc (5 · 4096 context features)
  EXPECT_EQ(gemm_split_count(2048, 4096), 8);     // context k|v: 64 -> 512, 8 k-tiles each
  EXPECT_EQ(gemm_split_count(24576, 4096), 1);    // gate|up: 768 blocks already
  EXPECT_EQ(gemm_split_count(151936, 4096), 1);   // lm_head
  // The GPU test's shapes: both split paths and the plain one are exercised.
  EXPECT_EQ(gemm_split_count(200, 4096), 8);      // 7 blocks, capped at 8 splits of 8 tiles
  EXPECT_EQ(gemm_split_count(520, 12288), 8);     // 17 blocks, 8 splits of 24 tiles
  EXPECT_EQ(gemm_split_count(96, 64), 1);         // one k-tile
  EXPECT_EQ(gemm_split_count(16, 128), 2);        // two k-tiles
  EXPECT_EQ(gemm_split_count(160, 640), 5);       // 10 tiles: 8 splits of 2 leave 5 non-empty
  EXPECT_EQ(gemm_split_count(192, 256), 4);       // 4 tiles, one each
  EXPECT_EQ(gemm_split_count(2500, 128), 2);      // 79 blocks, 2 tiles
  EXPECT_EQ(gemm_split_count(4096, 192), 2);      // 3 tiles: 2 splits (4 > 3 tiles), of 2 and 1
  EXPECT_EQ(gemm_split_count(4096, 320), 3);      // 5 tiles: 4 splits of 2 leave 3 non-empty
  // Scratch: rows · n · splits floats for a split GEMM, none for one that runs as mma.
  EXPECT_EQ(gemm_scratch_floats(GemmKernel::kMmaSplitK, 16, 6144, 4096), 16 * 6144 * 4);
  EXPECT_EQ(gemm_scratch_floats(GemmKernel::kMmaSplitK, 512, 24576, 4096), 0);
  EXPECT_EQ(gemm_scratch_floats(GemmKernel::kMma, 16, 6144, 4096), 0);
  EXPECT_EQ(gemm_scratch_floats(GemmKernel::kSimple, 16, 6144, 4096), 16 * 6144);
}

// The layer chain's levers: parsed, described with what was asked until the drafter resolves them,
// and refused by name otherwise.
TEST(KernelPlan, LayerChainLevers) {
  const KernelPlan d = resolve_kernel_plan({}, 128);
  EXPECT_EQ(d.layer_chain, KernelPlan::Chain::kAuto);
  EXPECT_EQ(d.layer_chain_ctas, 0);
  EXPECT_FALSE(d.layer_chain_lm_head);
  const KernelPlan on = resolve_kernel_plan({{"layer_chain", "on"}, {"layer_chain_ctas", "7"}, {"layer_chain_lm_head", "on"}}, 128);
  EXPECT_EQ(on.layer_chain, KernelPlan::Chain::kOn);
  EXPECT_EQ(on.layer_chain_ctas, 7);
  EXPECT_TRUE(on.layer_chain_lm_head);
  EXPECT_EQ(resolve_kernel_plan({{"layer_chain", "off"}}, 128).layer_chain, KernelPlan::Chain::kOff);
  EXPECT_EQ(resolve_kernel_plan({{"layer_chain_ctas", "auto"}}, 128).layer_chain_ctas, 0);
  EXPECT_EQ(resolve_kernel_plan({{"layer_chain_ctas", "1024"}}, 128).layer_chain_ctas, 1024);
  EXPECT_FALSE(resolve_kernel_plan({{"layer_chain_lm_head", "auto"}}, 128).layer_chain_lm_head);
  std::string described;
  for (const auto& [k, v] : describe_kernel_plan(on, true)) {
    if (k == "kernel.layer_chain") described = v;
  }
  EXPECT_EQ(described, "on");
  KernelPlan resolved = on;
  resolved.layer_chain_resolved = "off (bf16 weights: the chain streams E4M3 weights)";
  for (const auto& [k, v] : describe_kernel_plan(resolved, false)) {
    if (k == "kernel.layer_chain") described = v;
  }
  EXPECT_EQ(described, "off (bf16 weights: the chain streams E4M3 weights)");
  EXPECT_EQ(harness_error_message([] { resolve_kernel_plan({{"layer_chain", "persistent"}}, 128); }),
            "CUDA kernels: layer_chain=persistent is not a setting (auto, on, off)");
  for (const char* bad : {"0", "1025", "7x", "", "-3"}) {
    EXPECT_EQ(harness_error_message([bad] { resolve_kernel_plan({{"layer_chain_ctas", bad}}, 128); }),
              std::string("CUDA kernels: layer_chain_ctas=") + bad + " is not a count (auto, or 1 to 1024)");
  }
  EXPECT_EQ(harness_error_message([] { resolve_kernel_plan({{"layer_chain_lm_head", "yes"}}, 128); }),
            "CUDA kernels: layer_chain_lm_head=yes is not a setting (auto, on, off)");
}

// What the chain refuses (layer_chain_refusal is host code: it runs here without a GPU). The
// pointers are never dereferenced: only their alignment is checked.
TEST(LayerChain, RefusesWhatItCannotRunNamingTheStep) {
  alignas(16) static uint16_t activations[64];
  alignas(16) static uint8_t weights[64];
  alignas(16) static float row[64];
  auto gemm = [](int64_t m) {
    LayerChainStep s;
    s.kind = LayerChainStep::Kind::kGemm;
    s.a = activations;
    s.lda = 64;
    s.m = m;
    s.w.format = WeightFormat::kE4M3;
    s.w.n = 96, s.w.k = 64, s.w.k_pad = 64;
    s.w.data = weights;
    return s;
  };
  auto norm = [](int64_t rows, int64_t cols) {
    LayerChainStep s;
    s.kind = LayerChainStep::Kind::kRmsNorm;
    s.norm.in = row, s.norm.ld_in = cols, s.norm.weight = row, s.norm.cols = cols;
    s.norm.out = activations, s.norm.ld_out = 64, s.norm.rows = rows;
    return s;
  };
  EXPECT_EQ(layer_chain_refusal({gemm(16), norm(16, 64), gemm(1)}), "");
  EXPECT_EQ(layer_chain_refusal({}), "no steps");
  EXPECT_EQ(layer_chain_refusal({gemm(17)}), "step 0: GEMM of 17 rows (1 to 16)");
  EXPECT_EQ(layer_chain_refusal({gemm(16), norm(0, 64)}), "step 1: RMSNorm of 0 rows (1 to 16)");
  EXPECT_EQ(layer_chain_refusal({norm(4, 62)}),
            "step 0: an RMSNorm of 62 columns that the vectorized kernel does not serve (whole float4s, aligned rows, "
            "at most 16384 columns)");
  LayerChainStep bf16 = gemm(4);
  bf16.w.format = WeightFormat::kBf16;
  EXPECT_EQ(layer_chain_refusal({gemm(4), bf16}), "step 1: bf16 weights (the chain streams E4M3 weights)");
  LayerChainStep shifted = gemm(4);
  shifted.a = activations + 1;
  EXPECT_EQ(layer_chain_refusal({shifted}), "step 0: GEMM operands not padded/aligned (k_pad 64, lda 64)");
  LayerChainStep short_lda = gemm(4);
  short_lda.lda = 32;
  EXPECT_EQ(layer_chain_refusal({short_lda}), "step 0: GEMM operands not padded/aligned (k_pad 64, lda 32)");
  EXPECT_EQ(layer_chain_refusal({gemm(1), gemm(1), gemm(1), gemm(1), gemm(1), gemm(1), gemm(1), gemm(1)}),
            "8 steps (at most 7)");
  EXPECT_EQ(layer_chain_refusal({gemm(1), gemm(1), gemm(1), gemm(1), gemm(1), gemm(1)}),
            "6 GEMMs and 0 RMSNorms (at most 5 and 2)");
  EXPECT_EQ(layer_chain_refusal({norm(1, 64), norm(1, 64), norm(1, 64)}), "0 GEMMs and 3 RMSNorms (at most 5 and 2)");
}

TEST(KernelPlan, UnknownStagesAndKernelsAreRefusedByName) {
  EXPECT_NE(harness_error_message([] { resolve_kernel_plan({{"gemmm", "mma"}}, 64); }).find("gemmm"), std::string::npos);
  EXPECT_NE(harness_error_message([] { resolve_kernel_plan({{"gemm", "fast"}}, 64); }).find("gemm=fast"), std::string::npos);
  EXPECT_NE(harness_error_message([] { resolve_kernel_plan({{"attention", "flash"}}, 64); }).find("flash"), std::string::npos);
  EXPECT_NE(harness_error_message([] { resolve_kernel_plan({{"swiglu", "maybe"}}, 64); }).find("swiglu"), std::string::npos);
}

TEST(AttentionDispatch, EachHeadDimGetsTheKernelBuiltForIt) {
  for (int d : {64, 128, 256}) {
    const AttentionChoice c = choose_attention_kernel("auto", d);
    EXPECT_EQ(c.kernel, AttentionKernel::kTuned);
    EXPECT_EQ(c.compiled_head_dim, d);
  }
  for (int d : {12, 16, 32, 96, 250}) {
    EXPECT_EQ(choose_attention_kernel("auto", d).kernel, AttentionKernel::kGeneric) << d;
    EXPECT_NE(harness_error_message([d] { choose_attention_kernel("tuned", d); }).find("head_dim " + std::to_string(d)),
              std::string::npos);
  }
  for (int d : {0, 15, 258, 512}) {
    EXPECT_NE(harness_error_message([d] { choose_attention_kernel("auto", d); }).find("head_dim " + std::to_string(d)),
              std::string::npos);
  }
}

TEST(AttentionDispatch, AKernelBuiltForOneHeadDimRefusesToRunAnother) {
  // The failure class "attention built for head_dim 256 ran on a 128 drafter": the launch checks
  // the compiled head_dim against the arguments before touching the device.
  const AttentionChoice d256 = choose_attention_kernel("tuned", 256);
  AttentionArgs args;
  args.head_dim = 128;
  testing::expect_mentions(
      harness_error_message([&] { launch_attention(d256, args, nullptr); }, ErrorKind::kInternal),
      "built for head_dim 256");
}

class EnvironmentTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const char* v : {"DFLASH_CUDA_GRAPHS", "DFLASH_CUDA_WARMUP", "DFLASH_CUDA_KERNELS", "DFLASH_CUDA_PRECISION",
                          "DFLASH_CUDA_DEVICE"}) {
      unsetenv(v);
    }
  }
};

TEST_F(EnvironmentTest, VariablesApplyOnTopOfTheOptions) {
  CudaOptions base;
  base.kernels["attention"] = "generic";
  base.kernels["rmsnorm"] = "simple";
  setenv("DFLASH_CUDA_GRAPHS", "0", 1);
  setenv("DFLASH_CUDA_WARMUP", "5", 1);
  setenv("DFLASH_CUDA_KERNELS", "gemm=cublas,attention=simple", 1);
  setenv("DFLASH_CUDA_PRECISION", "bf16", 1);
  const CudaOptions o = base.with_environment();
  EXPECT_FALSE(o.graphs);
  EXPECT_EQ(o.warmup, 5);
  EXPECT_EQ(o.kernels.at("gemm"), "cublas");
  EXPECT_EQ(o.kernels.at("attention"), "simple");
  EXPECT_EQ(o.kernels.at("rmsnorm"), "simple");
  EXPECT_EQ(o.precision, "bf16");
  unsetenv("DFLASH_CUDA_GRAPHS");
  EXPECT_TRUE(CudaOptions{}.with_environment().graphs);
}

TEST_F(EnvironmentTest, MalformedValuesAreRefusedNamingTheVariable) {
  const std::pair<const char*, const char*> bad[] = {{"DFLASH_CUDA_GRAPHS", "yes please"},
                                                     {"DFLASH_CUDA_WARMUP", "-1"},
                                                     {"DFLASH_CUDA_WARMUP", "2x"},
                                                     {"DFLASH_CUDA_KERNELS", "gemm"},
                                                     {"DFLASH_CUDA_KERNELS", "gemm=mma,,attention=auto"},
                                                     {"DFLASH_CUDA_PRECISION", "fp32"}};
  for (const auto& [name, value] : bad) {
    setenv(name, value, 1);
    EXPECT_NE(harness_error_message([] { CudaOptions{}.with_environment(); }).find(name), std::string::npos) << value;
    unsetenv(name);
  }
}

TEST(CudaDevice, WithoutAUsableDeviceTheDrafterIsUnsupported) {
  std::string why;
  if (cuda_device_available(&why)) GTEST_SKIP() << "a device is present; this test is for machines without one";
  EXPECT_FALSE(why.empty());
  DrafterConfig config;
  config.hidden_size = 64, config.num_layers = 1, config.num_heads = 4, config.num_kv_heads = 4, config.head_dim = 16;
  config.intermediate_size = 128, config.vocab_size = 100, config.block_size = 4, config.target_layer_ids = {1};
  config.target_hidden_size = 64;
  HeadSettings settings;
  settings.precision = Precision::kFp8;
  harness_error_message([&] { make_cuda_drafter(config, std::make_shared<DrafterWeights>(), settings, CudaOptions{}); },
                        ErrorKind::kUnsupported);
}

}  // namespace
}  // namespace dflash
