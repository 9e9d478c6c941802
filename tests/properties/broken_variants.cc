#include "tests/properties/broken_variants.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>

#include "tests/properties/broken_proposers.h"
#include "tests/properties/property_check.h"
#include "tests/properties/proposer_properties.h"

namespace dflash::prop {

namespace {

// A one-backend property as a BrokenVariant body.
std::function<void(const Backend&, const Backend&)> on_broken(void (*property)(const Backend&)) {
  return [property](const Backend&, const Backend& broken) { property(broken); };
}

}  // namespace

std::vector<BrokenVariant> generic_broken_variants() {
  return {
      {"ClampOffByOne", on_broken(clamp_property), clamp_off_by_one, "clamp"},
      {"RowPastTheBlock", on_broken(clamp_property), row_past_the_block, "logits-shape"},
      {"WindowOffByOne", on_broken(context_window_property), window_off_by_one, "window"},
      {"NonAtomicExhaustion", on_broken(cache_slots_property), non_atomic_exhaustion, "a refused propose changed state"},
      {"LeakyBatch", on_broken(batch_invariance_property), leaky_batch, "not bit-identical"},
      {"PageDependent", on_broken(page_permutation_property), page_dependent, "not bit-identical"},
      {"Nondeterministic", on_broken(determinism_property), nondeterministic, "not bit-identical"},
      {"HighestIndexTies", on_broken(argmax_ties_property), highest_index_ties, "lowest index"},
      // Property 8's body with the working proposer as "eager" and the stale one as "graphs".
      {"StaleGraphReplay", [](const Backend& eager, const Backend& graphs) { same_bits_property(eager, graphs); },
       stale_graph_replay, "not bit-identical"},
  };
}

void expect_caught(const Backend& base, const BrokenVariant& variant) {
  const Backend broken = variant.breaker(base);
  std::string failure;
  const bool caught = property_fails(variant.cases, /*seed=*/1, [&] { variant.property(base, broken); }, &failure,
                                     variant.shrink);
  if (variant.shrink || std::getenv("DFLASH_PROP_VERBOSE")) {
    std::cout << variant.name << " caught as" << (variant.shrink ? " (shrunk)" : "") << ":\n" << failure << "\n";
  }
  ASSERT_TRUE(caught) << variant.name << ": " << broken.name << " passed " << variant.cases
                      << " cases: the property cannot tell it from a working proposer. " << failure;
  EXPECT_NE(failure.find(variant.expected_message), std::string::npos)
      << variant.name << ": caught, but not by the property it targets (expected '" << variant.expected_message
      << "'):\n" << failure;
}

}  // namespace dflash::prop
