// read_and_replay: whatever one fixture throws comes out as a HarnessError naming that fixture,
// so a run over many fixtures records it and goes on.
#include "tools/run_replay.h"

#include <gtest/gtest.h>

#include <new>
#include <stdexcept>

#include "tests/support/harness_error.h"

namespace dflash {
namespace {

using testing::expect_mentions;
using testing::harness_error_message;

const std::string kFixture = std::string(DFLASH_SOURCE_DIR) + "/fixtures/oracle/tiny-mha";

ReplayRequest reference_request() { return ReplayRequest{}; }

TEST(ReadAndReplay, ReplaysAFixtureWhenNothingThrows) {
  bool prepared = false;
  const ReplayResult result = read_and_replay(kFixture, reference_request(), [&](const Fixture&) { prepared = true; });
  EXPECT_TRUE(prepared);
  EXPECT_TRUE(result.passed());
  EXPECT_GT(result.steps_run, 0);
}

TEST(ReadAndReplay, OutOfMemoryBecomesBadInputNamingTheFixture) {
  const std::string message = harness_error_message(
      [&] { read_and_replay(kFixture, reference_request(), [](const Fixture&) { throw std::bad_alloc(); }); });
  expect_mentions(message, kFixture + ": out of memory (std::bad_alloc)");
}

TEST(ReadAndReplay, AStandardExceptionBecomesAnInternalErrorNamingTheFixtureAndItsMessage) {
  const std::string message = harness_error_message(
      [&] {
        read_and_replay(kFixture, reference_request(),
                        [](const Fixture&) { throw std::length_error("vector::reserve"); });
      },
      ErrorKind::kInternal);
  expect_mentions(message, kFixture + ": unexpected error while reading or replaying this fixture: vector::reserve");
}

TEST(ReadAndReplay, AnythingElseThrownBecomesAnInternalErrorNamingTheFixture) {
  const std::string message = harness_error_message(
      [&] { read_and_replay(kFixture, reference_request(), [](const Fixture&) { throw 7; }); }, ErrorKind::kInternal);
  expect_mentions(message, kFixture + ": an unknown exception");
}

TEST(ReadAndReplay, APathThatIsNoFixtureIsBadInputWithItsReason) {
  expect_mentions(harness_error_message([&] { read_and_replay(kFixture + "-typo", reference_request()); }),
                  "no such file or directory: " + kFixture + "-typo");
  const std::string parent = std::string(DFLASH_SOURCE_DIR) + "/fixtures/oracle";
  expect_mentions(harness_error_message([&] { read_and_replay(parent, reference_request()); }),
                  "not a fixture directory (no fixture.json): " + parent);
}

TEST(ReadAndReplay, HarnessErrorsKeepTheirKindAndMessage) {
  const std::string message = harness_error_message(
      [&] {
        read_and_replay(kFixture, reference_request(), [](const Fixture&) { throw unsupported("no device here"); });
      },
      ErrorKind::kUnsupported);
  EXPECT_EQ(message, "no device here");
}

}  // namespace
}  // namespace dflash
