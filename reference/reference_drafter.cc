// The reference DraftProposer: validates a batched propose completely before anything changes,
// lets KvPageTable decide the slots (atomically), then hands the numbers to the engine of its
// precision (engine.h).
#include "reference/reference_drafter.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>

#include "core/error.h"
#include "core/kv_pages.h"
#include "core/paged_proposer.h"
#include "reference/engine.h"
#include "reference/ops/ops.h"
#include "reference/prepared_weights.h"
#include "reference/reference_options.h"
#include "reference/stage_policy.h"

namespace dflash {
namespace {

class ReferenceDrafter final : public PagedProposer {
 public:
  ReferenceDrafter(const DrafterConfig& config, std::shared_ptr<const DrafterWeights> weights,
                   const HeadSettings& settings, const ReferenceOptions& options)
      : PagedProposer(checked_config(config), checked_tensor_parallel(settings.resolved(config))),
        weights_(checked_weights(config, std::move(weights))),
#ifdef DFLASH_FAULT_POINTS
        fp8_fault_(checked_fault(options.fp8_fault, settings_.precision)),
        dflash2_fault_(checked_dflash2_fault(options.dflash2_fault, config_)),
        rounding_fault_(checked_rounding_fault(options.rounding_fault, settings_.precision)),
        tp_fault_(checked_tp_fault(options.tp_fault, settings_.tp_size, config_)),
        fault_(options.fault),
#endif
        engine_(make_drafter_engine(config_, *weights_, policy(),
                                    static_cast<int64_t>(settings_.pool_pages) * settings_.kv_page_size,
                                    options.threads)) {
    poison_free_pool();
  }

  std::string name() const override {
    const std::string name = std::string("reference-") + precision_name(settings_.precision);
#ifndef DFLASH_FAULT_POINTS
    return name;
#else
    std::string planted = fp8_fault_ == Fp8Fault::kNone ? name : name + "+" + fp8_fault_name(fp8_fault_);
    if (rounding_fault_ != RoundingFault::kNone) planted += std::string("+") + rounding_fault_name(rounding_fault_);
    if (tp_fault_ != TpFault::kNone) planted += std::string("+") + tp_fault_name(tp_fault_);
    return dflash2_fault_ == Dflash2Fault::kNone ? planted : planted + "+" + dflash2_fault_name(dflash2_fault_);
#endif
  }

  std::vector<ProposeOutput> propose(const std::vector<ProposeInput>& batch, bool want_taps) override {
    // Bad inputs, gaps, overlaps, C = 0 on an empty sequence, a full pool: refused here with
    // nothing changed.
    const std::vector<ContextAdmission> admissions = admit_context(batch);

    std::vector<SequenceStep> steps(batch.size());
    for (size_t b = 0; b < batch.size(); ++b) {
      SequenceStep& s = steps[b];
      s.seq = batch[b].seq;
      s.ctx = batch[b].ctx;
      s.first_row = admissions[b].first_row;
      s.first_position = admissions[b].first_position;
      s.new_slots = admissions[b].slots;
      s.window_slots = table_.window_slots(s.seq);
      s.start = batch[b].start;
      s.anchor = batch[b].anchor;
#ifdef DFLASH_FAULT_POINTS
      plant_fault(&s);
#endif
    }
    // What attention reads: the slot list it is handed, the window ending just before the anchor.
    spans_.clear();
    for (const SequenceStep& s : steps) {
      spans_.push_back({s.seq, s.start - static_cast<int64_t>(s.window_slots.size()), s.start - 1});
    }
#ifdef DFLASH_FAULT_POINTS
    plant_graph_fault(&steps);  // after the spans: a graph's stale inputs leave the window it reports right
#endif
    std::vector<ProposeOutput> outputs = engine_->propose(steps, block_g_, want_taps);
#ifdef DFLASH_FAULT_POINTS
    if (fault_ == PlantedFault::kKeepsBlockRow) keep_block_rows(steps);
    if (fault_ == PlantedFault::kStaleKey) write_stale_key(steps);
#endif
    return outputs;
  }

