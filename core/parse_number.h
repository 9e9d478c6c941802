// Whole-string integer parsing for levers and environment variables: "12" is 12, while "12x",
// "", " 12" and out-of-range values are refused (the caller names the field in its error).
#pragma once
#include <cctype>
#include <exception>
#include <string>

namespace dflash {

inline bool parse_whole_int(const std::string& text, int* value) {
  size_t used = 0;
  try {
    *value = std::stoi(text, &used);
  } catch (const std::exception&) {
    return false;
  }
  return used == text.size() && !std::isspace(static_cast<unsigned char>(text[0]));
}

}  // namespace dflash
