// The device work of one propose: context ingestion, the block forward (eager or graph), the
// copies back, and the taps.
#include <algorithm>
#include <cmath>
#include <functional>
#include <cstring>
#include <string>

#include "core/dtype.h"
#include "core/error.h"
#include "core/stages.h"
#include "cuda/kernels/attention/attention.h"
#include "cuda/runtime/cuda_check.h"
#include "cuda/drafter/cuda_drafter_impl.h"
#include "cuda/kernels/quant/fp8_quant.h"
#include "cuda/kernels/elementwise/elementwise.h"
#include "cuda/runtime/graph_capture.h"
#include "cuda/kernels/nvfp4/gemm_nvfp4.h"
#include "cuda/drafter/host_parallel.h"
#include "cuda/drafter/levers.h"
#include "cuda/tp/tp_reduce.h"
#include "cuda/tp/vocab_parallel.h"

namespace dflash {

// Collects taps (docs/spec/drafter.md §7) per sequence, in forward order. Each capture waits for the stream:
// taps run eager and cost nothing when they are off.
struct CudaDrafter::TapSink {
  cudaStream_t stream;
  int batch = 0, block_width = 0;
  std::vector<std::vector<Tap>> per_sequence;

  // The stage's values as `source` holds them, one tap per sequence: [rows, cols], or [rows,
  // row_shape...] (same element count).
  void capture(const std::string& name, const TapSource& source) {
    DFLASH_CUDA_CHECK(cudaStreamSynchronize(stream));
    const int64_t rows_per_seq = source.draft_rows ? block_width - 1 : block_width;
    const int64_t cols = source.cols, ld = source.ld;
    const void* device = source.buffer;
    const TapStorage storage = source.storage;
    const int64_t rows = batch * rows_per_seq;
    std::vector<float> values(static_cast<size_t>(rows * ld));
    if (storage == TapStorage::kBf16) {
      std::vector<uint16_t> bits(values.size());
      DFLASH_CUDA_CHECK(cudaMemcpy(bits.data(), device, bits.size() * 2, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < bits.size(); ++i) values[i] = bf16_bits_to_float(bits[i]);
    } else if (storage == TapStorage::kI32) {
      std::vector<int32_t> ints(values.size());
      DFLASH_CUDA_CHECK(cudaMemcpy(ints.data(), device, ints.size() * 4, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < ints.size(); ++i) values[i] = static_cast<float>(ints[i]);
    } else {
      DFLASH_CUDA_CHECK(cudaMemcpy(values.data(), device, values.size() * 4, cudaMemcpyDeviceToHost));
      if (storage == TapStorage::kF32ReadAsBf16) {
        for (float& v : values) v = bf16_bits_to_float(float_to_bf16_bits(v));
      }
    }
    std::vector<int64_t> shape = {rows_per_seq};
    if (source.row_shape.empty()) {
      shape.push_back(cols);
    } else {
      shape.insert(shape.end(), source.row_shape.begin(), source.row_shape.end());
    }
    for (int b = 0; b < batch; ++b) {
      Tensor t = Tensor::zeros(shape);
      for (int64_t r = 0; r < rows_per_seq; ++r) {
        std::copy_n(values.data() + (b * rows_per_seq + r) * ld, cols, t.values.data() + r * cols);
      }
      per_sequence[static_cast<size_t>(b)].push_back({name, std::move(t)});
    }
  }
};

void CudaDrafter::enqueue_gemm(bool pdl, GemmKernel kernel, const uint16_t* a, int64_t lda, int64_t m,
                               const DeviceMatrixView& w, const GemmEpilogue& epilogue,
                               const std::vector<ActivationPart>& parts) {
  GemmContext ctx = gemm_ctx_;
  ctx.pdl = pdl;
  if (!quantizes_activations(w)) {
    gemm(kernel, ctx, a, lda, m, w, epilogue);
    return;
  }
  // docs/spec/drafter.md §6: the input rows per token, or per projection with its static scale.
  if (parts.size() <= 1) {  // one projection: the whole weight, whatever its epilogue
    enqueue_activation_quantization(pdl, a, lda, m, w, one_part_scale(w, parts));
    enqueue_quantized_gemm(pdl, kernel, m, w, epilogue);
    return;
  }
  if (epilogue.swiglu_out != nullptr || epilogue.argmax_value != nullptr) {
    throw internal_error("w8a8: a GEMM of several activation parts finishes into plain outputs only");
  }
  for (const ActivationPart& part : parts) {  // one after the other: they share act_codes_
    enqueue_activation_quantization(pdl, a, lda, m, w, part.static_scale);
    GemmEpilogue columns = epilogue;
    if (columns.out != nullptr) columns.out += part.first;
    if (columns.residual != nullptr) columns.residual += part.first;
    enqueue_quantized_gemm(pdl, kernel, m, w.rows(part.first, part.count), columns);
  }
}

float CudaDrafter::one_part_scale(const DeviceMatrixView& w, const std::vector<ActivationPart>& parts) {
  if (parts.empty()) return 0.0f;
  if (parts.size() > 1 || parts[0].first != 0 || parts[0].count != w.n) {
    throw internal_error("w8a8: a weight's one activation part must span its rows");
  }
  return parts[0].static_scale;
}

void CudaDrafter::enqueue_activation_quantization(bool pdl, const uint16_t* a, int64_t lda, int64_t m,
                                                  const DeviceMatrixView& w, float static_scale) {
  launch_quantize_activations_e4m3(stream_, a, lda, m, w.k, w.k_pad, static_scale, act_codes_.get(), ld_act_codes_,
                                   act_scales_.get(), pdl);
}

void CudaDrafter::enqueue_quantized_gemm(bool pdl, GemmKernel kernel, int64_t m, const DeviceMatrixView& w,
                                         const GemmEpilogue& epilogue) {
  GemmContext ctx = gemm_ctx_;
  ctx.pdl = pdl;
  gemm_w8a8(kernel, ctx, act_codes_.get(), ld_act_codes_, m, w, act_scales_.get(), epilogue);
}

namespace {

// The first element where a second pass's floats differ from the judged pass's, bit for bit, as
// "what[r, c]: judged pass a, tapped pass b"; empty if nowhere.
std::string first_float_difference(const std::string& what, const float* judged, const float* tapped, int64_t rows,
                                   int64_t cols) {
  for (int64_t i = 0; i < rows * cols; ++i) {
    if (std::memcmp(judged + i, tapped + i, sizeof(float)) != 0) {
      return what + "[" + std::to_string(i / cols) + ", " + std::to_string(i % cols) + "]: judged pass " +
             std::to_string(judged[i]) + ", tapped pass " + std::to_string(tapped[i]);
    }
  }
  return "";
}

// Where a second pass differs from the judged pass: the fp32 residual stream after the last layer
// (an fp32 reordering, e.g. a reduction summed in another order under graphs, that no bf16 rounding
// downstream happened to flip), then the logits, then the draft tokens; empty if nowhere.
std::string first_pass_difference(const float* judged_h, const float* tapped_h, int64_t width, int64_t hidden,
                                  const float* judged_logits, const float* tapped_logits, const int32_t* judged_tokens,
                                  const int32_t* tapped_tokens, int64_t rows, int64_t vocab) {
  std::string difference =
      first_float_difference("residual stream h after the last layer", judged_h, tapped_h, width, hidden);
  if (difference.empty()) difference = first_float_difference("logits", judged_logits, tapped_logits, rows, vocab);
  for (int64_t r = 0; r < rows && difference.empty(); ++r) {
    if (judged_tokens[r] != tapped_tokens[r]) {
      difference = "draft token " + std::to_string(r) + ": judged pass " + std::to_string(judged_tokens[r]) +
                   ", tapped pass " + std::to_string(tapped_tokens[r]);
    }
  }
  return difference;
}

}  // namespace

std::vector<ProposeOutput> CudaDrafter::propose(const std::vector<ProposeInput>& batch, bool want_taps) {
  // Atomic: on any error (bad input, gap, overlap, pool exhausted) no sequence has changed.
  const std::vector<ContextAdmission> admissions = admit_context(batch);

  const int nb = static_cast<int>(batch.size());
  const int width = block_g_;
  TapSink sink{stream_, nb, width, std::vector<std::vector<Tap>>(static_cast<size_t>(nb))};
  TapSink* taps = want_taps ? &sink : nullptr;
  // The ctx_proj tap is a host read-back between the chunk's kernels: the launches are the same.
  ingest_context(batch, admissions, taps);
  upload_step(batch);

  // The judged pass is the block forward as shipped: graphs after warmup, PDL, no taps.
  ForwardPath path;
  path.mode = run_block_forward(nb, width);
  path.pdl = plan_.pdl;
  path.plan = launch_plans_.at({width, nb});
  const int64_t vocab = config_.vocab_size;
  const int64_t draft_rows = static_cast<int64_t>(nb) * (width - 1);
  const auto copy_back = [&] {
    DFLASH_CUDA_CHECK(cudaMemcpyAsync(h_logits_.get(), logits_.get(), static_cast<size_t>(draft_rows * vocab) * 4,
                                      cudaMemcpyDeviceToHost, stream_));
    DFLASH_CUDA_CHECK(cudaMemcpyAsync(h_tokens_.get(), tokens_.get(), static_cast<size_t>(draft_rows) * 4,
                                      cudaMemcpyDeviceToHost, stream_));
    DFLASH_CUDA_CHECK(cudaStreamSynchronize(stream_));
  };
  copy_back();

  std::vector<ProposeOutput> outputs;
  for (int b = 0; b < nb; ++b) {
    ProposeOutput out;
    out.seq = batch[static_cast<size_t>(b)].seq;
    out.block_width = width;
    const float* first = h_logits_.get() + static_cast<int64_t>(b) * (width - 1) * vocab;
    out.logits = Tensor({width - 1, vocab}, std::vector<float>(first, first + (width - 1) * vocab));
    const int32_t* tokens = h_tokens_.get() + static_cast<int64_t>(b) * (width - 1);
    out.draft_tokens.assign(tokens, tokens + (width - 1));
    out.path = path;
    outputs.push_back(std::move(out));
  }
  if (taps == nullptr) return outputs;

  // Taps: a second, eager pass over the same device inputs (the block forward writes no pool
  // slot, so it recomputes the judged pass); its residual stream, logits and tokens must equal the
  // judged ones.
  const int64_t hidden = config_.hidden_size;
  const auto residual = [&] {
    std::vector<float> out(static_cast<size_t>(static_cast<int64_t>(nb) * width * hidden));
    DFLASH_CUDA_CHECK(cudaMemcpyAsync(out.data(), h_.get(), out.size() * 4, cudaMemcpyDeviceToHost, stream_));
    DFLASH_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return out;
  };
  const std::vector<float> judged_h = residual();
  enqueue_block_forward(nb, width, taps);
  copy_back();
  const std::vector<float> tapped_h = residual();
  for (int b = 0; b < nb; ++b) {
    ProposeOutput& out = outputs[static_cast<size_t>(b)];
    const int64_t row0 = static_cast<int64_t>(b) * (width - 1);
    out.path.taps_from_second_pass = true;
    const int64_t h0 = static_cast<int64_t>(b) * width * hidden;
    out.path.tap_pass_difference =
        first_pass_difference(judged_h.data() + h0, tapped_h.data() + h0, width, hidden, out.logits.values.data(),
                              h_logits_.get() + row0 * vocab, out.draft_tokens.data(), h_tokens_.get() + row0,
                              width - 1, vocab);
    out.taps = std::move(sink.per_sequence[static_cast<size_t>(b)]);
    const float* first = h_logits_.get() + row0 * vocab;
    // In forward order: right after final_norm (DFlash2's selector taps follow the logits).
    const auto final_norm = std::find_if(out.taps.begin(), out.taps.end(),
                                         [](const Tap& t) { return t.name == stage_name(StageKind::kFinalNorm); });
    out.taps.insert(final_norm == out.taps.end() ? final_norm : final_norm + 1,
                    {stage_name(StageKind::kLogits), Tensor({width - 1, vocab}, std::vector<float>(first, first + (width - 1) * vocab))});
  }
  return outputs;
}

void CudaDrafter::ingest_context(const std::vector<ProposeInput>& batch,
                                 const std::vector<ContextAdmission>& admissions, TapSink* taps) {
  struct Row {
    int b;
    int64_t ctx_row, position, slot;
  };
  std::vector<Row> rows;
  std::vector<int64_t> admitted(batch.size(), 0);
  for (size_t b = 0; b < batch.size(); ++b) {
    const ContextAdmission& a = admissions[b];
    for (size_t i = 0; i < a.slots.size(); ++i) {
      rows.push_back({static_cast<int>(b), a.first_row + static_cast<int64_t>(i), a.first_position + static_cast<int64_t>(i),
                      a.slots[i]});
    }
    admitted[b] = static_cast<int64_t>(a.slots.size());
  }
  const int64_t h = config_.hidden_size, kv_dim = config_.kv_dim(), width = config_.ctx_feature_dim();
  std::vector<std::vector<float>> ctx_proj(batch.size());

  for (size_t begin = 0; begin < rows.size(); begin += kContextChunkRows) {
    const int64_t n = static_cast<int64_t>(std::min<size_t>(kContextChunkRows, rows.size() - begin));
    parallel_for(n, 32, [&](int64_t first, int64_t last) {
      for (int64_t i = first; i < last; ++i) {
        const Row& r = rows[begin + static_cast<size_t>(i)];
        const float* src = batch[static_cast<size_t>(r.b)].ctx->row(r.ctx_row);
        uint16_t* dst = h_ctx_.get() + i * ld_ctx_;
        for (int64_t c = 0; c < width; ++c) dst[c] = float_to_bf16_bits(src[c]);  // padding stays zero
        h_ctx_positions_.get()[i] = r.position;
        DFLASH_MUTATE(mutation_, kStaleKey, if (begin + static_cast<size_t>(i) == 1) h_ctx_positions_.get()[i] = rows[0].position);
        h_ctx_slots_.get()[i] = r.slot;
      }
    });
    DFLASH_CUDA_CHECK(cudaMemcpyAsync(d_ctx_.get(), h_ctx_.get(), static_cast<size_t>(n * ld_ctx_) * 2,
                                      cudaMemcpyHostToDevice, stream_));
    DFLASH_CUDA_CHECK(cudaMemcpyAsync(d_ctx_positions_.get(), h_ctx_positions_.get(), static_cast<size_t>(n) * 8,
                                      cudaMemcpyHostToDevice, stream_));
    DFLASH_CUDA_CHECK(cudaMemcpyAsync(d_ctx_slots_.get(), h_ctx_slots_.get(), static_cast<size_t>(n) * 8,
                                      cudaMemcpyHostToDevice, stream_));

    // Xc = RMSNorm_hidden_norm(F · fcᵀ), stored bf16.
    const DeviceMatrixView fc = weights_.fc.view();
    GemmEpilogue fc_out;
    fc_out.out = xc_f32_.get();
    fc_out.ld_out = h;
    enqueue_gemm(false, plan_.ctx_kernel(n, fc.format), d_ctx_.get(), ld_ctx_, n, fc, fc_out);
    launch_rmsnorm(plan_.rmsnorm, rmsnorm_args(xc_f32_.get(), weights_.hidden_norm.get(), xc_.get(), nullptr, 0, n), stream_);
    if (taps) {
      DFLASH_CUDA_CHECK(cudaStreamSynchronize(stream_));
      std::vector<uint16_t> bits(static_cast<size_t>(n * ld_hidden_));
      DFLASH_CUDA_CHECK(cudaMemcpy(bits.data(), xc_.get(), bits.size() * 2, cudaMemcpyDeviceToHost));
      for (int64_t i = 0; i < n; ++i) {
        std::vector<float>& dst = ctx_proj[static_cast<size_t>(rows[begin + static_cast<size_t>(i)].b)];
        for (int64_t c = 0; c < h; ++c) dst.push_back(bf16_bits_to_float(bits[static_cast<size_t>(i * ld_hidden_ + c)]));
      }
    }

    // Every layer's context K (k_norm, RoPE) and V, written once into the pools at their slots.
    for (int l = 0; l < config_.num_layers; ++l) {
      const DeviceLayerWeights& layer = weights_.layers[static_cast<size_t>(l)];
      const DeviceMatrixView kv = layer.qkv.view().rows(config_.q_dim(), 2 * kv_dim);
      GemmEpilogue kv_out;
      kv_out.out = kv_out_.get();
      kv_out.ld_out = 2 * kv_dim;
      enqueue_gemm(false, plan_.ctx_kernel(n, kv.format), xc_.get(), ld_hidden_, n, kv, kv_out,
                   activation_parts_of_rows(layer.qkv.activation_parts, config_.q_dim(), 2 * kv_dim));
      QkNormRopeArgs rope;
      rope.src = kv_out_.get();
      rope.ld_src = 2 * kv_dim;
      rope.q_col = -1;
      rope.k_col = 0;
      rope.v_col = kv_dim;
      rope.num_heads = config_.num_heads;
      rope.num_kv_heads = config_.num_kv_heads;
      rope.head_dim = config_.head_dim;
      rope.k_norm = layer.k_norm.get();
      rope.inv_freq = inv_freq_.get();
      rope.attention_scaling = rope_.attention_scaling;
      rope.eps = static_cast<float>(config_.rms_norm_eps);
      rope.positions = d_ctx_positions_.get();
      rope.k_out = k_pool_[static_cast<size_t>(l)].get();
      rope.v_out = v_pool_[static_cast<size_t>(l)].get();
      rope.ld_kv = kv_dim;
      rope.slots = d_ctx_slots_.get();
      rope.rows = n;
      launch_qk_norm_rope(plan_.qk_norm_rope, rope, stream_);
    }
    DFLASH_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the pinned staging is refilled next
  }
  if (taps) {
    for (size_t b = 0; b < batch.size(); ++b) {
      taps->per_sequence[b].push_back({stage_name(StageKind::kCtxProj), Tensor({admitted[b], h}, std::move(ctx_proj[b]))});
    }
  }
}

void CudaDrafter::upload_step(const std::vector<ProposeInput>& batch) {
  const int width = block_g_;
  const int nb = static_cast<int>(batch.size());
  std::fill_n(h_block_tables_.get(), h_block_tables_.size(), 0);
  for (int b = 0; b < nb; ++b) {
    const ProposeInput& in = batch[static_cast<size_t>(b)];
    const SequenceView v = table_.view(in.seq);
    if (static_cast<int>(v.block_table.size()) > max_pages_per_seq_ || v.window_size() > max_window_) {
      throw internal_error("cuda drafter: sequence " + std::to_string(in.seq) + " holds " +
                           std::to_string(v.block_table.size()) + " pages, more than the " +
                           std::to_string(max_pages_per_seq_) + " its block table was sized for");
    }
    h_anchors_.get()[b] = in.anchor;
    h_window_begin_.get()[b] = v.window_begin;
    h_window_length_.get()[b] = static_cast<int32_t>(v.window_size());
    DFLASH_MUTATE(mutation_, kAnchorLeak, h_anchors_.get()[b] = batch[0].anchor);
    DFLASH_MUTATE(mutation_, kWindowOneShort, if (v.window_begin > 0) { ++h_window_begin_.get()[b]; --h_window_length_.get()[b]; });
    h_first_page_.get()[b] = v.first_logical_page;
    std::copy(v.block_table.begin(), v.block_table.end(), h_block_tables_.get() + static_cast<int64_t>(b) * max_pages_per_seq_);
    for (int i = 0; i < width; ++i) h_positions_.get()[b * width + i] = in.start + i;
  }
  DFLASH_MUTATE(mutation_, kPageTableOrder, plant_page_major_tables(h_block_tables_.get(), nb, max_pages_per_seq_));
  auto up = [&](auto& device, auto& host, size_t count) {
    DFLASH_CUDA_CHECK(cudaMemcpyAsync(device.get(), host.get(), count * sizeof(*host.get()), cudaMemcpyHostToDevice, stream_));
  };
  up(d_anchors_, h_anchors_, static_cast<size_t>(nb));
  up(d_window_begin_, h_window_begin_, static_cast<size_t>(nb));
  up(d_window_length_, h_window_length_, static_cast<size_t>(nb));
  up(d_first_page_, h_first_page_, static_cast<size_t>(nb));
  DFLASH_UNLESS_MUTANT(mutation_, kBakedPageTable, options_.graphs && graphs_.count(std::make_pair(width, nb)) && graphs_[std::make_pair(width, nb)].exec)
  up(d_block_tables_, h_block_tables_, static_cast<size_t>(nb) * max_pages_per_seq_);
  DFLASH_UNLESS_MUTANT(mutation_, kGraphBakedPositions,
                       options_.graphs && graphs_.count(std::make_pair(width, nb)) && graphs_[std::make_pair(width, nb)].exec)
  up(d_positions_, h_positions_, static_cast<size_t>(nb) * width);
  last_batch_ = nb;
  last_width_ = width;
  last_seqs_.clear();
  for (const ProposeInput& in : batch) last_seqs_.push_back(in.seq);
}

const char* CudaDrafter::run_block_forward(int batch, int width) {
  if (!options_.graphs) {
    enqueue_block_forward(batch, width, nullptr);
    return "eager";
  }
  // The stale-graph mutations replay another shape's graph; the path then reports that graph's plan.
  DFLASH_MUTATE(mutation_, kGraphKeyedByWidth, for (auto& [key, other] : graphs_) if (key.first == width && key.second != batch && other.exec) { launch_plans_[{width, batch}] = launch_plans_[key]; DFLASH_CUDA_CHECK(cudaGraphLaunch(other.exec, stream_)); return "graph-replay"; });
  DFLASH_MUTATE(mutation_, kPaddedWidthGraph, for (auto& [key, other] : graphs_) if (key.second == batch && key.first > width && other.exec) { launch_plans_[{width, batch}] = launch_plans_[key]; DFLASH_CUDA_CHECK(cudaGraphLaunch(other.exec, stream_)); return "graph-replay"; });
  GraphEntry& entry = graphs_[{width, batch}];
  if (entry.exec == nullptr && entry.eager_runs < options_.warmup) {
    enqueue_block_forward(batch, width, nullptr);
    ++entry.eager_runs;
    return "eager";
  }
  const char* mode = "graph-replay";
  if (entry.exec == nullptr) {
    mode = "graph-capture";
    entry.exec = capture_graph(stream_, [&] { enqueue_block_forward(batch, width, nullptr); });
  }
  DFLASH_CUDA_CHECK(cudaGraphLaunch(entry.exec, stream_));
  return mode;
}

RmsNormArgs CudaDrafter::rmsnorm_args(const float* in, const float* weight, uint16_t* out, uint16_t* draft_out,
                                     int width, int64_t rows) const {
  RmsNormArgs norm;
  norm.in = in;
  norm.ld_in = config_.hidden_size;
  norm.weight = weight;
  norm.cols = config_.hidden_size;
  norm.eps = static_cast<float>(config_.rms_norm_eps);
  DFLASH_MUTATE(mutation_, kEpsIgnored, norm.eps = 0.0f);
  norm.out = out;
  norm.ld_out = ld_hidden_;
  norm.draft_out = draft_out;
  norm.block_width = width;
  norm.rows = rows;
  return norm;
}

GemmEpilogue CudaDrafter::qkv_epilogue() const {
  GemmEpilogue qkv;
  qkv.out = qkv_out_.get();
  qkv.ld_out = config_.q_dim() + 2 * config_.kv_dim();
  return qkv;
}

GemmEpilogue CudaDrafter::residual_epilogue(float* tap_out) const {
  GemmEpilogue e;
  e.residual = h_.get();
  e.ld_residual = config_.hidden_size;
  if (tap_out != nullptr) {
    e.out = tap_out;
    e.ld_out = config_.hidden_size;
  }
  return e;
}

GemmEpilogue CudaDrafter::plain_epilogue(float* out, int64_t ld_out) {
  GemmEpilogue e;
  e.out = out;
  e.ld_out = ld_out;
  return e;
}

GroupedConvArgs CudaDrafter::conv_args(const DeviceBuffer<float>& base, int batch, int block_width) const {
  GroupedConvArgs conv;
  conv.taps = config_.dflash2.conv_kernel_size;
  conv.group_size = config_.dflash2.conv_group_size;
  conv.channels = config_.hidden_size;
  conv.block_width = block_width;
  conv.batch = batch;
  conv.base = base.get();
  conv.coef = conv_coef_.get();
  conv.ld_coef = config_.conv_coef_dim();
  return conv;
}

SelectorArgs CudaDrafter::selector_args(int batch, int block_width) const {
  const Dflash2Config& d2 = config_.dflash2;
  SelectorArgs s;
  s.batch = batch;
  s.slots = block_width - 1;
  s.vocab = config_.vocab_size;
  s.top_k = d2.selector_top_k;
  s.shards = tp_;  // each rank's top-K of its vocabulary shard, merged (tensor-parallel.md §5.3)
  s.rank = d2.selector_rank;
  s.output_multiplier = static_cast<float>(d2.output_multiplier);
  s.softcap = static_cast<float>(d2.final_logit_softcapping);
  s.logits = logits_.get();
  s.hidden_proj = hidden_proj_.get();
  s.predecessor = weights_.selector.predecessor.get();
  s.successor = weights_.selector.successor.get();
  s.anchors = d_anchors_.get();
  s.topk_keys = topk_keys_.get();
  s.topk_ids = topk_ids_.get();
  s.topk_values = topk_values_.get();
  s.unary = unary_.get();
  s.edge_scores = edge_scores_.get();
  s.walk_scores = walk_scores_.get();
  s.walk_index = walk_index_.get();
  s.tokens = tokens_.get();
  return s;
}

GemmEpilogue CudaDrafter::gate_up_epilogue() const {
  GemmEpilogue gate_up;
  if (plan_.swiglu_fused) {  // act = silu(gate) · up
    gate_up.swiglu_out = act_.get();
    gate_up.ld_swiglu = ld_inter_;
  } else {
    gate_up.out = gate_up_out_.get();
    gate_up.ld_out = 2 * config_.intermediate_size;
  }
  return gate_up;
}

GemmEpilogue CudaDrafter::lm_head_epilogue() const {
  GemmEpilogue logits;  // the logits, and with the fused argmax its per-32-column partials
  logits.out = logits_.get();
  logits.ld_out = config_.vocab_size;
  if (plan_.argmax_fused) {
    logits.argmax_value = argmax_value_.get();
    logits.argmax_index = argmax_index_.get();
    logits.ld_argmax = argmax_blocks(config_.vocab_size);
  }
  return logits;
}

std::string CudaDrafter::gemm_runs(GemmKernel kernel, int64_t m, const DeviceMatrixView& w) const {
  if (quantizes_activations(w)) {
    return std::string(gemm_kernel_name(w8a8_gemm_kernel(gemm_ctx_, kernel, m, ld_act_codes_, w))) +
           " w8a8, per-token E4M3 activations";
  }
  const std::string head = std::string(gemm_kernel_name(kernel)) + (w.format == WeightFormat::kE4M3 ? " e4m3" : " bf16");
  switch (kernel) {
    case GemmKernel::kMma:
      // launch_gemm_mma's widths: m <= 16 one row tile (gemm_cols), above it 64-row tiles (gemm_cols_m64).
      if (m <= 16) {
        return head + ", " + std::to_string(gemm_mma_columns(gemm_ctx_.mma_columns, m, w.n, w.format, sm_count_)) +
               " columns";
      }
      return head + ", 64-row tiles of " +
             std::to_string(gemm_mma_columns_m64(gemm_ctx_.mma_columns_m64, m, w.n, w.format, sm_count_)) + " columns";
    case GemmKernel::kCutlass:
      return head + ", " + std::to_string(gemm_cutlass_tile_rows(gemm_ctx_.cutlass_tile_rows, m, w.n, sm_count_)) +
             "-row tiles";
    case GemmKernel::kCublasLt:
    case GemmKernel::kSimple:
      break;
  }
  return head;
}

std::vector<CudaDrafter::ForwardLaunch> CudaDrafter::block_forward_launches(int batch, int width, TapSink* taps) {
  const int64_t h = config_.hidden_size, q_dim = config_.q_dim(), kv_dim = config_.kv_dim();
  const int64_t inter = config_.intermediate_size, vocab = config_.vocab_size;
  const int64_t rows = static_cast<int64_t>(batch) * width;
  const int64_t draft_rows = static_cast<int64_t>(batch) * (width - 1);
  const float eps = static_cast<float>(config_.rms_norm_eps);
  // Every kernel after the first (the embedding, which follows the host's uploads) may start early;
  // taps synchronize between stages, so they gain nothing from it.
  const bool pdl = plan_.pdl && taps == nullptr;
  std::vector<ForwardLaunch> launches;
  // A launch of `kernel_class` that runs `runs`; once it ran, the stages `ready` hold their values.
  auto launch = [&](const char* kernel_class, std::string runs, std::vector<StageId> ready,
                    std::function<void()> enqueue) {
    launches.push_back({kernel_class, std::move(enqueue), std::move(runs), std::move(ready)});
  };
  // A block GEMM of m rows: its kernel follows the row count and weight format (gemm_m64).
  auto gemm_launch = [&](const char* kernel_class, std::vector<StageId> ready, const uint16_t* a, int64_t lda,
                         int64_t m, const DeviceMatrixView& w, const GemmEpilogue& epilogue, const std::string& also = "",
                         bool may_pdl = true, const std::vector<ActivationPart>& parts = {}) {
    const GemmKernel kernel = quantizes_activations(w) ? plan_.w8a8_block_kernel(m) : plan_.block_kernel(m, w.format);
    const bool gemm_pdl = pdl && may_pdl;
    std::string runs = gemm_runs(kernel, m, w) + also;
    if (quantizes_activations(w) && parts.size() > 1) runs += ", one activation quantization per projection";
    if (quantizes_activations(w) && parts.size() == 1) runs += ", a static activation scale";
    if (quantizes_activations(w) && parts.size() <= 1) {
      // The quantization is a launch of its own (kernel class act_quant), so that the benchmark
      // can tell what it costs.
      const float static_scale = one_part_scale(w, parts);
      launch("act_quant", "each input row to E4M3 (per token, or a static scale), one CTA per row", {},
             [=] { enqueue_activation_quantization(gemm_pdl, a, lda, m, w, static_scale); });
      launch(kernel_class, std::move(runs), std::move(ready),
             [=] { enqueue_quantized_gemm(gemm_pdl, kernel, m, w, epilogue); });
      return;
    }
    launch(kernel_class, std::move(runs), std::move(ready),
           [=] { enqueue_gemm(gemm_pdl, kernel, a, lda, m, w, epilogue, parts); });
  };
  // TP = N > 1 (docs/spec/tensor-parallel.md §3-4): a row-parallel GEMM of the [rows, k] bf16 `in` as
  // N fake shards. Rank r's K slice is copied into `slice` (zero past it), its partial is the GEMM of
  // its column slice of the weight (scaled, no bias) into tp_partials_, then §4's reduction in rank
  // order, the bias once (o = R + bias into `out`), and h += o unless DFlash2's convolution adds it.
  // No PDL inside: copies separate the partial GEMMs.
  auto row_parallel = [&](const char* kernel_class, StageKind stage, int layer, const uint16_t* in, int64_t ld_in,
                          int64_t k, uint16_t* slice, int64_t ld_slice, const std::vector<DeviceLinear>& shards,
                          const float* bias, float* out, std::vector<StageId> ready) {
    const int64_t k_rank = k / tp_;
    for (int r = 0; r < tp_; ++r) {
      const uint16_t* src = in + r * k_rank;
      launch("tp_slice", "each rank's K slice, copied", {}, [=] {
        DFLASH_CUDA_CHECK(cudaMemcpy2DAsync(slice, static_cast<size_t>(ld_slice) * 2, src, static_cast<size_t>(ld_in) * 2,
                                            static_cast<size_t>(k_rank) * 2, static_cast<size_t>(rows),
                                            cudaMemcpyDeviceToDevice, stream_));
      });
      gemm_launch(kernel_class, {{stage, layer, r}}, slice, ld_slice, rows, shards[static_cast<size_t>(r)].view(),
                  plain_epilogue(tp_partial(r, rows), h), ", one rank's partial", false);
    }
    TpPartials partials{tp_partial(0, rows), rows * h, tp_, rows, h, h};  // [N, rows, H], ld H
    DFLASH_MUTATE(mutation_, kTpMissingAllReduce, if (layer == 0 && stage == StageKind::kOProj) partials.ranks = 1);
    float* residual = config_.dflash2.enabled ? nullptr : h_.get();
    launch("tp_reduce",
           std::to_string(tp_) + " partials in rank order, " + (tp_wire_ == TpWire::kBf16 ? "bf16" : "fp32") + " wire",
           std::move(ready), [=] {
             TpPartials order = partials;
             // The planted order: the captured graph sums from the last rank down; eager passes do not.
             DFLASH_MUTATE(mutation_, kTpGraphReductionOrder, cudaStreamCaptureStatus capture; DFLASH_CUDA_CHECK(cudaStreamIsCapturing(stream_, &capture)); if (capture == cudaStreamCaptureStatusActive) { order.base += (order.ranks - 1) * order.rank_stride; order.rank_stride = -order.rank_stride; });
             launch_tp_reduce_rows(stream_, order, tp_wire_, bias, out, h, residual, h);
           });
  };
  const std::string rmsnorm = find_lever("rmsnorm").held(plan_).name;
  const bool d2 = config_.dflash2.enabled;
  const int64_t coef_dim = d2 ? config_.conv_coef_dim() : 0;
  // DFlash2: coefficients of the sublayer input `in` (kernel_projection, bf16 weights in every mode),
  // then in = conv.prepare(in), in place (docs/spec/dflash2.md §3.1-3.2).
  auto conv_prepare = [&](const DeviceLinear& projection, const DeviceBuffer<float>& base, uint16_t* in,
                          StageKind coef_stage, StageKind in_stage, int layer) {
    GemmEpilogue coef;
    coef.out = conv_coef_.get();
    coef.ld_out = coef_dim;
    gemm_launch("conv_coef", {{coef_stage, layer}}, in, ld_hidden_, rows, projection.view(), coef);
    const GroupedConvArgs conv = conv_args(base, batch, width);
    launch("conv", "conv_prepare", {{in_stage, layer}}, [=] { launch_conv_prepare(conv, in, ld_hidden_, stream_, pdl); });
  };
  // DFlash2: h += conv.finish(z) with the coefficients prepare computed.
  auto conv_finish = [&](const DeviceBuffer<float>& base, const float* z, std::vector<StageId> ready) {
    const GroupedConvArgs conv = conv_args(base, batch, width);
    float* conv_tap = taps ? conv_out_.get() : nullptr;
    launch("conv", "conv_finish", std::move(ready),
           [=] { launch_conv_finish(conv, z, h, h_.get(), conv_tap, stream_, pdl); });
  };

  for (int l = 0; l < config_.num_layers; ++l) {
    const DeviceLayerWeights& layer = weights_.layers[static_cast<size_t>(l)];
    const RmsNormArgs norm = rmsnorm_args(h_.get(), layer.input_norm.get(), x_.get(), nullptr, width, rows);
    if (l == 0) {
      EmbedArgs embed;
      embed.embed_tokens = weights_.embed.get();
      embed.anchors = d_anchors_.get();
      embed.mask_token_id = config_.mask_token_id;
      embed.scale = d2 ? static_cast<float>(config_.dflash2.input_embedding_scale) : 1.0f;
      embed.h = h_.get();
      launch("embed", "embed, " + rmsnorm + " rmsnorm", {{StageKind::kEmbed}, {StageKind::kAttnNorm, l}},
             [=] { launch_embed_rmsnorm(plan_.rmsnorm, embed, norm, stream_); });
    } else {
      launch("rmsnorm", rmsnorm, {{StageKind::kAttnNorm, l}}, [=] { launch_rmsnorm(plan_.rmsnorm, norm, stream_, pdl); });
    }
    if (d2) conv_prepare(layer.attn_conv_proj, layer.attn_conv_base, x_.get(), StageKind::kAttnConvCoef, StageKind::kAttnConvIn, l);

    gemm_launch("qkv", {}, x_.get(), ld_hidden_, rows, layer.qkv.view(), qkv_epilogue(), "", true,
                layer.qkv.activation_parts);

    QkNormRopeArgs rope;
    rope.src = qkv_out_.get();
    rope.ld_src = q_dim + 2 * kv_dim;
    rope.q_col = 0;
    rope.k_col = q_dim;
    rope.v_col = q_dim + kv_dim;
    rope.num_heads = config_.num_heads;
    rope.num_kv_heads = config_.num_kv_heads;
    rope.head_dim = config_.head_dim;
    rope.q_norm = layer.q_norm.get();
    rope.k_norm = layer.k_norm.get();
    rope.inv_freq = inv_freq_.get();
    rope.attention_scaling = rope_.attention_scaling;
    rope.eps = eps;
    rope.positions = d_positions_.get();
    rope.q_out = q_.get();
    rope.ld_q = q_dim;
    rope.k_out = k_block_.get();
    rope.v_out = v_block_.get();
    rope.ld_kv = kv_dim;
    rope.rows = rows;
    launch("qk_norm_rope", find_lever("qk_norm_rope").held(plan_).name,
           {{StageKind::kQ, l}, {StageKind::kK, l}, {StageKind::kV, l}},
           [=] { launch_qk_norm_rope(plan_.qk_norm_rope, rope, stream_, pdl); });

    AttentionArgs att;
    att.q = q_.get();
    att.k_block = k_block_.get();
    att.v_block = v_block_.get();
    att.k_pool = k_pool_[static_cast<size_t>(l)].get();
    att.v_pool = v_pool_[static_cast<size_t>(l)].get();
    att.block_tables = d_block_tables_.get();
    att.window_begin = d_window_begin_.get();
    att.window_length = d_window_length_.get();
    att.first_logical_page = d_first_page_.get();
    att.max_pages_per_seq = max_pages_per_seq_;
    att.page_size = settings_.kv_page_size;
    att.window_left = d2 && config_.dflash2.sliding[static_cast<size_t>(l)] ? config_.dflash2.sliding_window - 1 : -1;
    att.batch = batch;
    att.block_width = width;
    att.num_heads = config_.num_heads;
    att.num_kv_heads = config_.num_kv_heads;
    att.head_dim = config_.head_dim;
    att.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(config_.head_dim)));
    att.max_chunks = max_chunks_;
    DFLASH_MUTATE(mutation_, kStaleAttentionPlan, att.max_chunks = static_cast<int>((*std::max_element(h_window_length_.get(), h_window_length_.get() + batch) + width + kAttentionChunk - 1) / kAttentionChunk));
    att.sm_count = sm_count_;
    att.max_block_width = max_width_;
    DFLASH_MUTATE(mutation_, kGammaSizedBuffer, att.max_block_width = settings_.gamma);
    att.partial_out = attn_partial_.get();
    att.partial_max_sum = attn_max_sum_.get();
    att.out = attn_.get();
    att.ld_out = ld_q_;
    // The form the launchers take at this shape (attention_launch is their own decision).
    const AttentionLaunch attention = attention_launch(plan_.attention, att);
    launch("attention_chunks", attention.name(), {}, [=] { launch_attention_chunks(plan_.attention, att, stream_, pdl); });
    launch("combine", attention.combines() ? "merge of the chunks' partials" : "none (no partials)",
           {{StageKind::kAttn, l}}, [=] { launch_attention_combine(plan_.attention, att, stream_, pdl); });

    // DFlash2: o_proj's output goes through attention_conv.finish before the residual add.
    DeviceMatrixView o = layer.o.view();
    DFLASH_MUTATE(mutation_, kBiasIgnored, o.bias = nullptr);
    float* o_tap = taps ? o_out_.get() : nullptr;
    if (tp_ > 1) {
      row_parallel("o", StageKind::kOProj, l, attn_.get(), ld_q_, q_dim, tp_attn_slice_.get(), ld_tp_attn_, layer.o_shards, o.bias,
                   o_out_.get(), {{StageKind::kOProj, l}});
    } else {
      const GemmEpilogue o_epilogue = d2 ? plain_epilogue(o_out_.get(), h) : residual_epilogue(o_tap);
      gemm_launch("o", {{StageKind::kOProj, l}}, attn_.get(), ld_q_, rows, o, o_epilogue, "", true,
                  layer.o.activation_parts);
    }
    if (d2) conv_finish(layer.attn_conv_base, o_out_.get(), {{StageKind::kAttnConvOut, l}});

    const RmsNormArgs post_norm = rmsnorm_args(h_.get(), layer.post_norm.get(), y_.get(), nullptr, width, rows);
    launch("rmsnorm", rmsnorm, {{StageKind::kMlpNorm, l}}, [=] { launch_rmsnorm(plan_.rmsnorm, post_norm, stream_, pdl); });
    if (d2) conv_prepare(layer.mlp_conv_proj, layer.mlp_conv_base, y_.get(), StageKind::kMlpConvCoef, StageKind::kMlpConvIn, l);

    gemm_launch("gate_up", {}, y_.get(), ld_hidden_, rows, layer.gate_up.view(), gate_up_epilogue(),
                plan_.swiglu_fused ? ", swiglu in its epilogue" : "", true, layer.gate_up.activation_parts);
    if (!plan_.swiglu_fused) {
      const bool split = layer.gate_up.split_gate_up;
      launch("swiglu", split ? "separate, gate rows then up rows" : "separate", {},
             [=] { launch_swiglu(gate_up_out_.get(), rows, inter, act_.get(), ld_inter_, stream_, pdl, split); });
    }

    float* mlp_tap = taps ? mlp_out_.get() : nullptr;
    const GemmEpilogue down_epilogue = d2 ? plain_epilogue(mlp_out_.get(), h) : residual_epilogue(mlp_tap);
    std::vector<StageId> down_ready = {{StageKind::kMlp, l}};
    if (!d2) down_ready.push_back({StageKind::kOut, l});
    if (tp_ > 1) {
      row_parallel("down", StageKind::kMlp, l, act_.get(), ld_inter_, inter, tp_act_slice_.get(), ld_tp_act_, layer.down_shards,
                   layer.down.view().bias, mlp_out_.get(), down_ready);
    } else {
      gemm_launch("down", down_ready, act_.get(), ld_inter_, rows, layer.down.view(), down_epilogue, "", true,
                  layer.down.activation_parts);
    }
    if (d2) conv_finish(layer.mlp_conv_base, mlp_out_.get(), {{StageKind::kMlpConvOut, l}, {StageKind::kOut, l}});
  }