  std::optional<KvRows> read_kv(int layer, const std::vector<int64_t>& slots) const override {
    return engine_->read_kv(layer, slots);
  }
  std::vector<AttentionSpan> attention_spans() const override { return spans_; }


  std::vector<std::pair<std::string, std::string>> describe() const override {
    const StagePolicy policy = StagePolicy::for_precision(settings_.precision);
    std::vector<std::pair<std::string, std::string>> d = {
        {"drafter", "CPU reference"},
        {"precision", precision_name(settings_.precision)},
        {"compute_type", engine_->compute_type()},
        {"bf16_storage", policy.round_bf16 ? std::string("rounded at: ") + kBf16StorageStages : "off"},
        {"fp8_weights", !policy.fp8_weights ? "off"
                        : weights_->nvfp4_head() ? "q/k/v/o/gate/up/down per-row E4M3 (core/fp8.h); lm_head NVFP4 as it is; fc bf16"
                                                 : "q/k/v/o/gate/up/down and lm_head per-row E4M3 (core/fp8.h); fc bf16"},
        {"fp8_activations", fp8_activations_description(policy)},
        {"lm_head_format", weights_->nvfp4_head() ? "nvfp4" : "bf16"},
        {"lm_head_compute", !weights_->nvfp4_head() ? "as the other projections"
                            : policy.use_double ? "exact dequantization e2m1 * e4m3 * weight_scale_2 in fp64"
                                                : "w4a16 emulation: e2m1 * e4m3 (exact in fp32) times the activations, fp32 "
                                                  "accumulation, weight_scale_2 once per output"},
        {"threads", std::to_string(engine_->threads())},
        {"simd_target", ops::dispatch_target_name()},
        {"gemm", "Eigen GEMV per activation row over fixed chunks of weight rows (batch- and thread-invariant)"},
        {"exp", "Highway contrib Exp (<= 1 ulp) in softmax and SiLU"},
        {"gamma", std::to_string(settings_.gamma)},
        {"block_g", std::to_string(block_g_)},
        {"ctx_cap", settings_.uncapped ? "uncapped" : std::to_string(settings_.ctx_cap)},
        {"retained_context", retained_context_rule(config_, settings_)},
        {"max_batch", std::to_string(settings_.max_batch)},
        {"kv_page_size", std::to_string(settings_.kv_page_size)},
        {"pool_pages", std::to_string(settings_.pool_pages)},
        {"page_order_seed", std::to_string(settings_.page_order_seed)},
        {"tp_size", std::to_string(settings_.tp_size)},
        {"tp_reduce_dtype", settings_.tp_size == 1 ? std::string(tp_reduce_dtype_name(settings_.tp_reduce_dtype)) +
                                                         " (no effect: one rank, no reduction)"
                                                   : std::string(tp_reduce_dtype_name(settings_.tp_reduce_dtype))},
        {"tensor_parallel", settings_.tp_size == 1
                                ? "off"
                                : "emulated (docs/spec/tensor-parallel.md): o_proj and down_proj as " +
                                      std::to_string(settings_.tp_size) +
                                      " row-parallel partials summed in rank order from rank 0, bias once after; "
                                      "column-parallel and vocabulary-parallel stages are TP = 1's (§3, §5); "
                                      "each rank's partial tapped as L{l}.o_proj|mlp.partial@r{rank} (§7)"},
    };
#ifdef DFLASH_FAULT_POINTS
    d.emplace_back("fp8_fault", fp8_fault_ == Fp8Fault::kNone ? "none" : std::string("PLANTED: ") + fp8_fault_name(fp8_fault_));
    d.emplace_back("rounding_fault", rounding_fault_ == RoundingFault::kNone
                                         ? "none"
                                         : std::string("PLANTED: ") + rounding_fault_name(rounding_fault_));
    d.emplace_back("dflash2_fault", dflash2_fault_ == Dflash2Fault::kNone
                                        ? "none"
                                        : std::string("PLANTED: ") + dflash2_fault_name(dflash2_fault_));
    d.emplace_back("tp_fault", tp_fault_ == TpFault::kNone ? "none" : std::string("PLANTED: ") + tp_fault_name(tp_fault_));
#endif
    return d;
  }

