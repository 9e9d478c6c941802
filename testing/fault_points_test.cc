// CPU-side tests of the fault-point registry and of DFLASH_FAULT (testing/fault_points.h): every
// planted bug declares a known check and a bundled fixture, a request is refused by name when the id
// is unknown, and an injected failure fires once at its count.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>

#include "compare/catch_table.h"
#include "testing/fault_points.h"
#include "tests/support/harness_error.h"

namespace dflash {
namespace {

using testing::expect_mentions;
using testing::harness_error_message;

// Sets DFLASH_FAULT for one scope.
class ScopedFault {
 public:
  explicit ScopedFault(const char* value) { setenv("DFLASH_FAULT", value, 1); }
  ~ScopedFault() { unsetenv("DFLASH_FAULT"); }
};

TEST(FaultPoints, RegistryRowsAreCompleteAndDistinct) {
  std::set<std::string> ids;
  std::set<int> values;
  const std::set<std::string> checks = {catch_check_name(CatchCheck::kReplay), catch_check_name(CatchCheck::kInvariant),
                                        catch_check_name(CatchCheck::kProperty), catch_check_name(CatchCheck::kGpuTest)};
  EXPECT_GE(mutation_registry().size(), 14u);
  for (const PlantedMutation& m : mutation_registry()) {
    SCOPED_TRACE(m.id);
    EXPECT_NE(m.mutation, Mutation::kNone);
    EXPECT_TRUE(ids.insert(m.id).second) << "two rows named " << m.id;
    EXPECT_TRUE(values.insert(static_cast<int>(m.mutation)).second) << "two rows for one mutation";
    EXPECT_EQ(std::string(mutation_id(m.mutation)), m.id);
    EXPECT_TRUE(checks.count(m.check)) << m.check;
    EXPECT_NE(std::string(m.stage), "");
    EXPECT_TRUE(std::string(m.precision) == "bf16" || std::string(m.precision) == "fp8") << m.precision;
    EXPECT_TRUE(std::filesystem::exists(std::string(DFLASH_SOURCE_DIR) + "/fixtures/" + m.fixture + "/fixture.json"))
        << m.fixture;
  }
}

#ifdef DFLASH_FAULT_POINTS
TEST(FaultPoints, UnsetEmptyNoneOrAnInjectedFailureMeansNoPlantedBug) {
  unsetenv("DFLASH_FAULT");
  EXPECT_EQ(read_planted_mutation(), Mutation::kNone);
  for (const char* value : {"", "none", "alloc:1", "launch:3"}) {
    ScopedFault request(value);
    EXPECT_EQ(read_planted_mutation(), Mutation::kNone) << value;
  }
}

TEST(FaultPoints, EveryIdIsReadBack) {
  for (const PlantedMutation& m : mutation_registry()) {
    ScopedFault request(m.id);
    EXPECT_EQ(read_planted_mutation(), m.mutation) << m.id;
  }
}

TEST(FaultPoints, AnUnknownIdIsRefusedByName) {
  for (const char* value : {"rope-pair-layuot", "alloc:0", "launch:x", "oom:1"}) {
    ScopedFault request(value);
    const std::string message = harness_error_message([] { read_planted_mutation(); });
    expect_mentions(message, std::string("DFLASH_FAULT=") + value);
    expect_mentions(message, "rope-pair-layout");  // the known ids are listed
    expect_mentions(message, "alloc:N");
  }
}

TEST(FaultPoints, AnInjectedFailureFiresOnceAtItsCountAndSite) {
  set_injected_failure(FailureSite::kLaunch, 3);
  EXPECT_FALSE(injected_failure_due(FailureSite::kAlloc));  // another site does not count
  EXPECT_FALSE(injected_failure_due(FailureSite::kLaunch));
  EXPECT_FALSE(injected_failure_due(FailureSite::kLaunch));
  EXPECT_TRUE(injected_failure_due(FailureSite::kLaunch));
  EXPECT_FALSE(injected_failure_due(FailureSite::kLaunch));
  clear_injected_failure();
  EXPECT_FALSE(injected_failure_due(FailureSite::kLaunch));
}
#endif

}  // namespace
}  // namespace dflash
