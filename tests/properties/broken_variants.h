// Each property paired with a deliberately broken proposer it must catch: the property body runs
// on the broken variant of a working backend and RapidCheck must find a counterexample whose
// message names the violated property. A property that passes its broken variant is vacuous.
#pragma once
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "reference/reference_options.h"
#include "tests/properties/backends.h"

namespace dflash::prop {

struct BrokenVariant {
  std::string name;                                   // test name suffix
  // The property body on the broken backend (the working base is there for two-backend properties).
  std::function<void(const Backend& base, const Backend& broken)> property;
  std::function<Backend(const Backend&)> breaker;     // working backend -> broken variant
  std::string expected_message;                       // the counterexample must say this
  int cases = 200;                                    // most cases searched for the counterexample
  bool shrink = false;                                // shrink the counterexample and print it
};

// GoogleTest prints a parameter by its name.
inline void PrintTo(const BrokenVariant& variant, std::ostream* os) { *os << variant.name; }

// The variants of properties 1-6, 8 and 10 (the proposer-generic ones).
std::vector<BrokenVariant> generic_broken_variants();

// Faults planted in the reference itself (ReferenceOptions::fault) with the bookkeeping right: a
// wrong slot written, a block row kept, a stale slot read, one row read past the window. Each must
// fail with the name of the stored-state check that sees it (reference_backend.cc).
std::vector<BrokenVariant> planted_fault_variants();
// Property 11's plants (the stale-graph classes): a graph keyed by the width alone, a page table
// baked at capture, a wider width's graph serving a narrower one (scratch shared between two
// widths), an attention plan of another window geometry. Each is caught with a shrunk
// counterexample, printed.
std::vector<BrokenVariant> serving_loop_variants();
// The reference with `fault` planted (ReferenceOptions::fault), named "<base>+<name>".
std::function<Backend(const Backend&)> planting(PlantedFault fault, const std::string& name);
// The reference with a rounding fault planted (ReferenceOptions::rounding_fault; bf16 and fp8 only).
std::function<Backend(const Backend&)> planting(RoundingFault fault);
// The reference with an fp8 GEMM fault planted (ReferenceOptions::fp8_fault; fp8 only).
std::function<Backend(const Backend&)> planting(Fp8Fault fault);
// The reference with a tensor-parallel fault planted (ReferenceOptions::tp_fault; tp_size > 1 only).
std::function<Backend(const Backend&)> planting(TpFault fault);

// Runs `variant` against `base` under GoogleTest: fails unless a counterexample is found.
void expect_caught(const Backend& base, const BrokenVariant& variant);

}  // namespace dflash::prop
