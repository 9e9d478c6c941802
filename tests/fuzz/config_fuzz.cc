// Fuzz target: the drafter's config.json, parsed strictly and validated.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/config.h"
#include "core/json_file.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dflash;
  const std::string text(reinterpret_cast<const char*>(data), size);
  fuzz::refuse_or_accept([&] { parse_drafter_config(parse_json_strict(text, "config.json"), "config.json"); });
  return 0;
}
