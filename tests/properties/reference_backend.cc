#include "reference/reference_drafter.h"
#include "reference/reference_options.h"
#include "tests/properties/backends.h"
#include "tests/properties/broken_variants.h"
#include "tests/properties/broken_proposers.h"
#include "tests/properties/proposer_properties.h"
#include "tests/properties/serving_loop.h"

namespace dflash::prop {

namespace {

// `base` with the reference built from options that `plant` sets, named "<base>+<name>".
std::function<Backend(const Backend&)> planting_with(const std::string& name,
                                                     std::function<void(ReferenceOptions*)> plant) {
  return [name, plant](const Backend& base) {
    Backend b = base;
    b.name = base.name + "+" + name;
    b.make = [plant](const DrafterConfig& config, std::shared_ptr<const DrafterWeights> weights,
                     const HeadSettings& settings) {
      ReferenceOptions options;
      options.threads = reference_threads_from_env();
      plant(&options);
      return make_reference_drafter(config, std::move(weights), settings, options);
    };
    return b;
  };
}

}  // namespace

std::function<Backend(const Backend&)> planting(PlantedFault fault, const std::string& name) {
  return planting_with(name, [fault](ReferenceOptions* options) { options->fault = fault; });
}

std::function<Backend(const Backend&)> planting(RoundingFault fault) {
  return planting_with(rounding_fault_name(fault),
                       [fault](ReferenceOptions* options) { options->rounding_fault = fault; });
}

std::function<Backend(const Backend&)> planting(Fp8Fault fault) {
  return planting_with(fp8_fault_name(fault), [fault](ReferenceOptions* options) { options->fp8_fault = fault; });
}

std::function<Backend(const Backend&)> planting(TpFault fault) {
  return planting_with(tp_fault_name(fault), [fault](ReferenceOptions* options) { options->tp_fault = fault; });
}

namespace {

std::function<void(const Backend&, const Backend&)> on_broken(void (*property)(const Backend&)) {
  return [property](const Backend&, const Backend& broken) { property(broken); };
}

}  // namespace

Backend reference_backend() {
  Backend b;
  b.name = "reference";
  b.make = [](const DrafterConfig& config, std::shared_ptr<const DrafterWeights> weights, const HeadSettings& settings) {
    return make_reference_drafter(config, std::move(weights), settings);
  };
  b.precisions = {Precision::kFp64, Precision::kFp32, Precision::kBf16, Precision::kFp8};
  b.kv_oracle = make_reference_context_kv;
  return b;
}

Backend reference_backend(Precision precision) {
  Backend b = reference_backend();
  b.name = std::string("reference-") + precision_name(precision);
  b.precisions = {precision};
  return b;
}

std::vector<BrokenVariant> planted_fault_variants() {
  return {
      {"WritesAWrongSlot", on_broken(cache_slots_property), planting(PlantedFault::kWrongSlot, "wrong-slot"),
       "[kv-stored]"},
      {"KeepsABlockRow", on_broken(cache_slots_property), planting(PlantedFault::kKeepsBlockRow, "keeps-block-row"),
       "[kv-outside-window]"},
      {"ReadsAStaleSlot", on_broken(cache_slots_property), planting(PlantedFault::kStaleRead, "stale-read"),
       "[logits-finite]"},
      {"ReadsOneRowPastTheWindow", on_broken(context_window_property),
       planting(PlantedFault::kReadsPastWindow, "reads-past-window"), "[attention-window]"},
  };
}

std::vector<BrokenVariant> serving_loop_variants() {
  // Property 11 with the working reference as the fresh eager drafter and the plant as the served one.
  const auto serving = [](const Backend& working, const Backend& broken) { serving_loop_property(broken, working); };
  const std::string message = "not bit-identical to a fresh eager drafter";
  return {
      {"GraphKeyedByWidth", serving, graph_keyed_by_width, message, 300, true},
      {"PageTableBakedAtCapture", serving, planting(PlantedFault::kBakedPageTable, "baked-page-table"), message, 300,
       true},
      {"PaddedWidthGraph", serving, padded_width_graph, message, 300, true},
      {"StaleAttentionPlan", serving, planting(PlantedFault::kStaleAttentionPlan, "stale-attention-plan"), message, 300,
       true},
  };
}

}  // namespace dflash::prop
