// The CUDA drafter's construction, per-sequence state, propose and description; the device work of
// a propose is in cuda_forward.cc.
#include <algorithm>
#include <cmath>
#include <string>

#include "core/dtype.h"
#include "core/error.h"
#include "cuda/runtime/cuda_check.h"
#include "cuda/kernels/gemm/gemm_cutlass_mixed.h"
#include "cuda/drafter/cuda_drafter_impl.h"
#include "cuda/kernels/elementwise/elementwise.h"

namespace dflash {
namespace {

HeadSettings resolve_settings(const DrafterConfig& config, const HeadSettings& settings, const CudaOptions& options) {
  HeadSettings s = settings.resolved(config);
  if (!options.precision.empty()) {
    if (!parse_precision(options.precision, &s.precision)) {
      throw bad_input("CUDA options: precision '" + options.precision + "' (bf16, fp8 or w8a8)");
    }
  }
  if (s.precision != Precision::kBf16 && s.precision != Precision::kFp8 && s.precision != Precision::kW8a8) {
    throw bad_input(std::string("head: the CUDA drafter computes in bf16, fp8 or w8a8; precision ") +
                    precision_name(s.precision) + " was asked");
  }
  if (s.tp_size > 1 && s.precision == Precision::kW8a8) {
    // As the reference: a rank would quantize its own slice of a row-parallel input, and the
    // contract states no per-slice activation scales.
    throw bad_input("CUDA drafter: tp_size " + std::to_string(s.tp_size) +
                    " with w8a8: docs/spec/tensor-parallel.md does not state the row-parallel activation scales; "
                    "refusing");
  }
  return s;
}

void require_device(int device) {
  std::string why;
  if (!cuda_device_available(&why)) throw unsupported("CUDA drafter: " + why);
  int count = 0;
  DFLASH_CUDA_CHECK(cudaGetDeviceCount(&count));
  if (device < 0 || device >= count) {
    throw bad_input("CUDA options: device " + std::to_string(device) + " does not exist (" + std::to_string(count) +
                    " devices)");
  }
  DFLASH_CUDA_CHECK(cudaSetDevice(device));
}

void check_geometry(const DrafterConfig& c) {
  if (c.dflash2.enabled && c.dflash2.selector_top_k > kSelectorMaxTopK) {
    throw bad_input("config: dflash_config.selector_top_k " + std::to_string(c.dflash2.selector_top_k) +
                    " is more than the CUDA drafter's selector serves (" + std::to_string(kSelectorMaxTopK) + ")");
  }
  if (c.num_heads < 1 || c.num_kv_heads < 1 || c.num_heads % c.num_kv_heads != 0) {
    throw bad_input("config: num_attention_heads " + std::to_string(c.num_heads) +
                    " is not a multiple of num_key_value_heads " + std::to_string(c.num_kv_heads));
  }
  if (c.mask_token_id < 0 || c.mask_token_id >= c.vocab_size) {
    throw bad_input("config: dflash_config.mask_token_id " + std::to_string(c.mask_token_id) + " is outside [0, " +
                    std::to_string(c.vocab_size) + ")");
  }
  if (c.hidden_size < 1 || c.intermediate_size < 1 || c.vocab_size < 1 || c.num_layers < 1 ||
      c.ctx_feature_dim() < 1) {
    throw bad_input("config: hidden_size, intermediate_size, vocab_size, num_hidden_layers and the context width "
                    "must be positive");
  }
}

}  // namespace

bool cuda_device_available(std::string* why) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();
    if (why) *why = std::string("no usable CUDA device (cudaGetDeviceCount: ") + cudaGetErrorString(status) + ")";
    return false;
  }
  if (count == 0) {
    if (why) *why = "no CUDA device";
    return false;
  }
  const cudaError_t probe = run_device_probe();
  if (probe != cudaSuccess) {
    cudaGetLastError();
    if (why) *why = std::string("this build's device code does not run here (") + cudaGetErrorString(probe) + ")";
    return false;
  }
  return true;
}

std::unique_ptr<DraftProposer> make_cuda_drafter(const DrafterConfig& config,
                                                 std::shared_ptr<const DrafterWeights> weights,
                                                 const HeadSettings& settings, const CudaOptions& options) {
  if (!weights) throw bad_input("make_cuda_drafter: no weights");
  check_geometry(config);  // before any device is touched: a refused config needs no GPU
  return std::make_unique<CudaDrafter>(config, std::move(weights), settings, options);
}