 private:
  // What the reference's TP = N emulation does not cover, refused by name (resolved settings).
  static const HeadSettings& checked_tensor_parallel(const HeadSettings& s) {
    if (s.tp_size == 1) return s;
    const StagePolicy policy = StagePolicy::for_precision(s.precision);
    if (s.tp_reduce_dtype == TpReduceDtype::kBf16 && !policy.round_bf16) {
      throw bad_input(std::string("reference drafter: tp_reduce_dtype 'bf16' needs a precision with bf16 storage "
                                  "(bf16, fp8, w8a8), not ") + precision_name(s.precision) +
                      ", which rounds nothing to bf16; refusing");
    }
    if (policy.fp8_activations) {
      // A rank quantizes its own slice of a row-parallel input; docs/spec/tensor-parallel.md does not
      // state those per-slice activation scales.
      throw bad_input("reference drafter: tp_size " + std::to_string(s.tp_size) +
                      " with w8a8: docs/spec/tensor-parallel.md does not state the row-parallel activation scales; "
                      "refusing");
    }
    return s;
  }

  static const DrafterConfig& checked_config(const DrafterConfig& c) {
    const auto fail = [](const std::string& what) { throw bad_input("reference drafter: config: " + what); };
    if (c.hidden_size < 1 || c.num_layers < 1 || c.num_heads < 1 || c.num_kv_heads < 1 || c.head_dim < 1 ||
        c.intermediate_size < 1 || c.vocab_size < 1 || c.num_target_layers() < 1 || c.target_hidden_size < 1) {
      fail("every size (hidden_size, num_hidden_layers, heads, head_dim, intermediate_size, vocab_size, "
           "target layers, target hidden size) must be >= 1");
    }
    if (c.head_dim % 2 != 0) fail("head_dim " + std::to_string(c.head_dim) + " is odd; rotate-half RoPE needs pairs");
    if (c.num_heads % c.num_kv_heads != 0) {
      fail("num_attention_heads " + std::to_string(c.num_heads) + " is not a multiple of num_key_value_heads " +
           std::to_string(c.num_kv_heads));
    }
    if (c.mask_token_id < 0 || c.mask_token_id >= c.vocab_size) {
      fail("mask_token_id " + std::to_string(c.mask_token_id) + " outside [0, " + std::to_string(c.vocab_size) + ")");
    }
    if (!(c.rms_norm_eps > 0)) fail("rms_norm_eps must be > 0");
    return c;
  }

  static std::shared_ptr<const DrafterWeights> checked_weights(const DrafterConfig& config,
                                                               std::shared_ptr<const DrafterWeights> weights) {
    if (!weights) throw bad_input("reference drafter: no weights given");
    validate_drafter_weights(config, *weights);
    check_weights_finite(*weights);
    return weights;
  }

  int64_t pool_slots() const { return static_cast<int64_t>(settings_.pool_pages) * settings_.kv_page_size; }

