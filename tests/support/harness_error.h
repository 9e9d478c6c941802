// The one way tests expect an error: run a callable that must throw HarnessError of a given kind,
// and get its message back for the substring checks that name the file, field or sequence.
#pragma once
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"

namespace dflash::testing {

// Runs `f`; fails the current test unless it throws HarnessError of `kind`. Returns the message
// ("" when nothing or something else was thrown), so a caller checks what it must name.
template <typename F>
std::string harness_error_message(F&& f, ErrorKind kind = ErrorKind::kBadInput) {
  try {
    f();
  } catch (const HarnessError& e) {
    EXPECT_EQ(static_cast<int>(e.kind()), static_cast<int>(kind)) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no HarnessError was thrown";
  return "";
}

// EXPECT that `message` contains `part`, printing both when it does not.
inline void expect_mentions(const std::string& message, const std::string& part) {
  EXPECT_NE(message.find(part), std::string::npos) << "message: " << message << "\nexpected to contain: " << part;
}

}  // namespace dflash::testing
