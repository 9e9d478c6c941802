// The CUDA drafter's class, visible to the GPU tests and the benchmarks (callers of the factory
// only see DraftProposer; what the tests and benchmarks ask beyond it is in
// testing/cuda_drafter_debug.h). One propose runs in two phases:
//  1. context ingestion (eager, variable size): the admitted context rows, in chunks of
//     kContextChunkRows, through fc, hidden_norm and every layer's k/v projection, k_norm and RoPE,
//     into the paged pools at the slots KvPageTable::admit decided;
//  2. the block forward (fixed shape per (block width, batch size)): embedding to draft tokens,
//     captured as a CUDA graph after `warmup` eager passes. Every per-step value (anchors, positions,
//     windows, block tables) is read from device buffers, so a replay with new values is correct.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "core/kv_pages.h"
#include "core/paged_proposer.h"
#include "core/proposer.h"
#include "core/rope.h"
#include "core/stages.h"
#include "core/weights.h"
#include "cuda/kernels/selector/candidate_selector.h"
#include "cuda/drafter/cuda_drafter.h"
#include "cuda/runtime/device_buffer.h"
#include "cuda/drafter/device_weights.h"
#include "cuda/kernels/conv/grouped_conv.h"
#include "cuda/drafter/kernel_plan.h"
#include "cuda/tp/tp_reduce.h"
#include "testing/fault_points.h"

namespace dflash {

class CudaDrafter final : public PagedProposer {
 public:
  static constexpr int64_t kContextChunkRows = 256;

  CudaDrafter(const DrafterConfig& config, std::shared_ptr<const DrafterWeights> weights, const HeadSettings& settings,
              const CudaOptions& options);
  ~CudaDrafter() override;
  CudaDrafter(const CudaDrafter&) = delete;
  CudaDrafter& operator=(const CudaDrafter&) = delete;

  std::string name() const override;
  std::vector<ProposeOutput> propose(const std::vector<ProposeInput>& batch, bool want_taps) override;
  std::vector<std::pair<std::string, std::string>> describe() const override;
  // Read-back (test/debug, synchronizes the stream): the pools' bf16 K/V as floats, and the window
  // each sequence's attention kernel was handed (the device copies of window_begin/window_length).
  std::optional<KvRows> read_kv(int layer, const std::vector<int64_t>& slots) const override;
  std::vector<AttentionSpan> attention_spans() const override;


 private:
  friend struct CudaDrafterDebug;  // testing/cuda_drafter_debug.cc
  struct TapSink;
  void poison_pages(const std::vector<int>& pages) override;
  struct GraphEntry {
    int eager_runs = 0;
    cudaGraphExec_t exec = nullptr;
  };

  // Construction, in order: the geometry's sizes, the device (stream, kernels prepared), the plan
  // resolved against the device and geometry (fallbacks, cuBLASLt, the GEMM context), the weights
  // and pools uploaded, the scratch allocated, the tap table built.
  void size_geometry();
  void set_up_device();
  void resolve_plan();
  void upload_weights();
  void allocate_buffers();
  void build_tap_table();