  // What w8a8 does to the GEMMs' input rows, and which projections carry a static input_scale.
  std::string fp8_activations_description(const StagePolicy& policy) const {
    if (!policy.fp8_activations) return "off";
    int with_static = 0, projections = 0;
    const auto count = [&](const std::optional<float>& scale) {
      ++projections;
      if (scale) ++with_static;
    };
    for (const LayerWeights& L : weights_->layers) {
      for (const auto* s : {&L.q_input_scale, &L.k_input_scale, &L.v_input_scale, &L.o_input_scale,
                            &L.gate_input_scale, &L.up_input_scale, &L.down_input_scale}) {
        count(*s);
      }
    }
    if (!weights_->nvfp4_head()) count(weights_->lm_head_input_scale);
    std::string d = "input rows of q/k/v/o/gate/up/down";
    d += weights_->nvfp4_head() ? " (lm_head NVFP4: bf16 activations)" : " and lm_head";
    d += " as E4M3 per token (core/fp8.h): scale = max(amax, 2^-9) / 448 in fp32";
    if (with_static > 0) {
      d += "; a static input_scale on " + std::to_string(with_static) + " of " + std::to_string(projections) +
           " projections";
    }
    return d + "; E4M3 x E4M3 products, fp32 sums, epilogue act_scale * (weight_scale * sum)";
  }

#ifdef DFLASH_FAULT_POINTS
  // PlantedFault (negative controls): what the engine is handed, changed after the bookkeeping.
  void plant_fault(SequenceStep* s) const {
    std::vector<int64_t>& window = s->window_slots;
    switch (fault_) {
      case PlantedFault::kWrongSlot:
        if (!s->new_slots.empty()) s->new_slots.back() = (s->new_slots.back() + 1) % pool_slots();
        break;
      case PlantedFault::kStaleRead:
        if (!window.empty()) window.front() = (window.front() + pool_slots() - 1) % pool_slots();
        break;
      case PlantedFault::kReadsPastWindow:
        if (!window.empty()) window.push_back((window.back() + 1) % pool_slots());
        break;
      case PlantedFault::kNone:
      case PlantedFault::kKeepsBlockRow:
      case PlantedFault::kStaleKey:
      case PlantedFault::kBakedPageTable:
      case PlantedFault::kStaleAttentionPlan:
        break;
    }
  }

  // kBakedPageTable, kStaleAttentionPlan: a CUDA drafter's graph per (width, batch), captured at a
  // shape's second propose (one eager pass first) and replayed from its third on, emulated.
  void plant_graph_fault(std::vector<SequenceStep>* steps) {
    if (fault_ != PlantedFault::kBakedPageTable && fault_ != PlantedFault::kStaleAttentionPlan) return;
    const std::pair<int, int> shape{block_g_, static_cast<int>(steps->size())};
    const int seen = ++graph_shape_proposes_[shape];
    const bool replay = seen >= 3;
    const int64_t page = settings_.kv_page_size;
    if (fault_ == PlantedFault::kBakedPageTable) {
      // The device's table rows, by batch slot: uploaded by every propose that is not a replay.
      if (uploaded_tables_.size() < steps->size()) uploaded_tables_.resize(steps->size());
      for (size_t b = 0; b < steps->size(); ++b) {
        SequenceStep& s = (*steps)[b];
        const SequenceView view = table_.view(s.seq);
        if (!replay) {
          uploaded_tables_[b] = view.block_table;
          continue;
        }
        for (size_t i = 0; i < s.window_slots.size(); ++i) {
          const int64_t position = view.window_begin + static_cast<int64_t>(i);
          const int64_t index = position / page - view.first_logical_page;
          const std::vector<int>& baked = uploaded_tables_[b];
          const int64_t physical = index < static_cast<int64_t>(baked.size()) ? baked[static_cast<size_t>(index)] : 0;
          s.window_slots[i] = physical * page + position % page;
        }
      }
      return;
    }
    // kStaleAttentionPlan: the plan covers the longest window of the capture.
    size_t longest = 0;
    for (const SequenceStep& s : *steps) longest = std::max(longest, s.window_slots.size());
    if (seen == 2) captured_plan_[shape] = longest;
    if (!replay) return;
    for (SequenceStep& s : *steps) {
      if (s.window_slots.size() > captured_plan_[shape]) s.window_slots.resize(captured_plan_[shape]);
    }
  }

  // kKeepsBlockRow: the slot after each window receives a row (the window's newest context row
  // again, standing in for a block row's K/V that was not dropped).
  void keep_block_rows(const std::vector<SequenceStep>& steps) {
    for (const SequenceStep& s : steps) {
      if (s.new_slots.empty()) continue;
      SequenceStep kept = s;
      kept.first_row = s.first_row + static_cast<int64_t>(s.new_slots.size()) - 1;
      kept.first_position = s.start - 1;
      kept.new_slots = {(s.window_slots.back() + 1) % pool_slots()};
      engine_->ingest({kept});
    }
  }

