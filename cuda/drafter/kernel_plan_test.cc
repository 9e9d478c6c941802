// CPU-side tests of the CUDA drafter (they run in CI, where there is no GPU): lever parsing, the
// attention dispatch and its head_dim check, the environment, and the refusal without a device.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "tests/support/harness_error.h"
#include "core/error.h"
#include "cuda/kernels/attention/attention.h"
#include "cuda/drafter/cuda_drafter.h"
#include "cuda/drafter/kernel_plan.h"

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

// The CUTLASS tile height: 256 activation rows where their tiles still number two per SM, or where
// 128-row tiles would number between one and two per SM.
TEST(KernelPlan, CutlassTileRowsFollowTheShape) {
  EXPECT_EQ(gemm_cutlass_tile_rows(0, 512, 24576, 132), 256);   // gate|up at batch 32: 384 wide tiles
  EXPECT_EQ(gemm_cutlass_tile_rows(0, 512, 6144, 132), 256);    // q|k|v at batch 32: 192 tiles of 128
  EXPECT_EQ(gemm_cutlass_tile_rows(0, 1024, 4096, 132), 256);   // o and down at batch 64: 256 tiles of 128
  EXPECT_EQ(gemm_cutlass_tile_rows(0, 256, 6144, 132), 128);    // q|k|v at batch 16: 96 tiles, one wave
  EXPECT_EQ(gemm_cutlass_tile_rows(0, 2048, 4096, 132), 128);   // 512 tiles of 128, 256 wide: neither rule
  EXPECT_EQ(gemm_cutlass_tile_rows(0, 480, 151936, 132), 256);  // lm_head at batch 32
  EXPECT_EQ(gemm_cutlass_tile_rows(0, 240, 151936, 132), 256);  // lm_head at batch 16
  EXPECT_EQ(gemm_cutlass_tile_rows(0, 256, 24576, 132), 128);   // 192 wide tiles: under two per SM
  EXPECT_EQ(gemm_cutlass_tile_rows(0, 512, 4096, 132), 128);    // o and down: 64 wide tiles
  EXPECT_EQ(gemm_cutlass_tile_rows(0, 128, 151936, 132), 128);  // 128 rows: half of a wide tile empty
  EXPECT_EQ(gemm_cutlass_tile_rows(0, 129, 151936, 132), 256);
  EXPECT_EQ(gemm_cutlass_tile_rows(0, 512, 151936, 0), 128);    // SM count unknown
  EXPECT_EQ(gemm_cutlass_tile_rows(256, 64, 4096, 132), 256);   // requested
  EXPECT_EQ(gemm_cutlass_tile_rows(128, 512, 151936, 132), 128);
}

