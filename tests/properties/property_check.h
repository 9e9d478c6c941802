// Running RapidCheck properties inside GoogleTest with this project's case counts and seeds:
//  - cases: DFLASH_PROP_CASES if set, else RC_PARAMS' max_success if given, else the property's
//    small default (CI stays fast);
//  - seed: RC_PARAMS' seed if given, else a fixed seed derived from the test's name (CI runs are
//    reproducible; RC_PARAMS="seed=..." explores others);
//  - RC_PARAMS="reproduce=..." replays a reported failure (RapidCheck's own mechanism).
// A failure reports the seed, the counterexample and the reproduce string.
#pragma once
#include <cstdint>
#include <string>
#include <utility>

#include <rapidcheck.h>

namespace dflash::prop {

struct PropertyRun {
  int cases = 0;
  uint64_t seed = 0;
  bool shrink = true;
};

// The cases and seed a property with this id runs with (see above).
PropertyRun property_run(const std::string& id, int default_cases);

// Runs `property` as part of the current GoogleTest test; a failure fails the test with the seed,
// RapidCheck's message and the reproduce string.
void check_property_in_test(const rc::detail::Property& property, int default_cases);

template <typename Testable>
void check_property(int default_cases, Testable&& testable) {
  check_property_in_test(rc::detail::toProperty(std::forward<Testable>(testable)), default_cases);
}

// Fails the current RapidCheck case with exactly this message (RC_FAIL also prints its source text).
[[noreturn]] void fail_case(const std::string& message);

// For deliberately broken variants: runs `property` quietly (no reproduce record; shrinking only
// with `shrink`) for up to `cases` cases from `seed`. Returns true when a counterexample was found
// and writes RapidCheck's description of it to `failure`.
bool find_counterexample(const rc::detail::Property& property, int cases, uint64_t seed, std::string* failure,
                         bool shrink = false);

template <typename Testable>
bool property_fails(int cases, uint64_t seed, Testable&& testable, std::string* failure, bool shrink = false) {
  return find_counterexample(rc::detail::toProperty(std::forward<Testable>(testable)), cases, seed, failure, shrink);
}

}  // namespace dflash::prop