  // kStaleKey: the first window of kStaleKeyWindow positions or more that received two rows or
  // more gets, in the slot of its middle new row, the K/V of the row before (what a stale staging
  // buffer leaves); once per drafter.
  void write_stale_key(const std::vector<SequenceStep>& steps) {
    for (const SequenceStep& s : steps) {
      const int64_t n = static_cast<int64_t>(s.new_slots.size());
      if (stale_key_written_ || n < 2 || static_cast<int64_t>(s.window_slots.size()) < kStaleKeyWindow) continue;
      SequenceStep stale = s;
      stale.first_row = s.first_row + n / 2 - 1;
      stale.first_position = s.first_position + n / 2 - 1;
      stale.new_slots = {s.new_slots[static_cast<size_t>(n / 2)]};
      engine_->ingest({stale});
      stale_key_written_ = true;
    }
  }

#endif

  // The stage policy of this drafter's precision (with its planted faults in a build with them).
  StagePolicy policy() const {
    StagePolicy p = StagePolicy::for_precision(settings_.precision);
    p.tp_size = settings_.tp_size;
    p.tp_reduce_bf16 = settings_.tp_size > 1 && settings_.tp_reduce_dtype == TpReduceDtype::kBf16;
#ifdef DFLASH_FAULT_POINTS
    p.tp_fault = tp_fault_;
    p.fp8_fault = fp8_fault_;
    p.dflash2_fault = dflash2_fault_;
    p.rounding_fault = rounding_fault_;
#endif
    return p;
  }

  void poison_pages(const std::vector<int>& pages) override {
    std::vector<int64_t> slots;
    for (int page : pages) {
      for (int i = 0; i < settings_.kv_page_size; ++i) slots.push_back(static_cast<int64_t>(page) * settings_.kv_page_size + i);
    }
    engine_->poison(slots);
  }

  const std::shared_ptr<const DrafterWeights> weights_;
#ifdef DFLASH_FAULT_POINTS
  static Fp8Fault checked_fault(Fp8Fault fault, Precision precision) {
    const StagePolicy policy = StagePolicy::for_precision(precision);
    if (fault == Fp8Fault::kUnscaledActivation && !policy.fp8_activations) {
      throw bad_input(std::string("reference drafter: the planted fp8 fault '") + fp8_fault_name(fault) +
                      "' needs precision w8a8 (quantized activations), not " + precision_name(precision));
    }
    if (fault != Fp8Fault::kNone && !policy.fp8_weights) {
      throw bad_input(std::string("reference drafter: the planted fp8 fault '") + fp8_fault_name(fault) +
                      "' needs precision fp8 or w8a8, not " + precision_name(precision));
    }
    return fault;
  }

  static Dflash2Fault checked_dflash2_fault(Dflash2Fault fault, const DrafterConfig& config) {
    if (fault != Dflash2Fault::kNone && !config.dflash2.enabled) {
      throw bad_input(std::string("reference drafter: the planted DFlash2 fault '") + dflash2_fault_name(fault) +
                      "' needs a DFlash2 drafter");
    }
    return fault;
  }

  static TpFault checked_tp_fault(TpFault fault, int tp_size, const DrafterConfig& config) {
    const std::string planted = std::string("reference drafter: the planted TP fault '") + tp_fault_name(fault) + "'";
    if (fault != TpFault::kNone && tp_size == 1) throw bad_input(planted + " needs tp_size > 1; refusing");
    if (fault == TpFault::kShardTopKUnmerged && !config.dflash2.enabled) {
      throw bad_input(planted + " needs a DFlash2 drafter (its selector's top-K); refusing");
    }
    if (fault == TpFault::kWrongShardKvHeads && config.num_kv_heads % tp_size != 0) {
      throw bad_input(planted + " needs tp_size " + std::to_string(tp_size) + " to divide num_key_value_heads " +
                      std::to_string(config.num_kv_heads) + " (split KV heads); refusing");
    }
    return fault;
  }

  static RoundingFault checked_rounding_fault(RoundingFault fault, Precision precision) {
    if (fault != RoundingFault::kNone && !StagePolicy::for_precision(precision).round_bf16) {
      throw bad_input(std::string("reference drafter: the planted rounding fault '") + rounding_fault_name(fault) +
                      "' needs precision bf16, fp8 or w8a8 (bf16 storage), not " + precision_name(precision));
    }
    return fault;
  }

