#include "compare/text_format.h"

#include <cmath>
#include <cstdio>

namespace dflash {

std::string format_number(double value, const char* format) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, format, value);
  return buffer;
}

std::string fixture_label(const std::string& name, const std::string& dir) {
  std::string trimmed = dir;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  const size_t slash = trimmed.find_last_of('/');
  const std::string base = slash == std::string::npos ? trimmed : trimmed.substr(slash + 1);
  return base.empty() || base == name ? name : name + " (" + base + ")";
}

}  // namespace dflash
