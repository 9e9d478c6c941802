// The reference DraftProposer: validates a batched propose completely before anything changes,
// lets KvPageTable decide the slots (atomically), then hands the numbers to the engine of its
// precision (engine.h).
#include "reference/reference_drafter.h"

#include <cstdlib>
#include <string>

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
      : PagedProposer(checked_config(config), settings.resolved(config)),
        weights_(checked_weights(config, std::move(weights))),
        engine_(make_drafter_engine(config_, *weights_, settings_.precision,
                                    static_cast<int64_t>(settings_.pool_pages) * settings_.kv_page_size,
                                    options.threads)) {}

  std::string name() const override { return std::string("reference-") + precision_name(settings_.precision); }

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
    }
    return engine_->propose(steps, block_g_, want_taps);
  }


  std::vector<std::pair<std::string, std::string>> describe() const override {
    const StagePolicy policy = StagePolicy::for_precision(settings_.precision);
    return {
        {"drafter", "CPU reference"},
        {"precision", precision_name(settings_.precision)},
        {"compute_type", engine_->compute_type()},
        {"bf16_storage", policy.round_bf16 ? std::string("rounded at: ") + kBf16StorageStages : "off"},
        {"fp8_weights", !policy.fp8_weights ? "off"
                        : weights_->nvfp4_head() ? "q/k/v/o/gate/up/down per-row E4M3 (core/fp8.h); lm_head NVFP4 as it is; fc bf16"
                                                 : "q/k/v/o/gate/up/down and lm_head per-row E4M3 (core/fp8.h); fc bf16"},
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
        {"max_batch", std::to_string(settings_.max_batch)},
        {"kv_page_size", std::to_string(settings_.kv_page_size)},
        {"pool_pages", std::to_string(settings_.pool_pages)},
        {"page_order_seed", std::to_string(settings_.page_order_seed)},
    };
  }

 private:
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

  const std::shared_ptr<const DrafterWeights> weights_;
  std::unique_ptr<DrafterEngine> engine_;
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

std::unique_ptr<DraftProposer> make_reference_drafter(const DrafterConfig& config,
                                                      std::shared_ptr<const DrafterWeights> weights,
                                                      const HeadSettings& settings) {
  return make_reference_drafter(config, std::move(weights), settings, ReferenceOptions{reference_threads_from_env()});
}

}  // namespace dflash