  void ingest_context(const std::vector<ProposeInput>& batch, const std::vector<ContextAdmission>& admissions,
                      TapSink* taps);
  void upload_step(const std::vector<ProposeInput>& batch);
  // The block forward as shipped (no taps): eager during warmup or with graphs off, else the
  // graph of (block_width, batch), captured on first use. Returns ForwardPath::mode's value.
  const char* run_block_forward(int batch, int block_width);
  // One launch of the block forward, named by its kernel class ("embed", "rmsnorm", "qkv",
  // "qk_norm_rope", "attention_chunks", "combine", "o", "gate_up", "swiglu", "down", "lm_head",
  // "argmax"; w8a8: "act_quant"; DFlash2: "conv_coef", "conv", "hidden_proj", "selector_topk",
  // "selector_walk"), with
  // what it runs at this shape (its launch plan entry) and the stages whose values it completes
  // (read from tap_sources_ right after it when taps are asked). The block forward is this list
  // run in order; the benchmark times it without a class by running the same list without that
  // class's launches (testing/cuda_drafter_debug.h).
  struct ForwardLaunch {
    const char* kernel_class;
    std::function<void()> enqueue;
    std::string runs;
    std::vector<StageId> ready;
  };
  // taps: the tapped pass (pdl off, the residual GEMMs' copies for the o_proj and mlp taps).
  std::vector<ForwardLaunch> block_forward_launches(int batch, int block_width, TapSink* taps);
  // Runs the list; the judged pass (no taps) records the shape's launch plan in launch_plans_.
  void enqueue_block_forward(int batch, int block_width, TapSink* taps);
  // A block GEMM's launch plan entry: kernel, weight format and CTA shape, as gemm() decides them.
  std::string gemm_runs(GemmKernel kernel, int64_t m, const DeviceMatrixView& w) const;
  // pdl: inside the block forward, after its first kernel (context ingestion follows host copies).
  // parts (w8a8 with static activation scales): the weight's projections, each quantizing the input
  // rows with its own scale.
  void enqueue_gemm(bool pdl, GemmKernel kernel, const uint16_t* a, int64_t lda, int64_t m, const DeviceMatrixView& w,
                    const GemmEpilogue& epilogue, const std::vector<ActivationPart>& parts = {});
  // The static activation scale of a weight quantized as one projection (0: per token); an
  // internal error where `parts` is not one part spanning the weight's rows.
  static float one_part_scale(const DeviceMatrixView& w, const std::vector<ActivationPart>& parts);
  // w8a8's two halves of one projection's GEMM: the input rows quantized into act_codes_ and
  // act_scales_ (per token, or with static_scale > 0), then the E4M3 GEMM over them.
  void enqueue_activation_quantization(bool pdl, const uint16_t* a, int64_t lda, int64_t m, const DeviceMatrixView& w,
                                       float static_scale);
  void enqueue_quantized_gemm(bool pdl, GemmKernel kernel, int64_t m, const DeviceMatrixView& w,
                              const GemmEpilogue& epilogue);
  // The forward's operands, the same for the block and the context rows: RMSNorm of the
  // [rows, hidden] fp32 `in` (h, or the context rows' fc output) with `weight` into `out` (and the
  // draft rows into draft_out, when set); the GEMM epilogues of q|k|v, of o and down (h += ·, and a
  // copy to tap_out unless it is null), of gate|up (the fused SwiGLU or the raw pair) and of the
  // lm_head (logits and argmax partials).
  RmsNormArgs rmsnorm_args(const float* in, const float* weight, uint16_t* out, uint16_t* draft_out, int width,
                          int64_t rows) const;
  GemmEpilogue qkv_epilogue() const;
  GemmEpilogue residual_epilogue(float* tap_out) const;
  GemmEpilogue gate_up_epilogue() const;
  GemmEpilogue lm_head_epilogue() const;
  static GemmEpilogue plain_epilogue(float* out, int64_t ld_out);  // out = v (DFlash2's o and down, before finish)
  // DFlash2: the layer's grouped convolution (docs/spec/dflash2.md §3.1) and the selector's arguments.
  GroupedConvArgs conv_args(const DeviceBuffer<float>& base, int batch, int block_width) const;
  SelectorArgs selector_args(int batch, int block_width) const;

  // How a tapped buffer holds its values.
  enum class TapStorage {
    kF32,
    kBf16,
    kF32ReadAsBf16,  // fp32 that every reader rounds to bf16 first (the conv coefficients)
    kI32,            // exact integers (the top-k ids)
  };
  // Where a tapped stage's values are once its launch ran: [batch·rows, ld] on the device, rows per
  // sequence the block width (draft_rows: width - 1), the tap [rows, cols] or [rows, row_shape...].
  struct TapSource {
    const void* buffer = nullptr;
    TapStorage storage = TapStorage::kF32;
    int64_t cols = 0, ld = 0;
    bool draft_rows = false;
    std::vector<int64_t> row_shape;
  };

  std::shared_ptr<const DrafterWeights> host_weights_;
  CudaOptions options_;
  KernelPlan plan_;
  bool fp8_ = true;    // E4M3 projection weights (fp8 and w8a8)
  bool w8a8_ = false;  // and E4M3 activations: every E4M3 GEMM's input rows quantized per token
  bool quantizes_activations(const DeviceMatrixView& w) const { return w8a8_ && w.format == WeightFormat::kE4M3; }
  // docs/spec/tensor-parallel.md at TP = N > 1, as N fake shards on this device: o_proj and
  // down_proj as N partial GEMMs over contiguous K slices, reduced in rank order (tp_reduce.h); the
  // lm_head as N vocabulary shards merged by (value, lowest global index) (vocab_parallel.h). The
  // column-parallel GEMMs run once over the union of the shards' columns: an element's order depends
  // on K alone (§3's decision), so the shards' launches would give the same bits.
  int tp_ = 1;
  TpWire tp_wire_ = TpWire::kFp32;
  int max_width_ = 2;       // max(gamma, 2)
  int64_t max_window_ = 0;  // context positions a sequence can attend to
  int max_pages_per_seq_ = 0;
  int max_chunks_ = 0;
  RopeTable rope_;
  std::string device_name_;

  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  DeviceBuffer<uint8_t> lt_workspace_;
  DeviceBuffer<uint8_t> cutlass_workspace_;
  DeviceBuffer<float> gemm_raw_;
  int sm_count_ = 0;
  GemmContext gemm_ctx_;

