// What the command says about an exception and the exit code it earns (docs/cli.md): a
// HarnessError by its kind; anything else, and a HarnessError of kind kInternal, is a bug in the
// harness and says so (exit 3), except running out of memory (bad input: the input asked for it).
#pragma once
#include <exception>
#include <string>

namespace dflash {

struct ErrorOutcome {
  int exit_code = 0;
  std::string message;  // printed after "error: "
};

ErrorOutcome describe_exception(const std::exception_ptr& error);

// "error: " + message, one line (line breaks inside the message become "; ").
std::string error_line(const std::string& message);

}  // namespace dflash
