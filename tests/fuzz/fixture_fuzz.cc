// Fuzz target: a whole fixture read and its weights loaded, with one file of the bundled tiny-mha
// fixture replaced by the input. The first byte picks the file (modulo 3): 0 fixture.json,
// 1 drafter/config.json, 2 trace.safetensors; the rest is its content.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fixtures/fixture.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

namespace fs = std::filesystem;

const char* const kFiles[] = {"fixture.json", "drafter/config.json", "trace.safetensors"};

// The pristine fixture, copied once; each input rewrites every replaceable file.
struct Base {
  fs::path dir;
  std::vector<std::vector<uint8_t>> files;
};

const Base& base() {
  static const Base b = [] {
    Base out;
    const fs::path source = fs::path(DFLASH_SOURCE_DIR) / "fixtures/oracle/tiny-mha";
    out.dir = dflash::fuzz::scratch() / "tiny-mha";
    fs::copy(source, out.dir, fs::copy_options::recursive);
    for (const char* name : kFiles) {
      std::ifstream in(source / name, std::ios::binary);
      out.files.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    return out;
  }();
  return b;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dflash;
  if (size == 0) return 0;
  const Base& b = base();
  const size_t replaced = data[0] % 3;
  for (size_t i = 0; i < 3; ++i) {
    if (i == replaced) {
      fuzz::write_file(b.dir / kFiles[i], data + 1, size - 1);
    } else {
      fuzz::write_file(b.dir / kFiles[i], b.files[i].data(), b.files[i].size());
    }
  }
  fuzz::refuse_or_accept([&] {
    Fixture fixture = read_fixture(b.dir.string());
    fixture.load_weights();
  });
  return 0;
}
