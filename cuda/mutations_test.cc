// CPU-side tests of the planted-mutation registry and of DFLASH_MUTATION (cuda/mutations.h): every
// row declares a known check and a bundled fixture, and a request is refused by name when the id is
// unknown or the build has no mutations.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>

#include "compare/catch_table.h"
#include "cuda/mutations.h"
#include "tests/support/harness_error.h"

namespace dflash {
namespace {

using testing::expect_mentions;
using testing::harness_error_message;

// Sets DFLASH_MUTATION for one scope.
class ScopedMutation {
 public:
  explicit ScopedMutation(const char* value) { setenv("DFLASH_MUTATION", value, 1); }
  ~ScopedMutation() { unsetenv("DFLASH_MUTATION"); }
};

TEST(Mutations, RegistryRowsAreCompleteAndDistinct) {
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

TEST(Mutations, UnsetOrEmptyMeansNone) {
  unsetenv("DFLASH_MUTATION");
  EXPECT_EQ(read_planted_mutation(), Mutation::kNone);
  ScopedMutation empty("");
  EXPECT_EQ(read_planted_mutation(), Mutation::kNone);
}

#ifdef DFLASH_MUTATIONS
TEST(Mutations, EveryIdIsReadBack) {
  for (const PlantedMutation& m : mutation_registry()) {
    ScopedMutation request(m.id);
    EXPECT_EQ(read_planted_mutation(), m.mutation) << m.id;
  }
  ScopedMutation none("none");
  EXPECT_EQ(read_planted_mutation(), Mutation::kNone);
}

TEST(Mutations, AnUnknownIdIsRefusedByName) {
  ScopedMutation request("rope-pair-layuot");
  const std::string message = harness_error_message([] { read_planted_mutation(); });
  expect_mentions(message, "DFLASH_MUTATION=rope-pair-layuot");
  expect_mentions(message, "rope-pair-layout");  // the known ids are listed
}
#else
TEST(Mutations, ARequestWithoutTheOptionIsRefused) {
  for (const char* id : {"rope-pair-layout", "none"}) {
    ScopedMutation request(id);
    const std::string message = harness_error_message([] { read_planted_mutation(); });
    expect_mentions(message, std::string("DFLASH_MUTATION=") + id);
    expect_mentions(message, "-DDFLASH_MUTATIONS=ON");
  }
}
#endif

}  // namespace
}  // namespace dflash
