// The proposer properties and their broken variants on the toy double: the property code itself
// is proposer-generic and must hold on, and catch faults in, a second proposer besides the
// reference, and this runs without any drafter math.
#include <gtest/gtest.h>

#include "tests/properties/backends.h"
#include "tests/properties/broken_variants.h"
#include "tests/properties/property_check.h"
#include "tests/properties/proposer_properties.h"

namespace dflash::prop {
namespace {

TEST(ToyProperties, ClampAndOutputShapes) { check_property(100, [] { clamp_property(toy_backend()); }); }
TEST(ToyProperties, ContextWindow) { check_property(100, [] { context_window_property(toy_backend()); }); }
TEST(ToyProperties, CacheSlotsOnSmallPools) { check_property(100, [] { cache_slots_property(toy_backend()); }); }
TEST(ToyProperties, BatchInvariance) { check_property(100, [] { batch_invariance_property(toy_backend()); }); }
TEST(ToyProperties, PagePermutation) { check_property(100, [] { page_permutation_property(toy_backend()); }); }
TEST(ToyProperties, Determinism) { check_property(100, [] { determinism_property(toy_backend()); }); }
TEST(ToyProperties, ArgmaxTies) { check_property(100, [] { argmax_ties_property(toy_backend()); }); }

class ToyBrokenVariants : public ::testing::TestWithParam<BrokenVariant> {};
TEST_P(ToyBrokenVariants, AreCaught) { expect_caught(toy_backend(), GetParam()); }
INSTANTIATE_TEST_SUITE_P(Toy, ToyBrokenVariants, ::testing::ValuesIn(generic_broken_variants()),
                         [](const ::testing::TestParamInfo<BrokenVariant>& info) { return info.param.name; });

}  // namespace
}  // namespace dflash::prop
