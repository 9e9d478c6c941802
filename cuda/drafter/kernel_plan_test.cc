// CPU-side tests of the CUDA drafter (they run in CI, where there is no GPU): the lever table and
// its parsing, errors and description, the plan's rules, the attention dispatch and its head_dim
// check, the environment, and the refusal without a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tests/support/harness_error.h"
#include "core/error.h"
#include "cuda/kernels/attention/attention.h"
#include "cuda/drafter/cuda_drafter.h"
#include "cuda/drafter/device_weights.h"
#include "cuda/drafter/kernel_plan.h"
#include "cuda/drafter/levers.h"
#include "fixtures/fixture.h"
#include "testing/source_dir.h"

namespace dflash {
namespace {

using testing::harness_error_message;

// The mma kernel's CTA width at m <= 16: by shape under auto (wide only for wide weights), the
// requested 32 or 64 (others are an internal error), and always 32 above 16 rows (64-row tiles).
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
  EXPECT_EQ(gemm_mma_columns(64, 16, 4096, e4m3, 132), 64);   // requested: taken
  EXPECT_EQ(gemm_mma_columns(64, 16, 4096, bf16, 132), 64);
  EXPECT_EQ(gemm_mma_columns(32, 16, 151936, e4m3, 132), 32);
  EXPECT_EQ(gemm_mma_columns(64, 64, 151936, e4m3, 132), 32);
  for (int removed : {96, 128, 48}) {
    testing::expect_mentions(
        harness_error_message([&] { gemm_mma_columns(removed, 16, 4096, e4m3, 132); }, ErrorKind::kInternal),
        "no CTA width of " + std::to_string(removed) + " columns (32, 64)");
  }
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

// Every lever and its values, in the table's order; the default (what KernelPlan{} holds) first.
const std::vector<std::pair<std::string, std::vector<std::string>>> kLevers = {
    {"gemm", {"mma", "cublaslt", "simple"}},
    {"gemm_m64", {"library", "mma"}},
    {"ctx_gemm", {"mma", "auto", "cublaslt", "simple"}},
    {"attention", {"auto", "tuned", "generic", "simple"}},
    {"attention_walk_ctas", {"auto", "off"}},
    {"attention_whole_window", {"auto", "on", "off"}},
    {"rmsnorm", {"tuned", "simple"}},
    {"qk_norm_rope", {"tuned", "simple"}},
    {"swiglu", {"fused", "separate"}},
    {"argmax", {"fused", "separate"}},
    {"gemm_cols", {"auto", "32", "64"}},
    {"gemm_cols_m64", {"auto", "32", "64"}},
    {"gemm_epilogue", {"vector", "warp"}},
    {"cutlass_tile", {"auto", "128", "256"}},
    {"w8a8_m64", {"cublaslt", "cutlass"}},
    {"selector_topk", {"threshold", "plain"}},
    {"pdl", {"on", "off"}},
};
const char* const kStageList =
    "gemm, gemm_m64, ctx_gemm, attention, attention_walk_ctas, attention_whole_window, rmsnorm, qk_norm_rope, "
    "swiglu, argmax, gemm_cols, gemm_cols_m64, gemm_epilogue, cutlass_tile, w8a8_m64, selector_topk, pdl";

TEST(Levers, TheTableHoldsEveryLeverWithItsDefaultFirst) {
  const std::vector<Lever>& table = lever_table();
  ASSERT_EQ(table.size(), kLevers.size());
  const KernelPlan defaults;
  for (size_t i = 0; i < table.size(); ++i) {
    EXPECT_EQ(table[i].stage(), kLevers[i].first);
    std::vector<std::string> names;
    for (const Lever::Option& o : table[i].options()) {
      names.push_back(o.name);
      EXPECT_FALSE(o.meaning.empty()) << table[i].stage() << "=" << o.name;
    }
    EXPECT_EQ(names, kLevers[i].second) << table[i].stage();
    EXPECT_EQ(table[i].held(defaults).name, kLevers[i].second.front()) << table[i].stage();
    EXPECT_FALSE(table[i].chooses().empty());
  }
}

// Each value of each lever, alone, sets its typed field (and only its lever: every other lever
// still holds its default). The cases cover the table: a value without a case fails.
TEST(Levers, EveryValueParsesToItsTypedValue) {
  using P = const KernelPlan&;
  const std::vector<std::tuple<std::string, std::string, std::function<bool(P)>>> cases = {
      {"gemm", "mma", [](P p) { return p.block_gemm == GemmKernel::kMma; }},
      {"gemm", "cublaslt", [](P p) { return p.block_gemm == GemmKernel::kCublasLt; }},
      {"gemm", "simple", [](P p) { return p.block_gemm == GemmKernel::kSimple; }},
      {"gemm_m64", "library", [](P p) { return p.block_library; }},
      {"gemm_m64", "mma", [](P p) { return !p.block_library; }},
      {"ctx_gemm", "mma", [](P p) { return p.ctx_gemm == ContextGemm::kMma; }},
      {"ctx_gemm", "auto", [](P p) { return p.ctx_gemm == ContextGemm::kAuto; }},
      {"ctx_gemm", "cublaslt", [](P p) { return p.ctx_gemm == ContextGemm::kCublasLt; }},
      {"ctx_gemm", "simple", [](P p) { return p.ctx_gemm == ContextGemm::kSimple; }},
      {"attention", "auto",
       [](P p) { return p.attention_request == AttentionRequest::kAuto && p.attention.kernel == AttentionKernel::kTuned; }},
      {"attention", "tuned",
       [](P p) { return p.attention_request == AttentionRequest::kTuned && p.attention.kernel == AttentionKernel::kTuned; }},
      {"attention", "generic",
       [](P p) {
         return p.attention_request == AttentionRequest::kGeneric && p.attention.kernel == AttentionKernel::kGeneric;
       }},
      {"attention", "simple",
       [](P p) { return p.attention_request == AttentionRequest::kSimple && p.attention.kernel == AttentionKernel::kSimple; }},
      {"attention_walk_ctas", "auto", [](P p) { return p.attention_walk_ctas == 0 && p.attention.walk_ctas == 0; }},
      {"attention_walk_ctas", "off", [](P p) { return p.attention_walk_ctas == -1 && p.attention.walk_ctas == -1; }},
      {"attention_whole_window", "auto", [](P p) { return p.attention.whole_window == WholeWindow::kAuto; }},
      {"attention_whole_window", "on", [](P p) { return p.attention.whole_window == WholeWindow::kOn; }},
      {"attention_whole_window", "off", [](P p) { return p.attention.whole_window == WholeWindow::kOff; }},
      {"rmsnorm", "tuned", [](P p) { return p.rmsnorm == RowKernel::kTuned; }},
      {"rmsnorm", "simple", [](P p) { return p.rmsnorm == RowKernel::kSimple; }},
      {"qk_norm_rope", "tuned", [](P p) { return p.qk_norm_rope == RowKernel::kTuned; }},
      {"qk_norm_rope", "simple", [](P p) { return p.qk_norm_rope == RowKernel::kSimple; }},
      {"swiglu", "fused", [](P p) { return p.swiglu_fused; }},
      {"swiglu", "separate", [](P p) { return !p.swiglu_fused; }},
      {"argmax", "fused", [](P p) { return p.argmax_fused; }},
      {"argmax", "separate", [](P p) { return !p.argmax_fused; }},
      {"gemm_cols", "auto", [](P p) { return p.gemm_columns == 0; }},
      {"gemm_cols", "32", [](P p) { return p.gemm_columns == 32; }},
      {"gemm_cols", "64", [](P p) { return p.gemm_columns == 64; }},
      {"gemm_cols_m64", "auto", [](P p) { return p.gemm_columns_m64 == 0; }},
      {"gemm_cols_m64", "32", [](P p) { return p.gemm_columns_m64 == 32; }},
      {"gemm_cols_m64", "64", [](P p) { return p.gemm_columns_m64 == 64; }},
      {"gemm_epilogue", "vector", [](P p) { return p.gemm_epilogue == EpilogueKernel::kVector; }},
      {"gemm_epilogue", "warp", [](P p) { return p.gemm_epilogue == EpilogueKernel::kWarp; }},
      {"cutlass_tile", "auto", [](P p) { return p.cutlass_tile_rows == 0; }},
      {"cutlass_tile", "128", [](P p) { return p.cutlass_tile_rows == 128; }},
      {"cutlass_tile", "256", [](P p) { return p.cutlass_tile_rows == 256; }},
      {"w8a8_m64", "cublaslt", [](P p) { return !p.w8a8_cutlass; }},
      {"w8a8_m64", "cutlass", [](P p) { return p.w8a8_cutlass; }},
      {"selector_topk", "threshold", [](P p) { return p.selector_topk == SelectorTopK::kThreshold; }},
      {"selector_topk", "plain", [](P p) { return p.selector_topk == SelectorTopK::kPlain; }},
      {"pdl", "on", [](P p) { return p.pdl; }},
      {"pdl", "off", [](P p) { return !p.pdl; }},
  };
  const KernelPlan defaults = resolve_kernel_plan({}, 128);
  size_t covered = 0;
  for (const auto& [stage, value, holds] : cases) {
    const KernelPlan p = resolve_kernel_plan({{stage, value}}, 128);
    EXPECT_TRUE(holds(p)) << stage << "=" << value;
    EXPECT_FALSE(holds(defaults) && value != find_lever(stage).held(defaults).name) << stage << "=" << value;
    EXPECT_EQ(find_lever(stage).held(p).name, value);
    for (const Lever& other : lever_table()) {
      if (other.stage() != stage) {
        EXPECT_EQ(other.held(p).name, other.held(defaults).name) << stage << "=" << value;
      }
    }
    for (const auto& [lever, values] : kLevers) {
      if (lever == stage) covered += std::count(values.begin(), values.end(), value);
    }
  }
  size_t values = 0;
  for (const auto& lever : kLevers) values += lever.second.size();
  EXPECT_EQ(covered, values);
  EXPECT_EQ(cases.size(), values);
}

// Aliases, values auto never picks, designs measured slower and removed stages are not levers:
// each is refused naming it and listing what the table has.
TEST(Levers, AliasesAndRemovedValuesAreRefusedWithTheTablesList) {
  const std::vector<std::tuple<std::string, std::string, std::string>> refused = {
      {"gemm", "auto", "mma, cublaslt, simple"},          {"gemm", "small-m", "mma, cublaslt, simple"},
      {"gemm", "fp8-small-m", "mma, cublaslt, simple"},   {"gemm", "bf16-small-m", "mma, cublaslt, simple"},
      {"gemm", "cublas", "mma, cublaslt, simple"},        {"gemm", "mma-splitk", "mma, cublaslt, simple"},
      {"gemm_m64", "auto", "library, mma"},               {"ctx_gemm", "cublas", "mma, auto, cublaslt, simple"},
      {"attention", "flash", "auto, tuned, generic, simple"},
      {"rmsnorm", "auto", "tuned, simple"},               {"qk_norm_rope", "auto", "tuned, simple"},
      {"swiglu", "simple", "fused, separate"},            {"swiglu", "auto", "fused, separate"},
      {"argmax", "simple", "fused, separate"},            {"argmax", "auto", "fused, separate"},
      {"gemm_cols", "96", "auto, 32, 64"},                {"gemm_cols", "128", "auto, 32, 64"},
      {"gemm_cols", "48", "auto, 32, 64"},                {"gemm_cols_m64", "128", "auto, 32, 64"},
      {"gemm_epilogue", "auto", "vector, warp"},          {"gemm_epilogue", "scalar", "vector, warp"},
      {"cutlass_tile", "64", "auto, 128, 256"},           {"selector_topk", "auto", "threshold, plain"},
      {"selector_topk", "radix", "threshold, plain"},     {"pdl", "auto", "on, off"},
      {"pdl", "maybe", "on, off"},                        {"attention_whole_window", "always", "auto, on, off"},
  };
  for (const auto& [stage, value, list] : refused) {
    EXPECT_EQ(harness_error_message([&] { resolve_kernel_plan({{stage, value}}, 128); }),
              "CUDA kernels: " + stage + "=" + value + " is not a value of " + stage + " (" + list + ")");
  }
  for (const char* count : {"1", "2", "3", "4", "6", "8", "16"}) {  // walks that were exploration only
    EXPECT_EQ(harness_error_message([&] { resolve_kernel_plan({{"attention_walk_ctas", count}}, 128); }),
              std::string("CUDA kernels: attention_walk_ctas=") + count +
                  " is not a value of attention_walk_ctas (auto, off)");
  }
  // attention_pass_ctas (measured slower everywhere), the stage alias rope, and designs that were
  // measured and removed long ago: unknown stages.
  for (const auto& [stage, value] : std::vector<std::pair<std::string, std::string>>{
           {"attention_pass_ctas", "2"}, {"rope", "simple"},        {"gemmm", "mma"},
           {"gemm_pipeline", "ring"},    {"gemm_trigger", "start"}, {"gemm_solo_smem", "full"},
           {"layer_chain", "on"},        {"ablate", "rmsnorm"}}) {
    EXPECT_EQ(harness_error_message([&] { resolve_kernel_plan({{stage, value}}, 128); }),
              "CUDA kernels: unknown stage '" + stage + "' (" + kStageList + ")");
  }
  GemmKernel parsed = GemmKernel::kMma;
  EXPECT_TRUE(parse_gemm_kernel("simple", &parsed));
  EXPECT_EQ(parsed, GemmKernel::kSimple);
  EXPECT_FALSE(parse_gemm_kernel("cublas", &parsed));
}

// describe() lists every lever of the table in its order ("kernel.<stage>": the value, what it
// runs, what the plan resolved), then the fallbacks and the batch invariance.
TEST(Levers, DescribeListsEveryLeverFromTheTable) {
  const KernelPlan d = resolve_kernel_plan({}, 128);
  const auto described = describe_kernel_plan(d, false);
  std::vector<std::string> keys;
  for (const auto& [key, value] : described) keys.push_back(key);
  std::vector<std::string> expected;
  for (const auto& lever : kLevers) expected.push_back("kernel." + lever.first);
  expected.push_back("fallbacks");
  expected.push_back("batch_invariance");
  EXPECT_EQ(keys, expected);
  auto value_of = [](const std::vector<std::pair<std::string, std::string>>& d, const std::string& key) {
    for (const auto& [k, v] : d) {
      if (k == key) return v;
    }
    return std::string("(absent)");
  };
  EXPECT_EQ(value_of(described, "kernel.attention"),
            "auto: tuned for head_dim 64, 128 and 256, generic otherwise; here: tuned-d128 (split-KV, runs of chunks "
            "per CTA past one wave; whole-window from 1024 warps)");
  EXPECT_EQ(value_of(described, "kernel.gemm_m64"),
            "library: CUTLASS's mixed-input wgmma GEMM for E4M3 weights (w8a8: w8a8_m64), cuBLASLt for bf16 weights, "
            "each where usable (a sequence's results then change with its batch within a rounding bound); here: cutlass for E4M3 "
            "weights, cublaslt for bf16 weights");
  EXPECT_EQ(value_of(described, "fallbacks"), "none");
  EXPECT_NE(value_of(described, "batch_invariance").find("within a rounding bound from there"), std::string::npos);
  // Every value shows as "<value>: ..." under its lever.
  for (const auto& [stage, values] : kLevers) {
    for (const std::string& value : values) {
      const std::string shown = value_of(describe_kernel_plan(resolve_kernel_plan({{stage, value}}, 64), false), "kernel." + stage);
      EXPECT_EQ(shown.rfind(value + ": ", 0), 0u) << stage << "=" << value << ": " << shown;
    }
  }
  KernelPlan no_cutlass = d;
  no_cutlass.cutlass_usable = false;
  EXPECT_NE(value_of(describe_kernel_plan(no_cutlass, false), "kernel.gemm_m64").find("here: mma for E4M3 weights, cublaslt"),
            std::string::npos);
  EXPECT_EQ(value_of(describe_kernel_plan(resolve_kernel_plan({{"gemm", "simple"}}, 128), false), "kernel.gemm_m64"),
            "library: CUTLASS's mixed-input wgmma GEMM for E4M3 weights (w8a8: w8a8_m64), cuBLASLt for bf16 weights, "
            "each where usable (a sequence's results then change with its batch within a rounding bound); here: unused: gemm=simple");
  // A plan holding a value the table lacks (a fallback gone wrong) is an internal error, not "?".
  KernelPlan odd = d;
  odd.gemm_columns = 96;
  harness_error_message([&] { describe_kernel_plan(odd, false); }, ErrorKind::kInternal);
}

// What the plan's rules make of the lever values: the GEMM kernel per row count and format, the
// attention's form per batch, the batch-invariance statement.
TEST(KernelPlan, TheRulesFollowTheLevers) {
  const WeightFormat e4m3 = WeightFormat::kE4M3, bf16 = WeightFormat::kBf16;
  const KernelPlan d = resolve_kernel_plan({}, 128);
  EXPECT_EQ(d.attention.compiled_head_dim, 128);
  EXPECT_EQ(d.ctx_kernel(65, bf16), GemmKernel::kMma);  // own kernel by default: bitwise batch invariance
  EXPECT_EQ(d.ctx_kernel(1024, e4m3), GemmKernel::kMma);
  // ctx_gemm=auto hands bf16 context GEMMs of more than 64 rows to cuBLASLt, E4M3 ones never.
  const KernelPlan a = resolve_kernel_plan({{"ctx_gemm", "auto"}}, 128);
  EXPECT_EQ(a.ctx_kernel(64, bf16), GemmKernel::kMma);
  EXPECT_EQ(a.ctx_kernel(65, bf16), GemmKernel::kCublasLt);
  EXPECT_EQ(a.ctx_kernel(256, e4m3), GemmKernel::kMma);
  EXPECT_TRUE(a.uses_cublaslt());
  EXPECT_EQ(resolve_kernel_plan({{"ctx_gemm", "simple"}}, 128).ctx_kernel(1, bf16), GemmKernel::kSimple);
  EXPECT_EQ(resolve_kernel_plan({{"ctx_gemm", "cublaslt"}}, 128).ctx_kernel(1, e4m3), GemmKernel::kCublasLt);
  EXPECT_TRUE(resolve_kernel_plan({{"ctx_gemm", "cublaslt"}}, 128).cublaslt_reads_e4m3(true));
  EXPECT_FALSE(a.cublaslt_reads_e4m3(true));
  const KernelPlan lt = resolve_kernel_plan({{"gemm", "cublaslt"}}, 128);
  EXPECT_TRUE(lt.cublaslt_reads_e4m3(true));
  EXPECT_FALSE(lt.cublaslt_reads_e4m3(false));
  EXPECT_EQ(lt.block_kernel(1, e4m3), GemmKernel::kCublasLt);
  EXPECT_FALSE(resolve_kernel_plan({{"gemm_m64", "mma"}, {"gemm", "simple"}}, 128).uses_cublaslt());

  // gemm_m64: the libraries from 64 block rows by default (each only if the drafter found it
  // usable), the mma kernel below and under gemm_m64=mma; gemm=cublaslt / simple override it.
  EXPECT_EQ(d.block_kernel(63, e4m3), GemmKernel::kMma);
  EXPECT_EQ(d.block_kernel(64, e4m3), GemmKernel::kCutlass);
  EXPECT_EQ(d.block_kernel(64, bf16), GemmKernel::kCublasLt);
  EXPECT_EQ(d.block_kernel(1, bf16), GemmKernel::kMma);
  KernelPlan no_cutlass = d;
  no_cutlass.cutlass_usable = false;
  EXPECT_EQ(no_cutlass.block_kernel(512, e4m3), GemmKernel::kMma);
  EXPECT_EQ(no_cutlass.block_kernel(512, bf16), GemmKernel::kCublasLt);
  const KernelPlan bitwise = resolve_kernel_plan({{"gemm_m64", "mma"}}, 128);
  EXPECT_EQ(bitwise.block_kernel(512, e4m3), GemmKernel::kMma);
  EXPECT_EQ(bitwise.block_kernel(512, bf16), GemmKernel::kMma);
  EXPECT_EQ(resolve_kernel_plan({{"gemm", "simple"}}, 128).block_kernel(512, e4m3), GemmKernel::kSimple);
  for (const auto& [k, v] : describe_kernel_plan(bitwise, false)) {
    if (k == "batch_invariance") {
      EXPECT_EQ(v.find("bitwise for block rows (own kernels"), 0u) << v;
    }
  }
  for (const auto& [k, v] : describe_kernel_plan(lt, false)) {
    if (k == "batch_invariance") {
      EXPECT_EQ(v.find("within a rounding bound: cuBLASLt"), 0u) << v;
    }
  }
  // w8a8's E4M3 GEMMs go to cuBLASLt from one row whatever the bf16 plan says, block and context rows
  // alike; gemm=simple and ctx_gemm=simple keep both bitwise.
  const auto invariance = [](const KernelPlan& plan, bool w8a8) {
    for (const auto& [k, v] : describe_kernel_plan(plan, w8a8)) {
      if (k == "batch_invariance") return v;
    }
    return std::string("(absent)");
  };
  const std::string w8a8 = invariance(resolve_kernel_plan({{"gemm_m64", "mma"}}, 128), true);
  EXPECT_EQ(w8a8.find("within a rounding bound: w8a8's E4M3 GEMMs run on cuBLASLt from one block row"), 0u) << w8a8;
  EXPECT_EQ(w8a8.find(" and on CUTLASS"), std::string::npos) << w8a8;
  EXPECT_NE(w8a8.find("; context rows within a rounding bound (w8a8's k|v on cuBLASLt"), std::string::npos) << w8a8;
  // w8a8_m64=cutlass sends w8a8's block GEMMs of 64 rows and more to CUTLASS's FP8 GEMM; the default
  // keeps them on cuBLASLt.
  EXPECT_EQ(invariance(resolve_kernel_plan({}, 128), true).find(" and on CUTLASS"), std::string::npos);
  const KernelPlan cutlass = resolve_kernel_plan({{"w8a8_m64", "cutlass"}}, 128);
  const std::string w8a8_library = invariance(cutlass, true);
  EXPECT_NE(w8a8_library.find("on cuBLASLt from one block row and on CUTLASS from 64"), std::string::npos)
      << w8a8_library;
  EXPECT_EQ(cutlass.w8a8_block_kernel(64), GemmKernel::kCutlass);
  EXPECT_EQ(cutlass.w8a8_block_kernel(63), GemmKernel::kMma);
  EXPECT_EQ(resolve_kernel_plan({}, 128).w8a8_block_kernel(512), GemmKernel::kMma);
  EXPECT_EQ(resolve_kernel_plan({{"w8a8_m64", "cutlass"}, {"gemm_m64", "mma"}}, 128).w8a8_block_kernel(512),
            GemmKernel::kMma);
  EXPECT_EQ(invariance(resolve_kernel_plan({{"gemm", "simple"}, {"ctx_gemm", "simple"}}, 128), true),
            "bitwise for block rows (the plain kernels, k order); context rows bitwise");

  // The attention's description and form: whole-window from 1024 warps under auto; on and off hold
  // at every batch; off for the walk keeps one CTA per chunk.
  EXPECT_EQ(resolve_kernel_plan({{"attention_walk_ctas", "off"}, {"attention_whole_window", "off"}}, 128).attention.name(),
            "tuned-d128 (split-KV)");
  EXPECT_EQ(resolve_kernel_plan({{"attention_whole_window", "on"}}, 64).attention.name(), "tuned-d64 (whole-window)");
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

  // gemm_cols_m64's width rule: 64 columns at m > 16 exist for E4M3 weights only.
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
  setenv("DFLASH_CUDA_KERNELS", "gemm=cublaslt,attention=simple", 1);
  setenv("DFLASH_CUDA_PRECISION", "bf16", 1);
  const CudaOptions o = base.with_environment();
  EXPECT_FALSE(o.graphs);
  EXPECT_EQ(o.warmup, 5);
  EXPECT_EQ(o.kernels.at("gemm"), "cublaslt");
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

// A pre-quantized FP8 checkpoint runs in every mode: its stored weights are quantized per row on the
// host and its static activation scales become per-projection parts, so nothing is refused before
// the device is touched (on a machine without one, the device check is what refuses).
TEST(CudaDrafterFp8, PreQuantizedCheckpointsAreNotRefusedBeforeTheDevice) {
  std::string why;
  if (cuda_device_available(&why)) GTEST_SKIP() << "a device is present: the GPU gate replays these fixtures";
  for (const char* name : {"ct-gqa", "modelopt-mha"}) {
    SCOPED_TRACE(name);
    Fixture f = read_fixture(std::string(DFLASH_SOURCE_DIR) + "/fixtures/fp8ckpt/" + name);
    HeadSettings settings = f.head;
    auto weights = std::make_shared<DrafterWeights>(f.load_weights());
    for (Precision p : {Precision::kW8a8, Precision::kFp8, Precision::kBf16}) {
      settings.precision = p;
      const std::string error = harness_error_message(
          [&] { make_cuda_drafter(f.config, weights, settings, CudaOptions{}); }, ErrorKind::kUnsupported);
      EXPECT_EQ(error.find("CUDA drafter: " + why), 0u) << precision_name(p) << ": " << error;
    }
  }
}

// The activation parts of a row range of a fused weight (the context's k|v of q|k|v), counted from
// its first row; parts outside the range are dropped, a part across its edge is cut.
TEST(ActivationParts, OfARowRangeAreCutAndRebased) {
  // Each part as (first, count, static scale).
  auto parts = [](const std::vector<ActivationPart>& p) {
    std::vector<std::tuple<int64_t, int64_t, float>> out;
    for (const ActivationPart& a : p) out.emplace_back(a.first, a.count, a.static_scale);
    return out;
  };
  using Parts = std::vector<std::tuple<int64_t, int64_t, float>>;
  const std::vector<ActivationPart> qkv = {{0, 96, 0.5f}, {96, 32, 0.25f}, {128, 32, 0.0f}};
  EXPECT_EQ(parts(activation_parts_of_rows(qkv, 96, 64)), (Parts{{0, 32, 0.25f}, {32, 32, 0.0f}}));
  EXPECT_EQ(parts(activation_parts_of_rows(qkv, 80, 40)), (Parts{{0, 16, 0.5f}, {16, 24, 0.25f}}));
  EXPECT_TRUE(activation_parts_of_rows({}, 96, 64).empty());
}

}  // namespace
}  // namespace dflash
