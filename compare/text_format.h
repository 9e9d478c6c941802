// Text shared by every report: numbers in a fixed printf style and the name a fixture goes by.
#pragma once
#include <string>

namespace dflash {

// printf-formatted number; "inf", "-inf" or "nan" for non-finite values.
std::string format_number(double value, const char* format = "%.3g");

// The fixture's name, with its directory's last component when that differs (captures of several
// runs share a fixture name): "tiny-gqa (tiny-gqa.q-half-ktile)".
std::string fixture_label(const std::string& name, const std::string& dir);

}  // namespace dflash
