// The shared malformed-input table (malformed_cases.h): every case must fail to load with
// HarnessError(kBadInput) carrying its own message, and the pristine base must load.
#include <gtest/gtest.h>

#include <set>

#include "core/error.h"
#include "tests/io/io_test_util.h"
#include "tests/io/malformed_cases.h"

namespace dflash::testing {
namespace {

TEST(Malformed, BaseFixtureLoads) { EXPECT_NO_THROW(load_fixture_and_weights(malformed_base_fixture())); }
TEST(Malformed, Nvfp4BaseFixtureLoads) { EXPECT_NO_THROW(load_fixture_and_weights(nvfp4_base_fixture())); }

TEST(Malformed, EveryCaseIsRefusedWithItsMessage) {
  const auto& cases = malformed_cases();
  EXPECT_GE(cases.size(), 24u);
  TempDir work;
  std::set<std::string> names, messages;
  for (const MalformedCase& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_TRUE(names.insert(c.name).second) << "duplicate case name";
    EXPECT_TRUE(messages.insert(c.expected).second) << "two cases expect the same message";
    const std::string path = c.build(work.path());
    EXPECT_BAD_INPUT(load_fixture_and_weights(path), c.expected);
  }
}

}  // namespace
}  // namespace dflash::testing
