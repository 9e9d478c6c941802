// Fuzz target: one safetensors file, opened and every tensor read as its dtype allows.
#include <cstddef>
#include <cstdint>

#include "core/safetensors.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dflash;
  const auto path = fuzz::scratch() / "input.safetensors";
  fuzz::write_file(path, data, size);
  fuzz::refuse_or_accept([&] {
    const auto file = SafetensorsFile::open(path.string());
    for (const std::string& name : file->names()) {
      const DType dtype = file->info(name).dtype;
      fuzz::refuse_or_accept([&] {
        if (dtype == DType::kI32 || dtype == DType::kI64) {
          file->read_int(name);
        } else {
          file->read_float(name);
        }
      });
    }
  });
  return 0;
}
