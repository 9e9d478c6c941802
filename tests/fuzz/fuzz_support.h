// Shared by the fuzz targets: a scratch directory for one fuzzing process (the readers take
// paths), and the one rule every target checks: a reader given any bytes either succeeds or
// throws HarnessError. Any other exception escapes the target, and libFuzzer reports it as a
// crash, like a sanitizer finding.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"

namespace dflash::fuzz {

// One directory per process, removed at exit (the path outlives every static destructor).
inline void remove_scratch();
inline const std::filesystem::path& scratch() {
  static const std::filesystem::path* dir = [] {
    std::string pattern = (std::filesystem::temp_directory_path() / "dflash-fuzz-XXXXXX").string();
    if (!mkdtemp(pattern.data())) std::abort();
    auto* path = new std::filesystem::path(pattern);
    std::atexit(remove_scratch);
    return path;
  }();
  return *dir;
}
inline void remove_scratch() {
  std::error_code ec;
  std::filesystem::remove_all(scratch(), ec);
}

inline void write_file(const std::filesystem::path& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) std::abort();
}

// Runs `read`; a HarnessError is the reader refusing the input, which is fine.
template <typename Read>
void refuse_or_accept(Read&& read) {
  try {
    read();
  } catch (const HarnessError&) {
  }
}

}  // namespace dflash::fuzz
