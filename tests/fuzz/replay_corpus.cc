// Runs one fuzz target over its corpus and its crash regressions (tests/fuzz/corpus/<target>,
// tests/fuzz/regressions/<target>) in an ordinary test build: under the sanitize preset in CI,
// every input that ever crashed a reader must now be refused or read cleanly.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

namespace fs = std::filesystem;

TEST(FuzzCorpus, EveryInputIsRefusedOrReadWithoutACrash) {
  const fs::path root = fs::path(DFLASH_SOURCE_DIR) / "tests/fuzz";
  size_t inputs = 0;
  for (const char* kind : {"corpus", "regressions"}) {
    const fs::path dir = root / kind / DFLASH_FUZZ_TARGET;
    if (!fs::is_directory(dir)) continue;
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (!entry.is_regular_file()) continue;
      SCOPED_TRACE(entry.path().string());
      std::ifstream in(entry.path(), std::ios::binary);
      const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      EXPECT_EQ(LLVMFuzzerTestOneInput(bytes.data(), bytes.size()), 0);
      ++inputs;
    }
  }
  EXPECT_GT(inputs, 0u) << "no corpus for " << DFLASH_FUZZ_TARGET << " under " << root;
}

}  // namespace
