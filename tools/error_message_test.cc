// describe_exception: each kind of failure gets its exit code, and a bug says it is one.
#include "tools/error_message.h"

#include <gtest/gtest.h>

#include <new>
#include <stdexcept>

#include "core/error.h"

namespace dflash {
namespace {

template <typename E>
ErrorOutcome outcome_of(const E& e) {
  return describe_exception(std::make_exception_ptr(e));
}

TEST(DescribeException, HarnessErrorsKeepTheirMessageAndExitByKind) {
  const ErrorOutcome bad = outcome_of(bad_input("x.json: field 'a' is missing"));
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_EQ(bad.message, "x.json: field 'a' is missing");
  EXPECT_EQ(outcome_of(unsupported("no GPU")).exit_code, 125);
  EXPECT_EQ(outcome_of(HarnessError(ErrorKind::kPoolExhausted, "pool full")).exit_code, 2);
}

TEST(DescribeException, InternalErrorsAndForeignExceptionsAreBugsWithExitThree) {
  const ErrorOutcome internal = outcome_of(internal_error("broken invariant"));
  EXPECT_EQ(internal.exit_code, 3);
  EXPECT_EQ(internal.message, "internal error: broken invariant; this is a bug in dflash-harness");
  const ErrorOutcome foreign = outcome_of(std::length_error("vector::reserve"));
  EXPECT_EQ(foreign.exit_code, 3);
  EXPECT_EQ(foreign.message, "internal error: vector::reserve; this is a bug in dflash-harness");
  const ErrorOutcome unknown = outcome_of(7);
  EXPECT_EQ(unknown.exit_code, 3);
  EXPECT_NE(unknown.message.find("this is a bug in dflash-harness"), std::string::npos);
}

TEST(DescribeException, OutOfMemoryIsBadInput) {
  const ErrorOutcome oom = outcome_of(std::bad_alloc());
  EXPECT_EQ(oom.exit_code, 2);
  EXPECT_NE(oom.message.find("out of memory"), std::string::npos);
}

TEST(ErrorLine, OneLineStartingWithError) {
  EXPECT_EQ(error_line("a\nb\n"), "error: a; b");
  EXPECT_EQ(error_line("plain"), "error: plain");
}

}  // namespace
}  // namespace dflash
