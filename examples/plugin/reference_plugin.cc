// The example drafter plugin: the CPU reference drafter behind the plugin ABI
// (include/dflash/drafter_plugin.h), at the tensor-parallel size the harness asks for (its TP = N
// emulation, docs/spec/tensor-parallel.md), with faults an engine's drafter could have, chosen by a plugin
// option, to show how the harness reports each (docs/plugin.md):
//
//   --plugin-option fault=rope-sign           RoPE rotating the wrong way (first divergence L0.q)
//   --plugin-option fault=nan-at-step-2       NaN in the logits from the third propose on
//   --plugin-option fault=segfault-at-step-1  SIGSEGV in the second propose
//   --plugin-option fault=hang                the first propose never returns
//   --plugin-option threads=N                 the reference's threads (default 1)
//
// "step N" counts this drafter's propose calls from 0.
#include <signal.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <thread>

#include "core/error.h"
#include "core/forwarding_proposer.h"
#include "core/parse_number.h"
#include "plugin/export/proposer_export.h"
#include "reference/reference_options.h"

namespace dflash {
namespace {

enum class Fault { kNone, kRopeSign, kNanAtStep2, kSegfaultAtStep1, kHang };

Fault parse_fault(const std::string& value) {
  if (value == "rope-sign") return Fault::kRopeSign;
  if (value == "nan-at-step-2") return Fault::kNanAtStep2;
  if (value == "segfault-at-step-1") return Fault::kSegfaultAtStep1;
  if (value == "hang") return Fault::kHang;
  throw bad_input("plugin option fault=" + value + ": expected rope-sign, nan-at-step-2, segfault-at-step-1 or hang");
}

// R(-θ) = S·R(θ)·S with S negating the second half of each head's dimensions, and RMSNorm commutes
// with S; S on both q and k leaves their dot products as they are. So negating the second half of
// each head's rows of q_proj and k_proj (and their biases) computes exactly the attention of a RoPE
// that rotates the wrong way.
std::shared_ptr<const DrafterWeights> with_rope_sign_fault(const DrafterConfig& config, const DrafterWeights& weights) {
  auto faulty = std::make_shared<DrafterWeights>(weights);
  const int64_t d = config.head_dim, H = config.hidden_size;
  const auto flip = [&](Tensor& t, int64_t cols) {
    if (t.values.empty()) return;
    const int64_t heads = t.shape[0] / d;
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t r = h * d + d / 2; r < (h + 1) * d; ++r) {
        for (int64_t c = 0; c < cols; ++c) t.values[r * cols + c] = -t.values[r * cols + c];
      }
    }
  };
  for (LayerWeights& layer : faulty->layers) {
    flip(layer.q_proj, H);
    flip(layer.k_proj, H);
    flip(layer.q_bias, 1);
    flip(layer.k_bias, 1);
  }
  return faulty;
}

// The reference with the chosen fault at its propose calls.
class ExampleDrafter : public ForwardingProposer {
 public:
  ExampleDrafter(std::unique_ptr<DraftProposer> inner, Fault fault) : ForwardingProposer(std::move(inner)), fault_(fault) {}

  std::string name() const override { return "reference-example-" + inner().name(); }
  std::vector<ProposeOutput> propose(const std::vector<ProposeInput>& batch, bool want_taps) override {
    const int step = step_++;
    if (fault_ == Fault::kHang) {
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    if (fault_ == Fault::kSegfaultAtStep1 && step == 1) raise(SIGSEGV);
    std::vector<ProposeOutput> out = inner().propose(batch, want_taps);
    if (fault_ == Fault::kNanAtStep2 && step >= 2) {
      for (ProposeOutput& o : out) o.logits.values.at(0) = std::numeric_limits<float>::quiet_NaN();
    }
    return out;
  }
  std::vector<std::pair<std::string, std::string>> describe() const override {
    auto out = inner().describe();
    out.emplace_back("fault", fault_ == Fault::kNone ? "none" : "planted (plugin option fault)");
    return out;
  }

 private:
  Fault fault_;
  int step_ = 0;
};

std::unique_ptr<DraftProposer> make_example(const DrafterConfig& config, std::shared_ptr<const DrafterWeights> weights,
                                            const HeadSettings& head, const PluginOptions& options) {
  Fault fault = Fault::kNone;
  ReferenceOptions reference;
  for (const auto& [key, value] : options) {
    if (key == "fault") {
      fault = parse_fault(value);
    } else if (key == "threads") {
      if (!parse_whole_int(value, &reference.threads) || reference.threads < 1 || reference.threads > 256) {
        throw bad_input("plugin option threads=" + value + ": expected 1..256");
      }
    } else {
      throw bad_input("plugin option '" + key + "': the example plugin takes fault and threads");
    }
  }
  if (fault == Fault::kRopeSign) weights = with_rope_sign_fault(config, *weights);
  return std::make_unique<ExampleDrafter>(make_reference_drafter(config, weights, head, reference), fault);
}

}  // namespace
}  // namespace dflash

extern "C" __attribute__((visibility("default"))) const dflash_drafter_api* dflash_drafter_get_api(uint32_t abi_version) {
  (void)abi_version;  // one version: the table says which; the harness refuses another
  static const dflash_drafter_api* api = dflash::export_proposer(
      "reference-example",
      DFLASH_CAP_TAPS | DFLASH_CAP_KV_READ | DFLASH_CAP_DESCRIBE | DFLASH_CAP_PATH | DFLASH_CAP_TENSOR_PARALLEL,
      dflash::make_example);
  return api;
}