TEST(KernelPlan, DefaultsAndEveryLever) {
  const KernelPlan d = resolve_kernel_plan({}, 128);
  EXPECT_EQ(d.block_gemm, GemmKernel::kMma);
  EXPECT_FALSE(d.ctx_gemm_auto);  // own kernel by default: bitwise batch invariance
  EXPECT_EQ(d.attention.kernel, AttentionKernel::kTuned);
  EXPECT_EQ(d.attention.compiled_head_dim, 128);
  EXPECT_EQ(d.attention.name(), "tuned-d128 (split-KV, runs of chunks per CTA past one wave; whole-window from 1024 warps)");
  EXPECT_TRUE(d.swiglu_fused);
  EXPECT_TRUE(d.argmax_fused);
  EXPECT_EQ(d.selector_topk, SelectorTopK::kThreshold);
  EXPECT_EQ(d.gemm_epilogue, EpilogueKernel::kVector);
  EXPECT_EQ(d.cutlass_tile_rows, 0);
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
                                            {"argmax", "separate"}, {"selector_topk", "plain"},
                                            {"gemm_epilogue", "warp"}, {"cutlass_tile", "256"}},
                                           64);
  EXPECT_EQ(p.block_gemm, GemmKernel::kCublasLt);
  EXPECT_FALSE(p.ctx_gemm_auto);
  EXPECT_EQ(p.ctx_kernel(1, WeightFormat::kBf16), GemmKernel::kSimple);
  EXPECT_EQ(p.attention.kernel, AttentionKernel::kSimple);
  EXPECT_EQ(p.rmsnorm, RowKernel::kSimple);
  EXPECT_EQ(p.qk_norm_rope, RowKernel::kSimple);
  EXPECT_FALSE(p.swiglu_fused);
  EXPECT_FALSE(p.argmax_fused);
  EXPECT_EQ(p.selector_topk, SelectorTopK::kPlain);
  EXPECT_EQ(p.gemm_epilogue, EpilogueKernel::kWarp);
  EXPECT_EQ(p.cutlass_tile_rows, 256);
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
  EXPECT_EQ(d.gemm_columns_m64, 0);  // auto: by weight shape
  EXPECT_EQ(resolve_kernel_plan({{"gemm_cols_m64", "32"}}, 128).gemm_columns_m64, 32);
  EXPECT_EQ(resolve_kernel_plan({{"gemm_cols_m64", "auto"}}, 128).gemm_columns_m64, 0);
  const KernelPlan w = resolve_kernel_plan(
      {{"gemm_cols", "128"}, {"pdl", "off"}, {"gemm_cols_m64", "64"}}, 128);
  EXPECT_EQ(w.gemm_columns, 128);
  EXPECT_EQ(w.gemm_columns_m64, 64);
  EXPECT_FALSE(w.pdl);
  int launch_entries = 0;
  for (const auto& [k, v] : describe_kernel_plan(w, true)) {
    if (k == "kernel.gemm_cols") launch_entries += v == "128 (m <= 16)";
    if (k == "kernel.gemm_cols_m64") launch_entries += v == "64 (m > 16: 64-row tiles)";
    if (k == "kernel.pdl") launch_entries += v == "off";
  }
  EXPECT_EQ(launch_entries, 3);
  // attention_pass_ctas: at most one CTA per 64-column pass, named in the attention's description.
  EXPECT_EQ(d.attention.pass_ctas, 1);
  EXPECT_EQ(resolve_kernel_plan({{"attention_pass_ctas", "2"}}, 128).attention.pass_ctas, 2);
  EXPECT_EQ(resolve_kernel_plan({{"attention_pass_ctas", "2"}}, 128).attention.name(), "tuned-d128 (split-KV, P·V passes over 2 CTAs; whole-window from 1024 warps)");
  EXPECT_EQ(resolve_kernel_plan({{"attention_pass_ctas", "4"}, {"attention_whole_window", "off"}}, 128).attention.name(),
            "tuned-d128 (split-KV, P·V passes over 2 CTAs)");
  EXPECT_EQ(resolve_kernel_plan({{"attention_pass_ctas", "2"}, {"attention_whole_window", "off"}}, 64).attention.name(),
            "tuned-d64 (split-KV, runs of chunks per CTA past one wave)");
  // attention_walk_ctas: a count, off (one CTA per chunk) or auto; others refused by name.
  EXPECT_EQ(d.attention.walk_ctas, 0);
  EXPECT_EQ(resolve_kernel_plan({{"attention_walk_ctas", "3"}, {"attention_whole_window", "off"}}, 128).attention.name(),
            "tuned-d128 (split-KV, runs of chunks over 3 CTAs per kv head and sequence)");
  EXPECT_EQ(resolve_kernel_plan({{"attention_walk_ctas", "off"}, {"attention_whole_window", "off"}}, 128).attention.name(),
            "tuned-d128 (split-KV)");
  EXPECT_EQ(harness_error_message([] { resolve_kernel_plan({{"attention_walk_ctas", "5"}}, 128); }),
            "CUDA kernels: attention_walk_ctas=5 is not a count or off (auto, 1, 2, 3, 4, 6, 8, 16)");
  // attention_whole_window: the form follows batch x kv heads under auto; on and off hold at every batch.
  const AttentionChoice automatic = d.attention;
  // Qwen3-8B (32 heads over 8, block 16: 4 m-tiles per pair): whole-window from batch 32 (1024 warps).
  EXPECT_FALSE(attention_runs_whole_window(automatic, 31, 16, 32, 8));
  EXPECT_TRUE(attention_runs_whole_window(automatic, 32, 16, 32, 8));
  // DFlash2's block of 8: 2 m-tiles per pair, so batch 64.
  EXPECT_FALSE(attention_runs_whole_window(automatic, 32, 8, 32, 8));
  EXPECT_TRUE(attention_runs_whole_window(automatic, 64, 8, 32, 8));
  // A partial m-tile counts as a warp: 5 rows per pair.
  EXPECT_TRUE(attention_runs_whole_window(automatic, 1024, 5, 1, 1));
  const AttentionChoice on = resolve_kernel_plan({{"attention_whole_window", "on"}}, 128).attention;
  const AttentionChoice off = resolve_kernel_plan({{"attention_whole_window", "off"}}, 128).attention;
  EXPECT_TRUE(attention_runs_whole_window(on, 1, 16, 32, 8));
  EXPECT_FALSE(attention_runs_whole_window(off, 64, 16, 32, 8));
  EXPECT_FALSE(attention_runs_whole_window(resolve_kernel_plan({{"attention", "generic"}}, 128).attention, 64, 16, 32, 8));
  EXPECT_EQ(harness_error_message([] { resolve_kernel_plan({{"attention_whole_window", "always"}}, 128); }),
            "CUDA kernels: attention_whole_window=always is not a setting (auto, on, off)");
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
  EXPECT_EQ(resolve_kernel_plan({{"gemm_cols", "auto"}}, 128).gemm_columns, 0);
  EXPECT_EQ(harness_error_message([] { resolve_kernel_plan({{"gemm_cols", "48"}}, 128); }),
            "CUDA kernels: gemm_cols=48 is not a width (auto, 32, 64, 96, 128)");
  EXPECT_EQ(harness_error_message([] { resolve_kernel_plan({{"pdl", "maybe"}}, 128); }),
            "CUDA kernels: pdl=maybe is not a setting (auto, on, off)");

  // gemm_m64: the libraries from 64 block rows by default (each only if the drafter found it
  // usable), the mma kernel below and under gemm_m64=mma; gemm=cublaslt / simple override it.
  EXPECT_TRUE(d.block_library);
  EXPECT_EQ(d.block_kernel(63, e4m3), GemmKernel::kMma);
  EXPECT_EQ(d.block_kernel(64, e4m3), GemmKernel::kCutlass);
  EXPECT_EQ(d.block_kernel(64, bf16), GemmKernel::kCublasLt);
  EXPECT_EQ(d.block_kernel(1, bf16), GemmKernel::kMma);
  KernelPlan no_cutlass = d;
  no_cutlass.cutlass_usable = false;
  EXPECT_EQ(no_cutlass.block_kernel(512, e4m3), GemmKernel::kMma);
  EXPECT_EQ(no_cutlass.block_kernel(512, bf16), GemmKernel::kCublasLt);
  const KernelPlan bitwise = resolve_kernel_plan({{"gemm_m64", "mma"}}, 128);
  EXPECT_FALSE(bitwise.block_library);
  EXPECT_EQ(bitwise.block_kernel(512, e4m3), GemmKernel::kMma);
  EXPECT_EQ(bitwise.block_kernel(512, bf16), GemmKernel::kMma);
  EXPECT_TRUE(resolve_kernel_plan({{"gemm_m64", "auto"}}, 128).block_library);
  EXPECT_EQ(p.block_kernel(1, e4m3), GemmKernel::kCublasLt);
  EXPECT_EQ(resolve_kernel_plan({{"gemm", "simple"}}, 128).block_kernel(512, e4m3), GemmKernel::kSimple);
  EXPECT_EQ(harness_error_message([] { resolve_kernel_plan({{"gemm_m64", "fast"}}, 128); }),
            "CUDA kernels: gemm_m64=fast is not a choice (library, mma)");
  std::string large, invariance;
  for (const auto& [k, v] : describe_kernel_plan(d, true)) {
    if (k == "kernel.gemm_m64") large = v;
    if (k == "batch_invariance") invariance = v;
  }
  EXPECT_EQ(large, "library from 64 block rows: cutlass (mixed-input wgmma) for E4M3 weights, cublaslt for bf16 weights");
  EXPECT_NE(invariance.find("within a rounding bound from there"), std::string::npos) << invariance;
  for (const auto& [k, v] : describe_kernel_plan(bitwise, true)) {
    if (k == "kernel.gemm_m64") {
      EXPECT_EQ(v, "mma (every row count)");
    }
    if (k == "batch_invariance") {
      EXPECT_EQ(v.find("bitwise for block rows (own kernels"), 0u) << v;
    }
  }

  GemmKernel parsed = GemmKernel::kMma;
  EXPECT_TRUE(parse_gemm_kernel("simple", &parsed));
  EXPECT_EQ(parsed, GemmKernel::kSimple);
  EXPECT_FALSE(parse_gemm_kernel("cublas", &parsed));  // an alias of the plan, not a kernel name
}