  // hf = RMSNorm_norm(h); rows 1..B-1 of each block also go to the lm_head's input.
  const RmsNormArgs final_norm = rmsnorm_args(h_.get(), weights_.final_norm.get(), hf_.get(), hf_draft_.get(), width, rows);
  launch("rmsnorm", rmsnorm, {{StageKind::kFinalNorm}}, [=] { launch_rmsnorm(plan_.rmsnorm, final_norm, stream_, pdl); });

  const bool vocab_parallel = tp_ > 1;  // docs/spec/tensor-parallel.md §5.2
  const std::string argmax_partials = !d2 && !vocab_parallel && plan_.argmax_fused ? ", argmax partials in its epilogue" : "";
  GemmEpilogue head_epilogue = lm_head_epilogue();
  if (vocab_parallel) head_epilogue.argmax_value = nullptr, head_epilogue.argmax_index = nullptr;
  // The vocabulary shards as the merge reads them: the shards' own logits, or the columns of a head
  // computed whole (the NVFP4 head: its shards are its rows byte for byte, §2).
  VocabShards shards;
  shards.ranks = tp_;
  shards.rows = draft_rows;
  shards.shard_vocab = vocab / tp_;
  if (weights_.lm_head_nvfp4.present()) {
    // The target's NVFP4 head, on exactly this propose's draft rows.
    const DeviceNvFp4View lm_head = weights_.lm_head_nvfp4.view();
    launch("lm_head", "nvfp4 w4a16" + argmax_partials, {}, [=] {
      launch_gemm_nvfp4(stream_, pdl, hf_draft_.get(), ld_hidden_, draft_rows, lm_head, head_epilogue);
    });
    shards.base = logits_.get();
    shards.rank_stride = shards.shard_vocab;
    shards.ld = vocab;
  } else if (vocab_parallel) {
    shards.base = tp_logits_.get();
    shards.rank_stride = draft_rows * ld_tp_vocab_;
    shards.ld = ld_tp_vocab_;
    for (int r = 0; r < tp_; ++r) {
      gemm_launch("lm_head", {}, hf_draft_.get(), ld_hidden_, draft_rows,
                  weights_.lm_head_shards[static_cast<size_t>(r)].view(),
                  plain_epilogue(tp_logits_.get() + r * shards.rank_stride, ld_tp_vocab_), ", one vocabulary shard",
                  false);
    }
  } else {
    gemm_launch("lm_head", {}, hf_draft_.get(), ld_hidden_, draft_rows, weights_.lm_head.view(), head_epilogue,
                argmax_partials, true, weights_.lm_head.activation_parts);
  }
  // The shards' logits gathered into logits_ (a head computed whole is there already); the merged
  // argmax gives the draft tokens unless DFlash2's selector does.
  float* gather = shards.base == logits_.get() ? nullptr : logits_.get();
  if (vocab_parallel && d2 && gather != nullptr) {
    launch("tp_gather", "the vocabulary shards' logits gathered", {},
           [=] { launch_vocab_parallel_argmax(stream_, shards, gather, vocab, nullptr); });
  } else if (vocab_parallel && !d2) {
    launch("argmax", "vocabulary-parallel merge of " + std::to_string(tp_) + " shards' best", {},
           [=] { launch_vocab_parallel_argmax(stream_, shards, gather, vocab, tokens_.get()); });
  }
  if (d2) {
    // The candidate selector's walk gives the draft tokens (docs/spec/dflash2.md §3.4).
    GemmEpilogue projected;
    projected.out = hidden_proj_.get();
    projected.ld_out = config_.dflash2.selector_rank;
    gemm_launch("hidden_proj", {}, hf_draft_.get(), ld_hidden_, draft_rows, weights_.selector.hidden_projection.view(), projected);
    const SelectorArgs selector = selector_args(batch, width);
    const SelectorTopK topk_kernel = plan_.selector_topk;
    launch("selector_topk", find_lever("selector_topk").held(plan_).name, {},
           [=] { launch_selector_topk(selector, topk_kernel, stream_, pdl); });
    std::vector<StageId> selector_stages;
    for (StageKind kind : kSelectorStages) selector_stages.push_back({kind});
    launch("selector_walk", "greedy walk", selector_stages, [=] { launch_selector_walk(selector, stream_, pdl); });
  } else if (vocab_parallel) {
    // The merge above gave the tokens.
  } else if (plan_.argmax_fused) {
    launch("argmax", "reduce of the lm_head's partials", {}, [=] {
      launch_argmax_reduce(argmax_value_.get(), argmax_index_.get(), draft_rows, argmax_blocks(vocab), tokens_.get(),
                           stream_, pdl);
    });
  } else {
    launch("argmax", "separate", {}, [=] { launch_argmax_rows(logits_.get(), draft_rows, vocab, tokens_.get(), stream_, pdl); });
  }
  DFLASH_MUTATE(mutation_, kBlockRowsInPool, launch("argmax", "planted: block rows stored in the pool", {}, [=] {
    plant_block_rows_in_pool(k_block_.get(), v_block_.get(), k_pool_.back().get(), v_pool_.back().get(),
                             static_cast<int64_t>(settings_.pool_pages) * settings_.kv_page_size, rows, kv_dim, stream_);
  }));
  return launches;
}

void CudaDrafter::enqueue_block_forward(int batch, int width, TapSink* taps) {
  const std::vector<ForwardLaunch> launches = block_forward_launches(batch, width, taps);
  if (taps == nullptr && launch_plans_.count({width, batch}) == 0) {
    // Each kernel class once, in forward order; a class that runs differently within the forward
    // lists every form.
    std::vector<std::pair<std::string, std::string>> plan;
    for (const ForwardLaunch& launch : launches) {
      auto it = std::find_if(plan.begin(), plan.end(), [&](const auto& e) { return e.first == launch.kernel_class; });
      if (it == plan.end()) {
        plan.emplace_back(launch.kernel_class, launch.runs);
      } else if (("; " + it->second + "; ").find("; " + launch.runs + "; ") == std::string::npos) {
        it->second += "; " + launch.runs;
      }
    }
    plan.emplace_back("pdl", plan_.pdl ? "on" : "off");
    launch_plans_[{width, batch}] = std::move(plan);
  }
  for (const ForwardLaunch& launch : launches) {
    launch.enqueue();
    if (taps == nullptr) continue;
    for (const StageId& stage : launch.ready) {
      TapSource source = tap_sources_.at(stage.kind);
      if (stage.rank >= 0) {  // a rank's partial as it enters the reduction (bf16 on a bf16 wire)
        source = TapSource{tp_partial(stage.rank, static_cast<int64_t>(batch) * width),
                           tp_wire_ == TpWire::kBf16 ? TapStorage::kF32ReadAsBf16 : TapStorage::kF32,
                           config_.hidden_size, config_.hidden_size, false, {}};
      }
      taps->capture(stage_name(stage), source);
    }
  }
}

}  // namespace dflash
