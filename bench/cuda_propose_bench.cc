// Propose latency of the CUDA drafter at the Qwen3-8B-DFlash-b16 geometry (docs/spec/drafter.md §8), or
// another one (--geometry, e.g. Qwen3.8-27B-DFlash2 of docs/spec/dflash2.md §1), with random weights:
// block width the geometry's block, batch 1 / 8 / 16 / 32 / 64, context 1024 / 4096 positions already cached
// (the timed propose brings C = 0 new context rows), graphs on. Each number is the median of
// --replays graph replays of the block forward (embedding to draft tokens, nothing copied back),
// each timed with CUDA events after the warm-up proposes that capture the graph. --batches and
// --contexts pick a subset (the GPU gate's --sweep times batch 1 only, under several kernel levers).
// --without CLASSES times a graph of the same block forward without those kernel classes instead
// (testing/cuda_drafter_debug.h): what a class costs inside the graph is the time it saves. Last, the
// same drafter with the target's lm_head in NVFP4 at batch 1 and 8, context 1024 (--no-nvfp4-head
// leaves those rows out).
//
// Beside each time: the HBM floor, the bytes that must move (every projection weight and lm_head
// in the mode's storage format, the norms, DFlash2's convolution and selector weights and the
// codebook rows its walk reads, and the KV cache window read once) over the
// device-to-device copy bandwidth measured in the same run (bytes read + written per second), the
// ratio to it, and the same floor for bf16 weights. Then the compute floor, the propose's FLOPs
// (propose_flops) over the bf16 tensor-core peak of a large cuBLASLt GEMM measured in the same run
// (bench/gemm_peak.h: every mode multiplies in bf16), the roofline max(HBM floor, compute floor)
// and the ratio to it.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>

#include "bench/copy_bandwidth.h"
#include "bench/gemm_peak.h"
#include "core/error.h"
#include "cuda/runtime/cuda_check.h"
#include "testing/cuda_drafter_debug.h"
#include "cuda/runtime/device_buffer.h"
#include "fixtures/geometries.h"
#include "fixtures/random_drafter.h"