TEST(KernelPlan, UnknownStagesAndKernelsAreRefusedByName) {
  EXPECT_NE(harness_error_message([] { resolve_kernel_plan({{"gemmm", "mma"}}, 64); }).find("gemmm"), std::string::npos);
  EXPECT_NE(harness_error_message([] { resolve_kernel_plan({{"gemm", "fast"}}, 64); }).find("gemm=fast"), std::string::npos);
  EXPECT_NE(harness_error_message([] { resolve_kernel_plan({{"attention", "flash"}}, 64); }).find("flash"), std::string::npos);
  EXPECT_NE(harness_error_message([] { resolve_kernel_plan({{"swiglu", "maybe"}}, 64); }).find("swiglu"), std::string::npos);
  EXPECT_EQ(harness_error_message([] { resolve_kernel_plan({{"selector_topk", "radix"}}, 64); }),
            "CUDA kernels: selector_topk=radix is not a kernel (threshold, plain)");
  EXPECT_EQ(harness_error_message([] { resolve_kernel_plan({{"gemm_epilogue", "scalar"}}, 64); }),
            "CUDA kernels: gemm_epilogue=scalar is not a kernel (vector, warp)");
  // Designs that were measured and removed are not levers any more: asking for one is an error
  // naming it, not a silent default.
  for (const auto& [stage, value] :
       std::vector<std::pair<std::string, std::string>>{{"gemm_pipeline", "ring"},  {"gemm_trigger", "start"},
                                                        {"gemm_solo_smem", "full"}, {"layer_chain", "on"},
                                                        {"ablate", "rmsnorm"}}) {
    EXPECT_EQ(harness_error_message([&] { resolve_kernel_plan({{stage, value}}, 128); }),
              "CUDA kernels: unknown stage '" + stage +
                  "' (gemm, gemm_m64, ctx_gemm, attention, attention_pass_ctas, attention_walk_ctas, attention_whole_window, "
                  "rmsnorm, qk_norm_rope, "
                  "swiglu, argmax, gemm_cols, gemm_cols_m64, gemm_epilogue, cutlass_tile, selector_topk, pdl)");
  }
  EXPECT_EQ(harness_error_message([] { resolve_kernel_plan({{"gemm", "mma-splitk"}}, 128); }),
            "CUDA kernels: gemm=mma-splitk is not a kernel (mma, cublaslt, simple)");
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
