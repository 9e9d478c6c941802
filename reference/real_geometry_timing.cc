// Times the reference drafter at a published drafter's geometry (docs/spec/drafter.md §8) with random
// weights: one sequence, a long prompt, then a steady-state propose with one new context row.
//   reference_real_geometry_timing --model qwen3-8b --precision fp32 --threads 16 --ctx 1024
#include <chrono>
#include <cstdio>
#include <map>
#include <string>

#include <CLI/CLI.hpp>

#include "core/error.h"
#include "fixtures/geometries.h"
#include "fixtures/random_drafter.h"
#include "fixtures/random_drafter.h"
#include "reference/reference_options.h"

namespace dflash {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

int run(int argc, char** argv) {
  std::string model = "qwen3-8b", precision_text = "fp32";
  int threads = 16, proposes = 2;
  int64_t ctx = 1024;
  CLI::App app{"Time the CPU reference drafter at a real geometry with random weights"};
  app.add_option("--model", model, "qwen3-8b, qwen3-4b or gpt-oss-20b");
  app.add_option("--precision", precision_text, "fp64, fp32, bf16 or fp8");
  app.add_option("--threads", threads, "reference threads");
  app.add_option("--ctx", ctx, "prompt rows of the first propose");
  app.add_option("--proposes", proposes, "proposes in total (after the first: one new context row each)");
  CLI11_PARSE(app, argc, argv);
  Precision precision;
  if (!parse_precision(precision_text, &precision)) throw bad_input("--precision: unknown '" + precision_text + "'");

  const DrafterConfig config = make_config(real_geometry(model, "--model"));
  auto t = std::chrono::steady_clock::now();
  auto weights = std::make_shared<const DrafterWeights>(make_random_drafter_weights(config, 1, unit_gain_weight_ranges(), threads));
  std::printf("%s: random weights in %.1f s\n", model.c_str(), seconds_since(t));
  HeadSettings head;
  head.gamma = config.block_size;
  head.ctx_cap = 4096;
  head.max_batch = 1;
  head.precision = precision;
  t = std::chrono::steady_clock::now();
  auto drafter = make_reference_drafter(config, weights, head, ReferenceOptions{threads});
  std::printf("drafter (%s, %d threads, target %s) built in %.1f s\n", precision_name(precision), threads,
              drafter->describe()[6].second.c_str(), seconds_since(t));
  drafter->add_sequence(0);
  int64_t start = 0;
  for (int i = 0; i < proposes; ++i) {
    const int64_t rows = i == 0 ? ctx : 1;
    const Tensor rows_tensor = make_random_context(rows, config.ctx_feature_dim(), static_cast<uint64_t>(start));
    start += rows;
    t = std::chrono::steady_clock::now();
    const auto out = drafter->propose({{0, &rows_tensor, start, 7}}, false);
    std::printf("propose %d: %lld new ctx rows, B = %d: %.2f s (first draft %d)\n", i, static_cast<long long>(rows),
                out[0].block_width, seconds_since(t), out[0].draft_tokens[0]);
  }
  return 0;
}

}  // namespace
}  // namespace dflash

int main(int argc, char** argv) { return dflash::run_program("reference_real_geometry_timing", dflash::run, argc, argv); }
