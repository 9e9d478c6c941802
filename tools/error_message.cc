#include "tools/error_message.h"

#include <new>

#include "core/error.h"

namespace dflash {
namespace {

std::string internal(const std::string& what) {
  return "internal error: " + what + "; this is a bug in dflash-harness";
}

}  // namespace

ErrorOutcome describe_exception(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const HarnessError& e) {
    if (e.kind() == ErrorKind::kInternal) return {kExitInternal, internal(e.what())};
    return {exit_code_for(e.kind()), e.what()};
  } catch (const std::bad_alloc&) {
    return {kExitBadInput, "out of memory (std::bad_alloc)"};
  } catch (const std::exception& e) {
    return {kExitInternal, internal(e.what())};
  } catch (...) {
    return {kExitInternal, internal("an exception that is not a std::exception")};
  }
}

std::string error_line(const std::string& message) {
  std::string text = message;
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  std::string line = "error: ";
  for (char c : text) {
    if (c == '\n') {
      line += "; ";
    } else {
      line += c;
    }
  }
  return line;
}

}  // namespace dflash