  const Fp8Fault fp8_fault_;
  const Dflash2Fault dflash2_fault_;
  const RoundingFault rounding_fault_;
  const TpFault tp_fault_;
  const PlantedFault fault_;
  bool stale_key_written_ = false;  // kStaleKey plants one key per drafter
  // The graph faults' emulation: proposes per (width, batch); the block tables last uploaded per
  // batch slot; the plan (longest window) of each captured shape.
  std::map<std::pair<int, int>, int> graph_shape_proposes_;
  std::vector<std::vector<int>> uploaded_tables_;
  std::map<std::pair<int, int>, size_t> captured_plan_;
#endif
  std::unique_ptr<DrafterEngine> engine_;
  std::vector<AttentionSpan> spans_;
};

}  // namespace

int reference_threads_from_env() {
  const char* text = std::getenv("DFLASH_REF_THREADS");
  if (!text) return 1;
  const std::string value(text);
  char* end = nullptr;
  const long parsed = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || parsed < 1 || parsed > 1024) {
    throw bad_input("DFLASH_REF_THREADS='" + value + "': expected an integer thread count in [1, 1024]");
  }
  return static_cast<int>(parsed);
}

std::unique_ptr<DraftProposer> make_reference_drafter(const DrafterConfig& config,
                                                      std::shared_ptr<const DrafterWeights> weights,
                                                      const HeadSettings& settings, const ReferenceOptions& options) {
  return std::make_unique<ReferenceDrafter>(config, std::move(weights), settings, options);
}

ContextKvFunction make_reference_context_kv(const DrafterConfig& config,
                                            std::shared_ptr<const DrafterWeights> weights, Precision precision,
                                            int64_t max_rows) {
  if (!weights) throw bad_input("reference context K/V: no weights given");
  validate_drafter_weights(config, *weights);
  std::shared_ptr<DrafterEngine> engine(
      make_drafter_engine(config, *weights, StagePolicy::for_precision(precision), std::max<int64_t>(max_rows, 1), reference_threads_from_env()));
  const int layers = config.num_layers;
  const int64_t chunk = std::max<int64_t>(max_rows, 1);
  return [engine, weights, layers, chunk](const Tensor& rows, int64_t first_position) {
    std::vector<KvRows> out(static_cast<size_t>(layers));
    std::vector<std::vector<float>> k(static_cast<size_t>(layers)), v(static_cast<size_t>(layers));
    int64_t kv_dim = 0;
    // The engine's pools hold `chunk` rows: longer windows go through in chunks (rows are independent).
    for (int64_t begin = 0; begin < rows.rows(); begin += chunk) {
      SequenceStep step;
      step.ctx = &rows;
      step.first_row = begin;
      step.first_position = first_position + begin;
      for (int64_t i = 0; i < std::min(chunk, rows.rows() - begin); ++i) step.new_slots.push_back(i);
      step.window_slots = step.new_slots;
      engine->ingest({step});
      for (int l = 0; l < layers; ++l) {
        const KvRows part = engine->read_kv(l, step.new_slots);
        kv_dim = part.k.cols();
        k[static_cast<size_t>(l)].insert(k[static_cast<size_t>(l)].end(), part.k.values.begin(), part.k.values.end());
        v[static_cast<size_t>(l)].insert(v[static_cast<size_t>(l)].end(), part.v.values.begin(), part.v.values.end());
      }
    }
    for (int l = 0; l < layers; ++l) {
      out[static_cast<size_t>(l)] = {Tensor({rows.rows(), kv_dim}, std::move(k[static_cast<size_t>(l)])),
                                     Tensor({rows.rows(), kv_dim}, std::move(v[static_cast<size_t>(l)]))};
    }
    return out;
  };
}

std::unique_ptr<DraftProposer> make_reference_drafter(const DrafterConfig& config,
                                                      std::shared_ptr<const DrafterWeights> weights,
                                                      const HeadSettings& settings) {
  return make_reference_drafter(config, std::move(weights), settings, ReferenceOptions{reference_threads_from_env()});
}

}  // namespace dflash
