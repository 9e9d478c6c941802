// The source tree a test reads fixtures from: DFLASH_SOURCE_DIR from the environment (ctest sets
// it; a test bundle carried to another machine sets it there), else the tree it was built from.
// Force-included into every test source (dflash_add_test), so DFLASH_SOURCE_DIR reads as a path.
#pragma once
#include <cstdlib>

inline const char* dflash_test_source_dir() {
  const char* from_environment = std::getenv("DFLASH_SOURCE_DIR");
  return from_environment != nullptr && *from_environment != '\0' ? from_environment : DFLASH_BUILD_SOURCE_DIR;
}
#define DFLASH_SOURCE_DIR dflash_test_source_dir()