CudaDrafter::CudaDrafter(const DrafterConfig& config, std::shared_ptr<const DrafterWeights> weights,
                         const HeadSettings& settings, const CudaOptions& options)
    : PagedProposer(config, resolve_settings(config, settings, options)),
      host_weights_(std::move(weights)),
      options_(options),
      plan_(resolve_kernel_plan(options.kernels, config.head_dim)),
      fp8_(settings_.precision == Precision::kFp8 || settings_.precision == Precision::kW8a8),
      w8a8_(settings_.precision == Precision::kW8a8),
      tp_(settings_.tp_size),
      tp_wire_(settings_.tp_reduce_dtype == TpReduceDtype::kBf16 ? TpWire::kBf16 : TpWire::kFp32),
      max_width_(std::max(settings_.gamma, 2)),
      rope_(make_rope_table(config.rope, config.head_dim)) {
  if (!host_weights_) throw bad_input("CUDA drafter: no weights");
  check_geometry(config_);
  if (options_.warmup < 0) throw bad_input("CUDA options: warmup must be >= 0");
  size_geometry();
  set_up_device();
  resolve_plan();
  upload_weights();
  allocate_buffers();
  build_tap_table();
  DFLASH_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

// The longest window, the block tables' and attention grid's extents, the GEMM operands' padded
// leading dimensions (multiples of 64).
void CudaDrafter::size_geometry() {
  max_window_ = settings_.max_window(config_);
  max_pages_per_seq_ = static_cast<int>((max_window_ + settings_.kv_page_size - 1) / settings_.kv_page_size + 1);
  max_chunks_ = static_cast<int>((max_window_ + max_width_ + kAttentionChunk - 1) / kAttentionChunk);
  ld_hidden_ = pad_k(config_.hidden_size);
  ld_q_ = pad_k(config_.q_dim());
  ld_inter_ = pad_k(config_.intermediate_size);
  ld_ctx_ = pad_k(config_.ctx_feature_dim());
  ld_tp_attn_ = pad_k(config_.q_dim() / tp_);
  ld_tp_act_ = pad_k(config_.intermediate_size / tp_);
  ld_tp_vocab_ = pad_k(config_.vocab_size / tp_);
}

// The device (kUnsupported without one), its name and SMs, the stream, every kernel prepared (so
// that nothing happens for the first time inside a graph capture).
void CudaDrafter::set_up_device() {
#ifdef DFLASH_FAULT_POINTS
  mutation_ = read_planted_mutation();
#endif
  require_device(options_.device);
#ifdef DFLASH_FAULT_POINTS
  set_device_mutation(mutation_);
  DFLASH_MUTATE(mutation_, kYarnAttentionFactor, rope_.attention_scaling = 1.0f);
  DFLASH_MUTATE(mutation_, kInvFreqBf16, plant_bf16_inv_freq(rope_.inv_freq));
#endif
  cudaDeviceProp prop;
  DFLASH_CUDA_CHECK(cudaGetDeviceProperties(&prop, options_.device));
  device_name_ = std::string(prop.name) + " (sm_" + std::to_string(prop.major) + std::to_string(prop.minor) + ", " +
                 std::to_string(prop.multiProcessorCount) + " SMs)";
  sm_count_ = prop.multiProcessorCount;
  DFLASH_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  prepare_gemm_kernels();
  prepare_gemm_fallback_kernels();
  prepare_attention_kernels();
  prepare_row_kernels();
  prepare_grouped_conv_kernels();
  prepare_selector_kernels();
}

// What the plan asked for against what this device and geometry allow (each refusal a named
// fallback), cuBLASLt where the plan uses it, and the GEMM context every launch copies.
void CudaDrafter::resolve_plan() {
  const int64_t h = config_.hidden_size, q_dim = config_.q_dim(), kv_dim = config_.kv_dim();
  const int64_t inter = config_.intermediate_size, vocab = config_.vocab_size;
  // The attention instantiation must be the one built for this head_dim (a tuned kernel of another
  // head_dim would stay in bounds and mix heads silently).
  if (plan_.attention.kernel == AttentionKernel::kTuned && plan_.attention.compiled_head_dim != config_.head_dim) {
    throw internal_error("attention: kernel built for head_dim " + std::to_string(plan_.attention.compiled_head_dim) +
                         " chosen for head_dim " + std::to_string(config_.head_dim));
  }
  if (plan_.attention.kernel == AttentionKernel::kSimple &&
      attention_simple_smem_bytes(static_cast<int64_t>(max_chunks_) * kAttentionChunk) >
          attention_simple_max_smem_bytes()) {
    plan_.attention_request = AttentionRequest::kAuto;
    plan_.resolve_attention(config_.head_dim);
    plan_.fallbacks.push_back("attention: simple -> " + plan_.attention.name() + " (a window of " +
                              std::to_string(max_window_) + " keys does not fit in shared memory)");
  }
  // gemm_m64=library: which library can serve the block GEMMs of 64 rows and more.
  const int64_t max_rows = static_cast<int64_t>(settings_.max_batch) * max_width_;
  const bool library_rows = plan_.block_gemm == GemmKernel::kMma && plan_.block_library &&
                            max_rows >= KernelPlan::kBlockLibraryMinRows;
  if (!library_rows) plan_.block_library = false;
  if (library_rows && fp8_) {
    std::string why;
    // CUTLASS's epilogue stores 16-byte vectors of fp32: every E4M3 weight's n a multiple of 4.
    std::vector<std::pair<const char*, int64_t>> outputs = {
        {"q|k|v", q_dim + 2 * kv_dim}, {"o_proj", h}, {"gate|up", 2 * inter}, {"down_proj", h}, {"lm_head", vocab},
        {"an lm_head shard", vocab / tp_}};
    // w8a8 on CUTLASS with static activation scales multiplies each projection of a fused weight on
    // its own, into its columns of the output: each one's n and first column.
    if (w8a8_ && plan_.w8a8_cutlass) {
      outputs.insert(outputs.end(), {{"q_proj", q_dim}, {"k_proj", kv_dim}, {"gate_proj", inter}});
    }
    if (cutlass_mixed_supported(&why)) {
      for (const auto& [name, cols] : outputs) {
        if (cols % 4 != 0 && why.empty()) why = std::string(name) + " has " + std::to_string(cols) + " outputs, not a multiple of 4";
      }
    }
    if (!why.empty()) {
      plan_.cutlass_usable = false;
      plan_.fallbacks.push_back("gemm_m64: cutlass -> mma (" + why + ")");
    }
  }
  if (plan_.uses_cublaslt()) {
    DFLASH_CUDA_CHECK(cublasLtCreate(&lt_));
    lt_workspace_.allocate(32u << 20);
    gemm_ctx_.lt = lt_;
    gemm_ctx_.lt_workspace = lt_workspace_.get();
    gemm_ctx_.lt_workspace_bytes = lt_workspace_.bytes();
    std::string why;
    if ((plan_.ctx_gemm == ContextGemm::kAuto || plan_.ctx_gemm == ContextGemm::kCublasLt) &&
        !cublaslt_supports(gemm_ctx_, kContextChunkRows, h, config_.ctx_feature_dim(), ld_ctx_, ld_ctx_, &why)) {
      plan_.fallbacks.push_back("ctx_gemm: cublaslt -> mma (" + why + ")");
      plan_.ctx_gemm = ContextGemm::kMma;
    }
    if (plan_.block_library && !cublaslt_supports(gemm_ctx_, max_rows, h, h, ld_hidden_, ld_hidden_, &why)) {
      plan_.fallbacks.push_back("gemm_m64: cublaslt -> mma for bf16 weights (" + why + ")");
      plan_.cublaslt_block_usable = false;
    }
    if (plan_.block_gemm == GemmKernel::kCublasLt &&
        !cublaslt_supports(gemm_ctx_, static_cast<int64_t>(settings_.max_batch) * (max_width_ - 1), vocab, h, ld_hidden_,
                           ld_hidden_, &why)) {
      plan_.fallbacks.push_back("gemm: cublaslt -> mma (" + why + ")");
      plan_.block_gemm = GemmKernel::kMma;
    }
  }
  gemm_ctx_.stream = stream_;
  gemm_ctx_.mma_columns = plan_.gemm_columns;
  if (plan_.gemm_columns_m64 == 64 && !fp8_) {  // (gemm_mma_columns_m64 would take 32 silently)
    plan_.fallbacks.push_back("gemm_cols_m64: 64 -> 32 (bf16 weights: two ring stages of 64 columns do not fit in "
                              "shared memory)");
    plan_.gemm_columns_m64 = 32;
  }
  gemm_ctx_.mma_columns_m64 = plan_.gemm_columns_m64;
  gemm_ctx_.sm_count = sm_count_;
  gemm_ctx_.epilogue_kernel = plan_.gemm_epilogue;
  gemm_ctx_.cutlass_tile_rows = plan_.cutlass_tile_rows;
}

// The weights in the plan's formats, RoPE's frequencies, every layer's K/V pool (poisoned while free).
void CudaDrafter::upload_weights() {
  weights_ = upload_drafter_weights(config_, *host_weights_, fp8_ ? WeightFormat::kE4M3 : WeightFormat::kBf16,
                                    plan_.cublaslt_reads_e4m3(fp8_), stream_, w8a8_);
  // Static activation scales of gate and up: two parts, whose raw outputs the separate SwiGLU reads.
  const bool split_gate_up = std::any_of(weights_.layers.begin(), weights_.layers.end(),
                                         [](const DeviceLayerWeights& l) { return l.gate_up.split_gate_up; });
  if (split_gate_up && plan_.swiglu_fused) {
    plan_.swiglu_fused = false;
    plan_.fallbacks.push_back("swiglu: fused -> separate (w8a8 with static activation scales: gate and up quantize "
                              "their input rows apart)");
  }
  DFLASH_MUTATE(mutation_, kFp8RowScale, plant_fnuz_row_scales(weights_.layers[0].o.view().scale, weights_.layers[0].o.view().n, fp8_));
  DFLASH_MUTATE(mutation_, kCutlassNeighbourScale, for (const DeviceLayerWeights& l : weights_.layers) for (const DeviceLinear* w : {&l.qkv, &l.o, &l.gate_up, &l.down}) plant_neighbour_scales(w->view().scale, w->view().n); plant_neighbour_scales(weights_.lm_head.view().scale, weights_.lm_head.view().n));
  // After the planted scales, which the shards then copy.
  if (tp_ > 1) shard_weights(weights_, config_, tp_, stream_);
  inv_freq_.allocate(rope_.inv_freq.size());
  DFLASH_CUDA_CHECK(cudaMemcpy(inv_freq_.get(), rope_.inv_freq.data(), rope_.inv_freq.size() * 4, cudaMemcpyHostToDevice));

  const int64_t pool_slots = static_cast<int64_t>(settings_.pool_pages) * settings_.kv_page_size;
  const int64_t kv_dim = config_.kv_dim();
  for (int l = 0; l < config_.num_layers; ++l) {
    k_pool_.emplace_back(static_cast<size_t>(pool_slots * kv_dim));
    v_pool_.emplace_back(static_cast<size_t>(pool_slots * kv_dim));
  }
  poison_free_pool();
}

// Every scratch buffer, once, for max_batch sequences of max_width_ block rows and context chunks of
// kContextChunkRows: nothing is allocated per propose, or inside a graph capture.
void CudaDrafter::allocate_buffers() {
  const int64_t h = config_.hidden_size, q_dim = config_.q_dim(), kv_dim = config_.kv_dim();
  const int64_t inter = config_.intermediate_size, vocab = config_.vocab_size;
  const int64_t rows = static_cast<int64_t>(settings_.max_batch) * max_width_;
  const int64_t draft_rows = static_cast<int64_t>(settings_.max_batch) * (max_width_ - 1);
  const int64_t qkv_n = q_dim + 2 * kv_dim;
  auto n = [](int64_t v) { return static_cast<size_t>(v); };
  h_.allocate(n(rows * h));
  x_.allocate(n(rows * ld_hidden_));
  qkv_out_.allocate(n(rows * qkv_n));
  q_.allocate(n(rows * q_dim));
  k_block_.allocate(n(rows * kv_dim));
  v_block_.allocate(n(rows * kv_dim));
  attn_.allocate(n(rows * ld_q_));
  o_out_.allocate(n(rows * h));
  y_.allocate(n(rows * ld_hidden_));
  if (!plan_.swiglu_fused) gate_up_out_.allocate(n(rows * 2 * inter));
  act_.allocate(n(rows * ld_inter_));
  mlp_out_.allocate(n(rows * h));
  hf_.allocate(n(rows * ld_hidden_));
  hf_draft_.allocate(n(draft_rows * ld_hidden_));
  logits_.allocate(n(draft_rows * vocab));
  if (plan_.argmax_fused) {
    argmax_value_.allocate(n(draft_rows * argmax_blocks(vocab)));
    argmax_index_.allocate(n(draft_rows * argmax_blocks(vocab)));
  }
  tokens_.allocate(n(draft_rows));
  if (config_.dflash2.enabled) {
    const int64_t top_k = config_.dflash2.selector_top_k;
    conv_coef_.allocate(n(rows * config_.conv_coef_dim()));
    conv_out_.allocate(n(rows * h));
    hidden_proj_.allocate(n(draft_rows * config_.dflash2.selector_rank));
    topk_keys_.allocate(n(selector_topk_keys(draft_rows, vocab, static_cast<int>(top_k), tp_)));
    topk_ids_.allocate(n(draft_rows * top_k));
    topk_values_.allocate(n(draft_rows * top_k));
    unary_.allocate(n(draft_rows * top_k));
    edge_scores_.allocate(n(draft_rows * top_k * top_k));
    walk_scores_.allocate(n(draft_rows * top_k));
    walk_index_.allocate(n(draft_rows));
  }
  const int64_t partial = attention_partial_floats(settings_.max_batch, config_.num_heads, max_width_, max_chunks_,
                                                   config_.head_dim);
  if (plan_.attention.kernel != AttentionKernel::kSimple) {
    attn_partial_.allocate(n(partial));
    attn_max_sum_.allocate(n(partial / config_.head_dim * 2));
  }

  const int batch = settings_.max_batch;
  d_anchors_.allocate(n(batch));
  d_window_length_.allocate(n(batch));
  d_block_tables_.allocate(n(static_cast<int64_t>(batch) * max_pages_per_seq_));
  d_positions_.allocate(n(rows));
  d_window_begin_.allocate(n(batch));
  d_first_page_.allocate(n(batch));
  h_anchors_.allocate(n(batch));
  h_window_length_.allocate(n(batch));
  h_block_tables_.allocate(n(static_cast<int64_t>(batch) * max_pages_per_seq_));
  h_positions_.allocate(n(rows));
  h_window_begin_.allocate(n(batch));
  h_first_page_.allocate(n(batch));
  h_logits_.allocate(n(draft_rows * vocab));
  h_tokens_.allocate(n(draft_rows));

  h_ctx_.allocate(n(kContextChunkRows * ld_ctx_));
  h_ctx_positions_.allocate(n(kContextChunkRows));
  h_ctx_slots_.allocate(n(kContextChunkRows));
  d_ctx_.allocate(n(kContextChunkRows * ld_ctx_));
  xc_.allocate(n(kContextChunkRows * ld_hidden_));
  d_ctx_positions_.allocate(n(kContextChunkRows));
  d_ctx_slots_.allocate(n(kContextChunkRows));
  xc_f32_.allocate(n(kContextChunkRows * h));
  kv_out_.allocate(n(kContextChunkRows * 2 * kv_dim));

  // Accumulator scratch of the fallback GEMMs (raw sums before the epilogue kernel), for the most
  // rows each GEMM runs: graph capture must allocate nothing.
  int64_t raw = kContextChunkRows * std::max(h, 2 * kv_dim);
  if (w8a8_) {  // every E4M3 GEMM finishes in the epilogue kernel (gemm_w8a8)
    raw = std::max({raw, rows * std::max({qkv_n, h, 2 * inter}), draft_rows * vocab});
    const int64_t act_rows = std::max(rows, kContextChunkRows);
    ld_act_codes_ = std::max({ld_hidden_, ld_q_, ld_inter_});
    act_codes_.allocate(n(act_rows * ld_act_codes_));
    act_scales_.allocate(n(act_rows));
  }
  if (plan_.block_gemm == GemmKernel::kCublasLt || plan_.block_gemm == GemmKernel::kSimple) {
    raw = std::max({raw, rows * std::max({qkv_n, h, 2 * inter}), draft_rows * vocab});
    if (config_.dflash2.enabled) {
      raw = std::max({raw, rows * int64_t{config_.conv_coef_dim()}, draft_rows * config_.dflash2.selector_rank});
    }
  }
  if (plan_.block_library) {
    // Library GEMMs with more than a plain store finish in the epilogue kernel, from this scratch.
    raw = std::max(raw, rows * std::max({qkv_n, h, 2 * inter}));
    if (fp8_ && plan_.cutlass_usable) {
      // The largest workspace of any row count a propose can bring (stream-K's split follows it).
      size_t workspace = 0;
      std::vector<std::pair<int64_t, int64_t>> shapes = {
          {qkv_n, ld_hidden_}, {h, ld_q_}, {2 * inter, ld_hidden_}, {h, ld_inter_}, {vocab, ld_hidden_},
          {h, ld_tp_attn_}, {h, ld_tp_act_}, {vocab / tp_, ld_hidden_}};
      if (w8a8_ && plan_.w8a8_cutlass) {  // static activation scales: one GEMM per projection (q, k, v; gate, up)
        shapes.insert(shapes.end(), {{qkv_n - 2 * kv_dim, ld_hidden_}, {kv_dim, ld_hidden_}, {inter, ld_hidden_}});
      }
      for (const auto& [cols, k] : shapes) {
        for (int64_t m = KernelPlan::kBlockLibraryMinRows; m <= rows; ++m) {
          workspace = std::max(workspace, cutlass_mixed_workspace_bytes(m, cols, k));
        }
      }
      cutlass_workspace_.allocate(std::max<size_t>(workspace, 16));
      gemm_ctx_.cutlass_workspace = cutlass_workspace_.get();
      gemm_ctx_.cutlass_workspace_bytes = cutlass_workspace_.bytes();
    }
  }
  if (tp_ > 1) {
    tp_attn_slice_.allocate(n(rows * ld_tp_attn_));
    tp_act_slice_.allocate(n(rows * ld_tp_act_));
    DFLASH_CUDA_CHECK(cudaMemsetAsync(tp_attn_slice_.get(), 0, tp_attn_slice_.bytes(), stream_));  // the padding
    DFLASH_CUDA_CHECK(cudaMemsetAsync(tp_act_slice_.get(), 0, tp_act_slice_.bytes(), stream_));
    tp_partials_.allocate(n(tp_ * rows * h));
    if (!weights_.lm_head_shards.empty()) tp_logits_.allocate(n(tp_ * draft_rows * ld_tp_vocab_));
  }
  gemm_raw_.allocate(n(raw));
  gemm_ctx_.raw = gemm_raw_.get();
  gemm_ctx_.raw_capacity = gemm_raw_.size();
}

// Where the block forward leaves each stage it taps (docs/spec/drafter.md §7): the launch that
// completes a stage names it (ForwardLaunch::ready), this table says where to read it.
void CudaDrafter::build_tap_table() {
  const int64_t h = config_.hidden_size, q_dim = config_.q_dim(), kv_dim = config_.kv_dim();
  using S = TapStorage;
  auto add = [&](StageKind stage, const void* buffer, S storage, int64_t cols, int64_t ld) {
    tap_sources_[stage] = TapSource{buffer, storage, cols, ld, false, {}};
  };
  add(StageKind::kEmbed, h_.get(), S::kF32, h, h);
  add(StageKind::kAttnNorm, x_.get(), S::kBf16, h, ld_hidden_);
  add(StageKind::kQ, q_.get(), S::kBf16, q_dim, q_dim);
  add(StageKind::kK, k_block_.get(), S::kBf16, kv_dim, kv_dim);
  add(StageKind::kV, v_block_.get(), S::kBf16, kv_dim, kv_dim);
  add(StageKind::kAttn, attn_.get(), S::kBf16, q_dim, ld_q_);
  add(StageKind::kOProj, o_out_.get(), S::kF32, h, h);  // the residual GEMM's copy (tapped pass)
  add(StageKind::kMlpNorm, y_.get(), S::kBf16, h, ld_hidden_);
  add(StageKind::kMlp, mlp_out_.get(), S::kF32, h, h);  // the residual GEMM's copy (tapped pass)
  add(StageKind::kOut, h_.get(), S::kF32, h, h);
  add(StageKind::kFinalNorm, hf_.get(), S::kBf16, h, ld_hidden_);
  if (!config_.dflash2.enabled) return;
  const int64_t coef = config_.conv_coef_dim(), top_k = config_.dflash2.selector_top_k;
  const int64_t rank = config_.dflash2.selector_rank;
  add(StageKind::kAttnConvCoef, conv_coef_.get(), S::kF32ReadAsBf16, coef, coef);
  add(StageKind::kAttnConvIn, x_.get(), S::kBf16, h, ld_hidden_);  // prepared in place
  add(StageKind::kAttnConvOut, conv_out_.get(), S::kF32, h, h);    // conv_finish's copy (tapped pass)
  add(StageKind::kMlpConvCoef, conv_coef_.get(), S::kF32ReadAsBf16, coef, coef);
  add(StageKind::kMlpConvIn, y_.get(), S::kBf16, h, ld_hidden_);
  add(StageKind::kMlpConvOut, conv_out_.get(), S::kF32, h, h);
  // The selector's stages: one row per draft row.
  auto add_draft = [&](StageKind stage, const void* buffer, S storage, int64_t cols, std::vector<int64_t> row_shape = {}) {
    tap_sources_[stage] = TapSource{buffer, storage, cols, cols, true, std::move(row_shape)};
  };
  add_draft(StageKind::kSelTopkIds, topk_ids_.get(), S::kI32, top_k);
  add_draft(StageKind::kSelTopkValues, topk_values_.get(), S::kF32, top_k);
  add_draft(StageKind::kSelUnary, unary_.get(), S::kF32, top_k);
  add_draft(StageKind::kSelHiddenProj, hidden_proj_.get(), S::kF32, rank);
  add_draft(StageKind::kSelEdgeScores, edge_scores_.get(), S::kF32, top_k * top_k, {top_k, top_k});
  add_draft(StageKind::kSelWalkScores, walk_scores_.get(), S::kF32, top_k);
}

CudaDrafter::~CudaDrafter() {
  for (auto& entry : graphs_) {
    if (entry.second.exec != nullptr) cudaGraphExecDestroy(entry.second.exec);
  }
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  if (lt_ != nullptr) cublasLtDestroy(lt_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

std::string CudaDrafter::name() const { return std::string("cuda-") + precision_name(settings_.precision); }

std::vector<std::pair<std::string, std::string>> CudaDrafter::describe() const {
  std::vector<std::pair<std::string, std::string>> d;
  d.emplace_back("implementation", "cuda");
#ifdef DFLASH_FAULT_POINTS
  d.emplace_back("planted_mutation", mutation_id(mutation_));  // a build for the catch suite
#endif
  d.emplace_back("device", device_name_);
  const char* precision_source =
      options_.precision.empty() ? "settings" : "DFLASH_CUDA_PRECISION / CudaOptions::precision";
  d.emplace_back("precision", std::string(precision_name(settings_.precision)) + " (from " + precision_source + ")");
  const bool nvfp4 = weights_.lm_head_nvfp4.present();
  d.emplace_back("weights", std::string(fp8_ ? (nvfp4 ? "q/k/v/o/gate/up/down E4M3 per-row scales (quantized on the device); "
                                                        "fc, norms, embed_tokens bf16"
                                                      : "q/k/v/o/gate/up/down and lm_head E4M3 per-row scales (quantized on "
                                                        "the device); fc, norms, embed_tokens bf16")
                                             : (nvfp4 ? "all bf16 but the lm_head" : "all bf16")));
  d.emplace_back("lm_head_format", nvfp4 ? "nvfp4" : fp8_ ? "e4m3 (per-row, quantized on the device)" : "bf16");
  d.emplace_back("lm_head_kernel",
                 nvfp4 ? "gemm_nvfp4 (w4a16: E2M1 codes and E4M3 block scales decoded to bf16 in registers, bf16 "
                         "activations, mma.sync fp32 accumulation, weight_scale_2 once per output; M = the propose's "
                         "batch x (width - 1) draft rows)"
                       : "the block GEMM (kernel.gemm)");
  d.emplace_back("activation_quantization",
                 w8a8_ ? "per token (row) to E4M3 before every E4M3 GEMM (q/k/v/o/gate/up/down" +
                             std::string(nvfp4 ? "" : " and the lm_head") +
                             "): scale max(amax, 2^-9) / 448, quantize_activations_kernel; gemm_w8a8; a "
                             "checkpoint's static input_scale replaces the per-token scale of its projection (one "
                             "quantization per projection of a fused weight)"
                       : "none (bf16 activations)");
  d.emplace_back("logits_dtype", "f32");
  d.emplace_back("activations", "fp32 accumulation; bf16 storage of ctx_proj, cached/block K and V, q after RoPE, "
                                "attn_norm, attention output, mlp_norm, silu(gate)*up, final_norm; fp32 residual "
                                "stream, GEMM outputs and logits");
  d.emplace_back("context_input", "bf16 (F32 context rows are rounded to nearest even)");
  if (config_.dflash2.enabled) {
    const Dflash2Config& d2 = config_.dflash2;
    std::string layers;
    for (bool sliding : d2.sliding) layers += sliding ? 'S' : 'F';
    d.emplace_back("dflash2",
                   "grouped convolutions (k " + std::to_string(d2.conv_kernel_size) + ", G " +
                       std::to_string(d2.conv_group_size) +
                       "; kernel_projection bf16, coefficients stored bf16, conv_prepare/conv_finish kernels per "
                       "(sequence, channel)); layers " + layers + " (S sliding, W " + std::to_string(d2.sliding_window) +
                       ": per-row left edge in the attention kernel); selector top-" + std::to_string(d2.selector_top_k) +
                       " (kernel.selector_topk), hidden_projection bf16, edge scores (one warp each) and greedy walk "
                       "(one warp per sequence); the walk's tokens are the draft tokens");
  }
  for (auto& entry : describe_kernel_plan(plan_, w8a8_)) d.push_back(entry);
  d.emplace_back("graphs", options_.graphs ? "on: one CUDA graph per (block width, batch size), captured after " +
                                                 std::to_string(options_.warmup) +
                                                 " eager passes; taps come from a second, eager pass compared bit "
                                                 "for bit with the judged one"
                                           : "off (eager launches)");
  d.emplace_back("tp_size", std::to_string(tp_));
  d.emplace_back("tp_reduce_dtype", std::string(tp_reduce_dtype_name(settings_.tp_reduce_dtype)) +
                                        (tp_ == 1 ? " (no effect: one rank, no reduction)" : ""));
  d.emplace_back("tensor_parallel",
                 tp_ == 1 ? "off"
                          : std::to_string(tp_) +
                                " fake shards on one device (docs/spec/tensor-parallel.md): o_proj and down_proj as " +
                                std::to_string(tp_) +
                                " partial GEMMs over contiguous K slices (full-row fp8 scales), summed in rank order "
                                "from rank 0 by tp_reduce_rows_kernel, bias once after; the lm_head as " +
                                std::to_string(tp_) +
                                " vocabulary shards" + (nvfp4 ? " (the NVFP4 head computed whole, its columns as the shards)" : "") +
                                ", their best tokens merged by vocab_parallel_argmax_kernel; q|k|v, gate|up, attention "
                                "and the K/V cache run once over every shard's heads and columns (§3: an element's "
                                "order depends on K alone); no PDL inside a row-parallel GEMM");
  d.emplace_back("kv_cache", "paged bf16, one pool per layer: " + std::to_string(settings_.pool_pages) + " pages x " +
                                 std::to_string(settings_.kv_page_size) + " tokens; retains " +
                                 retained_context_rule(config_, settings_) + " context positions per sequence");
  d.emplace_back("scratch", std::to_string(settings_.max_batch) + " sequences x " + std::to_string(max_width_) +
                                " block rows; context chunks of " + std::to_string(kContextChunkRows) + " rows");
  return d;
}

void CudaDrafter::poison_pages(const std::vector<int>& pages) {
  // 0xFFFF is a bf16 NaN; stream-ordered before the context rows that reuse a page are written.
  const size_t page_bytes = static_cast<size_t>(settings_.kv_page_size) * static_cast<size_t>(config_.kv_dim()) * 2;
  for (int l = 0; l < config_.num_layers; ++l) {
    for (const DeviceBuffer<uint16_t>* pool : {&k_pool_[static_cast<size_t>(l)], &v_pool_[static_cast<size_t>(l)]}) {
      for (int page : pages) {
        uint8_t* base = reinterpret_cast<uint8_t*>(pool->get()) + static_cast<size_t>(page) * page_bytes;
        DFLASH_CUDA_CHECK(cudaMemsetAsync(base, 0xFF, page_bytes, stream_));
      }
    }
  }
}

std::optional<KvRows> CudaDrafter::read_kv(int layer, const std::vector<int64_t>& slots) const {
  if (layer < 0 || layer >= config_.num_layers) throw bad_input("read_kv: no layer " + std::to_string(layer));
  const int64_t kv_dim = config_.kv_dim();
  const int64_t pool_slots = static_cast<int64_t>(settings_.pool_pages) * settings_.kv_page_size;
  const int64_t n = static_cast<int64_t>(slots.size());
  KvRows out{Tensor::zeros({n, kv_dim}), Tensor::zeros({n, kv_dim})};
  DFLASH_CUDA_CHECK(cudaStreamSynchronize(stream_));
  std::vector<uint16_t> bits(static_cast<size_t>(kv_dim));
  for (bool key : {true, false}) {
    const uint16_t* pool = (key ? k_pool_ : v_pool_)[static_cast<size_t>(layer)].get();
    Tensor& dst = key ? out.k : out.v;
    // Many slots: one copy of the whole pool; a few: one copy per slot.
    std::vector<uint16_t> whole;
    if (n * 4 >= pool_slots) {
      whole.resize(static_cast<size_t>(pool_slots * kv_dim));
      DFLASH_CUDA_CHECK(cudaMemcpy(whole.data(), pool, whole.size() * 2, cudaMemcpyDeviceToHost));
    }
    for (int64_t i = 0; i < n; ++i) {
      const int64_t slot = slots[static_cast<size_t>(i)];
      if (slot < 0 || slot >= pool_slots) {
        throw bad_input("read_kv: slot " + std::to_string(slot) + " outside the pool of " + std::to_string(pool_slots));
      }
      const uint16_t* row = whole.data() + slot * kv_dim;
      if (whole.empty()) {
        DFLASH_CUDA_CHECK(cudaMemcpy(bits.data(), pool + slot * kv_dim, bits.size() * 2, cudaMemcpyDeviceToHost));
        row = bits.data();
      }
      for (int64_t c = 0; c < kv_dim; ++c) dst.row(i)[c] = bf16_bits_to_float(row[c]);
    }
  }
  return out;
}

std::vector<AttentionSpan> CudaDrafter::attention_spans() const {
  const size_t nb = last_seqs_.size();
  std::vector<int64_t> begin(nb);
  std::vector<int32_t> length(nb);
  DFLASH_CUDA_CHECK(cudaStreamSynchronize(stream_));
  DFLASH_CUDA_CHECK(cudaMemcpy(begin.data(), d_window_begin_.get(), nb * 8, cudaMemcpyDeviceToHost));
  DFLASH_CUDA_CHECK(cudaMemcpy(length.data(), d_window_length_.get(), nb * 4, cudaMemcpyDeviceToHost));
  std::vector<AttentionSpan> spans;
  for (size_t b = 0; b < nb; ++b) spans.push_back({last_seqs_[b], begin[b], begin[b] + length[b] - 1});
  return spans;
}

}  // namespace dflash