namespace dflash {
namespace {

struct Row {
  std::string precision;
  int batch = 0;
  int64_t context = 0;
  double median_us = 0, p10_us = 0, p90_us = 0;
  double floor_us = 0, bf16_floor_us = 0;
  double compute_floor_us = 0;
  double roofline_us() const { return std::max(floor_us, compute_floor_us); }
};

// Weight bytes of the block forward with bf16 storage: every projection and lm_head, 2 bytes each
// (DFlash2: the two kernel_projections per layer and hidden_projection; the fp32 base kernels).
int64_t bf16_weight_bytes(const DrafterConfig& c) {
  const int64_t h = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), inter = c.intermediate_size;
  int64_t per_layer = (q + 2 * kv) * h + h * q + 2 * inter * h + h * inter;
  const int64_t norms = static_cast<int64_t>(c.num_layers) * (2 * h + 2 * c.head_dim) * 4 + h * 4;
  int64_t dflash2 = 0;
  if (c.dflash2.enabled) {
    per_layer += 2 * int64_t{c.conv_coef_dim()} * h;
    dflash2 = 2 * int64_t{c.dflash2.selector_rank} * h + c.num_layers * 2 * (2 * int64_t{c.dflash2.conv_kernel_size} * h * 4);
  }
  return 2 * (c.num_layers * per_layer + static_cast<int64_t>(c.vocab_size) * h) + norms + dflash2;
}

// Bytes every propose reads beyond the weights: each layer's cached K and V over the positions it
// attends (a sliding layer at most W - 1 of them), and for DFlash2 the bf16 codebook rows of the
// walk (per mask row: K successor rows and at most K predecessor rows of r values).
int64_t per_batch_bytes(const DrafterConfig& c, int batch, int64_t context, int block) {
  int64_t positions = 0;
  for (int l = 0; l < c.num_layers; ++l) {
    const bool sliding = c.dflash2.enabled && c.dflash2.sliding[static_cast<size_t>(l)];
    positions += sliding ? std::min<int64_t>(context, c.dflash2.sliding_window - 1) : context;
  }
  int64_t bytes = positions * 2 * c.kv_dim() * 2;
  if (c.dflash2.enabled) bytes += int64_t{block - 1} * 2 * c.dflash2.selector_top_k * c.dflash2.selector_rank * 2;
  return static_cast<int64_t>(batch) * bytes;
}

// The FLOPs of one block forward (2 per multiply-add) of `batch` sequences of `width` block rows
// with `context` cached positions: every GEMM (q|k|v, o, gate|up, down per layer on batch·width
// rows; the lm_head on the batch·(width − 1) draft rows) and the attention's Q·Kᵀ and P·V for
// every query head over the window of context + width keys. Elementwise work is left out.
double propose_flops(const DrafterConfig& c, int batch, int width, int64_t context) {
  const double h = static_cast<double>(c.hidden_size), q = static_cast<double>(c.q_dim());
  const double kv = static_cast<double>(c.kv_dim()), inter = static_cast<double>(c.intermediate_size);
  const double rows = static_cast<double>(batch) * width, draft_rows = static_cast<double>(batch) * (width - 1);
  // DFlash2 adds each layer's two kernel_projections and, per draft row, hidden_projection.
  const double conv = c.dflash2.enabled ? 2.0 * c.conv_coef_dim() * h : 0.0;
  const double selector = c.dflash2.enabled ? draft_rows * c.dflash2.selector_rank * h : 0.0;
  const double per_layer_macs = rows * ((q + 2 * kv) * h + h * q + 2 * inter * h + h * inter + conv);
  const double keys = static_cast<double>(context + width);
  const double attention_macs = static_cast<double>(batch) * c.num_heads * 2.0 * width * keys * c.head_dim;
  return 2.0 * (c.num_layers * (per_layer_macs + attention_macs) + draft_rows * static_cast<double>(c.vocab_size) * h +
                selector);
}

// profile_one: only the first batch size asked for (1 by default) at context 1024, and after its
// timing one more graph replay between cudaProfilerStart/Stop, so `ncu --profile-from-start off`
// sees exactly one timed forward.
// without: kernel classes the timed graph leaves out (empty: the drafter's own graph).
std::vector<Row> run(const DrafterConfig& config, const std::shared_ptr<const DrafterWeights>& weights, int block,
                     Precision precision, double bandwidth, double peak_flops, int replays, bool profile_one,
                     const std::vector<int>& batch_list,
                     const std::vector<int64_t>& context_list, const std::set<std::string>& without) {
  const std::vector<int64_t> contexts = profile_one ? std::vector<int64_t>{1024} : context_list;
  const std::vector<int> batches = profile_one ? std::vector<int>{batch_list.front()} : batch_list;
  HeadSettings settings;
  settings.gamma = block;
  // The window holds the longest context asked for; the drafter refuses a pool past the KV limit
  // (docs/limits.md: batch 64 at 4096 positions is past it), naming it.
  settings.ctx_cap = *std::max_element(contexts.begin(), contexts.end());
  settings.max_batch = *std::max_element(batches.begin(), batches.end());
  settings.kv_page_size = 16;
  settings.precision = precision;
  CudaOptions options;
  options.graphs = true;
  options.warmup = 2;
  CudaDrafter drafter(config, weights, settings, options.with_environment());
  for (const auto& [k, v] : drafter.describe()) std::printf("  %-20s %s\n", k.c_str(), v.c_str());
  drafter.set_block_g(block);
  const int64_t width = config.ctx_feature_dim();
  const Tensor empty = Tensor::zeros({0, width});
  std::vector<Row> rows;
  int next_seq = 0;
  cudaEvent_t start, stop;
  DFLASH_CUDA_CHECK(cudaEventCreate(&start));
  DFLASH_CUDA_CHECK(cudaEventCreate(&stop));
  for (int64_t context : contexts) {
    const Tensor ctx = make_random_context(context, width, static_cast<uint64_t>(context));
    std::vector<int> seqs;
    std::vector<ProposeInput> ingest;
    for (int i = 0; i < settings.max_batch; ++i) {
      seqs.push_back(next_seq++);
      drafter.add_sequence(seqs.back());
      ingest.push_back({seqs.back(), &ctx, context, 100 + i});
    }
    const auto t0 = std::chrono::steady_clock::now();
    drafter.propose(ingest, false);  // caches `context` positions for every sequence
    std::printf("  ingested %d x %lld context rows in %.2f s\n", settings.max_batch, static_cast<long long>(context),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    for (int batch : batches) {
      std::vector<ProposeInput> inputs;
      for (int i = 0; i < batch; ++i) inputs.push_back({seqs[static_cast<size_t>(i)], &empty, context, 200 + i});
      for (int w = 0; w < options.warmup + 2; ++w) {
        const auto out = drafter.propose(inputs, false);  // eager warm-ups, then capture and a replay
        for (const ProposeOutput& o : out) {
          for (float v : o.logits.values) {
            if (!std::isfinite(v)) throw internal_error("benchmark: non-finite logit");
          }
        }
      }
      if (!drafter_graph_captured(drafter, block, batch)) throw internal_error("benchmark: no graph was captured");
      std::unique_ptr<BlockForwardWithout> partial;
      if (!without.empty()) partial = std::make_unique<BlockForwardWithout>(drafter, without);
      auto enqueue_forward = [&] {
        if (partial) {
          partial->enqueue();
        } else {
          enqueue_last_block_forward(drafter);
        }
      };
      cudaStream_t stream = drafter_stream(drafter);
      std::vector<float> times;
      for (int r = 0; r < replays; ++r) {
        DFLASH_CUDA_CHECK(cudaEventRecord(start, stream));
        enqueue_forward();
        DFLASH_CUDA_CHECK(cudaEventRecord(stop, stream));
        DFLASH_CUDA_CHECK(cudaEventSynchronize(stop));
        float ms = 0;
        DFLASH_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
        times.push_back(ms * 1000.0f);
      }
      if (profile_one) {
        DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
        DFLASH_CUDA_CHECK(cudaProfilerStart());
        enqueue_forward();
        DFLASH_CUDA_CHECK(cudaStreamSynchronize(stream));
        DFLASH_CUDA_CHECK(cudaProfilerStop());
        std::printf("  profiled one graph replay (batch %d, context %lld)\n", batch, static_cast<long long>(context));
      }
      std::sort(times.begin(), times.end());
      Row row;
      row.precision = precision_name(precision);
      row.batch = batch;
      row.context = context;
      row.median_us = times[times.size() / 2];
      row.p10_us = times[times.size() / 10];
      row.p90_us = times[times.size() * 9 / 10];
      const int64_t kv_bytes = per_batch_bytes(config, batch, context, block);
      row.floor_us = static_cast<double>(block_weight_bytes(drafter) + kv_bytes) / bandwidth * 1e6;
      row.bf16_floor_us = static_cast<double>(bf16_weight_bytes(config) + kv_bytes) / bandwidth * 1e6;
      row.compute_floor_us = propose_flops(config, batch, block, context) / peak_flops * 1e6;
      std::printf("  %-4s batch %2d ctx %4lld: median %8.1f us (p10 %.1f, p90 %.1f)  floor %7.1f us  x%.2f  bf16 floor %7.1f us  x%.2f"
                  "  compute floor %7.1f us  roofline %7.1f us  x%.2f\n",
                  row.precision.c_str(), batch, static_cast<long long>(context), row.median_us, row.p10_us, row.p90_us,
                  row.floor_us, row.median_us / row.floor_us, row.bf16_floor_us, row.median_us / row.bf16_floor_us,
                  row.compute_floor_us, row.roofline_us(), row.median_us / row.roofline_us());
      std::fflush(stdout);
      rows.push_back(row);
    }
    for (int seq : seqs) drafter.release_sequence(seq);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return rows;
}

int main_impl(int argc, char** argv) {
  CLI::App app{"CUDA drafter propose benchmark (random weights)"};
  std::string geometry = "qwen3-8b";
  app.add_option("--geometry", geometry, "qwen3-8b (default), qwen3-4b, gpt-oss-20b or qwen3.8-27b-dflash2");
  std::string markdown;
  int replays = 200;
  std::string precisions = "fp8,bf16";
  app.add_option("--markdown", markdown, "write the result table (markdown) to this file");
  app.add_option("--replays", replays, "timed graph replays per configuration (>= 100)")->check(CLI::Range(100, 100000));
  app.add_option("--precisions", precisions, "comma-separated: fp8, w8a8, bf16");
  std::vector<int> batches = {1, 8, 16, 32, 64};
  std::vector<int64_t> contexts = {1024};
  app.add_option("--batches", batches, "batch sizes (default 1 8 16 32 64)")->check(CLI::Range(1, 64));
  app.add_option("--contexts", contexts, "cached context positions (default 1024; 4096 fits batches up to 32)")->check(CLI::Range(1, 4096));
  std::string without_list;
  app.add_option("--without", without_list,
                 "time the block forward without these kernel classes, '+' between them (rmsnorm, qkv, qk_norm_rope, "
                 "attention_chunks, combine, o, gate_up, swiglu, down, lm_head, argmax; w8a8: act_quant; DFlash2: conv_coef, conv, "
                 "hidden_proj, selector_topk, selector_walk): TIMING ONLY");
  bool nvfp4_head = true;
  app.add_flag("!--no-nvfp4-head", nvfp4_head, "leave out the rows with the target's lm_head in NVFP4");
  bool profile_one = false;
  app.add_flag("--profile-one", profile_one,
               "only the first --batches value (default 1), context 1024; bracket one extra graph replay "
               "with cudaProfilerStart/Stop (for ncu --profile-from-start off)");
  CLI11_PARSE(app, argc, argv);
  const std::set<std::string> without = parse_kernel_classes(without_list);

  std::string why;
  if (!cuda_device_available(&why)) {
    std::fprintf(stderr, "cuda_propose_bench: %s\n", why.c_str());
    return 125;
  }
  cudaDeviceProp prop;
  DFLASH_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const double bandwidth = measure_copy_bandwidth(size_t{2} << 30, 20);  // 2 GiB, median of 20
  std::printf("device %s, %d SMs; device-to-device copy: %.0f GB/s (read + write)\n", prop.name, prop.multiProcessorCount,
              bandwidth / 1e9);
  const GemmPeak peak = measure_gemm_peak();
  const std::string e4m3_peak = peak.e4m3 > 0 ? std::to_string(static_cast<int>(peak.e4m3 / 1e12)) + " TFLOP/s"
                                              : "unavailable (" + peak.e4m3_unavailable + ")";
  std::printf("cuBLASLt GEMM peak (m = n = k = %lld): bf16 %.0f TFLOP/s (the compute floor's), e4m3 %s (w8a8's)\n",
              static_cast<long long>(peak.size), peak.bf16 / 1e12, e4m3_peak.c_str());
  const DrafterGeometry g =
      geometry == "qwen3.8-27b-dflash2" ? qwen3_8_27b_dflash2_geometry() : real_geometry(geometry, "--geometry");
  const DrafterConfig config = make_config(g);
  const auto t0 = std::chrono::steady_clock::now();
  const std::shared_ptr<const DrafterWeights> weights = make_random_weights(config, 1);
  std::printf("random weights in %.1f s\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());

  std::vector<Row> rows;
  for (const char* name : {"fp8", "w8a8", "bf16"}) {
    if (precisions.find(name) == std::string::npos) continue;
    Precision p;
    parse_precision(name, &p);
    std::printf("%s drafter:\n", name);
    // W8A8's GEMMs run on the E4M3 tensor cores: their peak is its compute floor's.
    const double peak_flops = p == Precision::kW8a8 && peak.e4m3 > 0 ? peak.e4m3 : peak.bf16;
    for (const Row& r : run(config, weights, g.block, p, bandwidth, peak_flops, replays, profile_one, batches, contexts,
                            without)) {
      rows.push_back(r);
    }
  }

  // The same drafter with the target's lm_head in NVFP4 (docs/spec/nvfp4-lm-head.md) in place of its
  // own: batch 1 and 8 at context 1024 (its floor counts the head's V·H·9/16 bytes).
  // Not for DFlash2: its selector reads a dense head (docs/spec/dflash2.md §2).
  if (nvfp4_head && !profile_one && !config.dflash2.enabled) {
    std::vector<int> nvfp4_batches;
    for (int b : {1, 8}) {
      if (std::find(batches.begin(), batches.end(), b) != batches.end()) nvfp4_batches.push_back(b);
    }
    const bool has_1024 = std::find(contexts.begin(), contexts.end(), int64_t{1024}) != contexts.end();
    if (!nvfp4_batches.empty() && has_1024) {
      auto with_head = std::make_shared<DrafterWeights>(*weights);
      with_head->lm_head = Tensor();
      with_head->lm_head_nvfp4 = make_random_nvfp4_head(config.vocab_size, config.hidden_size, 2);
      for (const char* name : {"fp8", "bf16"}) {
        if (precisions.find(name) == std::string::npos) continue;
        Precision p;
        parse_precision(name, &p);
        std::printf("%s drafter, NVFP4 lm_head:\n", name);
        for (Row r : run(config, with_head, g.block, p, bandwidth, peak.bf16, replays, false, nvfp4_batches, {1024},
                           without)) {
          r.precision += ", NVFP4 head";
          rows.push_back(r);
        }
      }
    }
  }

  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  std::string table;
  table += "Measured " + std::string(date) + " on " + prop.name + " (" + std::to_string(prop.multiProcessorCount) +
           " SMs); device-to-device copy bandwidth " + std::to_string(static_cast<int>(bandwidth / 1e9)) +
           " GB/s (read + write); cuBLASLt GEMM peak (m = n = k = " + std::to_string(peak.size) + ") bf16 " +
           std::to_string(static_cast<int>(peak.bf16 / 1e12)) + " TFLOP/s, the compute floor's, e4m3 " + e4m3_peak + " (w8a8's)" +
           ". " + g.name + " geometry, random weights, block width " + std::to_string(g.block) +
           ", C = 0 new context rows, "
           "median of " + std::to_string(replays) + " graph replays" +
           (without.empty() ? std::string(".\n\n")
                            : " of the block forward WITHOUT " + without_list + " (timing only, outputs wrong).\n\n");
  table += "| precision | batch | context | median µs | p10–p90 µs | HBM floor µs | × floor | bf16 floor µs | × bf16 floor "
           "| compute floor µs | roofline µs | x roofline |\n";
  table += "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const Row& r : rows) {
    char line[256];
    std::snprintf(line, sizeof line, "| %s | %d | %lld | %.1f | %.1f–%.1f | %.1f | %.2f | %.1f | %.2f | %.1f | %.1f | %.2f |\n",
                  r.precision.c_str(), r.batch, static_cast<long long>(r.context), r.median_us, r.p10_us, r.p90_us,
                  r.floor_us, r.median_us / r.floor_us, r.bf16_floor_us, r.median_us / r.bf16_floor_us,
                  r.compute_floor_us, r.roofline_us(), r.median_us / r.roofline_us());
    table += line;
  }
  std::printf("\n%s", table.c_str());
  if (!markdown.empty()) {
    std::ofstream out(markdown);
    out << table;
    if (!out) throw bad_input("cannot write " + markdown);
  }
  for (const Row& r : rows) {
    if (r.precision == "fp8" && r.batch == 1 && r.context == 1024) {
      const bool pass = r.median_us <= 1.5 * r.floor_us;
      std::printf("bar: fp8, batch 1, context 1024 within 1.5x its floor: %s (x%.2f)\n", pass ? "met" : "NOT met",
                  r.median_us / r.floor_us);
    }
    if (r.context == 1024 && ((r.precision == "fp8" && (r.batch == 8 || r.batch == 32)) ||
                              (r.precision == "bf16" && r.batch == 32))) {
      const bool pass = r.median_us <= 1.5 * r.roofline_us();
      std::printf("bar: %s, batch %d, context 1024 within 1.5x its roofline: %s (x%.2f)\n", r.precision.c_str(), r.batch,
                  pass ? "met" : "NOT met", r.median_us / r.roofline_us());
    }
  }
  return 0;
}

}  // namespace
}  // namespace dflash

int main(int argc, char** argv) { return dflash::run_program("cuda_propose_bench", dflash::main_impl, argc, argv); }