  DeviceDrafterWeights weights_;
  DeviceBuffer<float> inv_freq_;
  std::vector<DeviceBuffer<uint16_t>> k_pool_, v_pool_;  // per layer [slots, kv_dim] bf16

  // Padded leading dimensions (multiples of 64) of the GEMM operands.
  int64_t ld_hidden_ = 0, ld_q_ = 0, ld_inter_ = 0, ld_ctx_ = 0;

  // Block-row scratch, sized for max_batch sequences of max_width_ rows.
  DeviceBuffer<float> h_, o_out_, mlp_out_, qkv_out_, gate_up_out_, logits_, argmax_value_, attn_partial_,
      attn_max_sum_;
  DeviceBuffer<uint16_t> x_, y_, q_, k_block_, v_block_, attn_, act_, hf_, hf_draft_;
  DeviceBuffer<int32_t> argmax_index_, tokens_;
  // DFlash2 only: the kernel_projection outputs (prepare to finish), the convolution's output (taps
  // only), and the selector's buffers (cuda/kernels/selector/candidate_selector.h).
  DeviceBuffer<float> conv_coef_, conv_out_, hidden_proj_, topk_values_, unary_, edge_scores_, walk_scores_;
  DeviceBuffer<uint64_t> topk_keys_;  // the threshold top-K's per-slice keys
  DeviceBuffer<int32_t> topk_ids_, walk_index_;
  // Per-step inputs of the block forward (device, and pinned staging for the upload).
  DeviceBuffer<int32_t> d_anchors_, d_window_length_, d_block_tables_;
  DeviceBuffer<int64_t> d_positions_, d_window_begin_, d_first_page_;
  PinnedBuffer<int32_t> h_anchors_, h_window_length_, h_block_tables_;
  PinnedBuffer<int64_t> h_positions_, h_window_begin_, h_first_page_;
  PinnedBuffer<float> h_logits_;
  PinnedBuffer<int32_t> h_tokens_;
  // Context staging.
  PinnedBuffer<uint16_t> h_ctx_;
  PinnedBuffer<int64_t> h_ctx_positions_, h_ctx_slots_;
  DeviceBuffer<uint16_t> d_ctx_, xc_;
  DeviceBuffer<int64_t> d_ctx_positions_, d_ctx_slots_;
  DeviceBuffer<float> xc_f32_, kv_out_;
  // W8A8: the E4M3 codes [rows, ld_act_codes_] and row scales of the GEMM input being multiplied
  // (one at a time, on one stream).
  DeviceBuffer<uint8_t> act_codes_;
  DeviceBuffer<float> act_scales_;
  int64_t ld_act_codes_ = 0;
  // TP > 1: a rank's K slice of o_proj's and of down_proj's input (each zero past its slice, so a
  // GEMM's padded K reads zeros), the ranks' fp32 partials [N, rows, H], and the lm_head shards'
  // logits [N, draft rows, ld_tp_vocab_].
  DeviceBuffer<uint16_t> tp_attn_slice_, tp_act_slice_;
  DeviceBuffer<float> tp_partials_, tp_logits_;
  // Rank r's partial [rows, H] in tp_partials_ (one definition for the GEMMs, the reduction and the taps).
  float* tp_partial(int rank, int64_t rows) const { return tp_partials_.get() + rank * rows * config_.hidden_size; }
  int64_t ld_tp_attn_ = 0, ld_tp_act_ = 0, ld_tp_vocab_ = 0;

  std::map<StageKind, TapSource> tap_sources_;  // every stage the block forward taps
  std::map<std::pair<int, int>, GraphEntry> graphs_;  // (block width, batch size)
  // What the judged block forward runs per (block width, batch size): kernel class -> what
  // (ForwardPath::plan), recorded by its first eager pass or its capture.
  std::map<std::pair<int, int>, std::vector<std::pair<std::string, std::string>>> launch_plans_;
  int last_batch_ = 0, last_width_ = 0;
  std::vector<int> last_seqs_;  // the sequences of the last propose, in batch order
#ifdef DFLASH_FAULT_POINTS
  Mutation mutation_ = Mutation::kNone;  // the planted bug of this process (testing/fault_points.h)
#endif
};

}  // namespace dflash
