// One table of malformed inputs (in the spirit of llama.cpp's test-backend-ops: one case type,
// one table, one loop). Each case copies the bundled oracle fixture batch-widths-release into a
// scratch directory, plants one defect there, and names the substring the error must carry.
// tests/io checks that loading throws HarnessError(kBadInput) with that substring; the CLI tests
// reuse the same table to check exit code 2 and the same message.
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace dflash::testing {

struct MalformedCase {
  std::string name;      // short, unique, usable as a directory name
  std::string expected;  // a substring of the error message
  // Writes the broken fixture under `work_dir` (which must exist) and returns its directory.
  std::function<std::string(const std::string& work_dir)> build;
};

const std::vector<MalformedCase>& malformed_cases();

// The pristine fixture every case starts from (it loads cleanly); the NVFP4 head's cases start
// from nvfp4-tiny-gqa (also loads cleanly).
std::string malformed_base_fixture();
std::string nvfp4_base_fixture();

// The pre-quantized FP8 checkpoints' refusals (docs/spec/fp8-checkpoints.md), each starting from one of the
// bundled fixtures/fp8ckpt/ fixtures (both load cleanly); part of malformed_cases().
std::vector<MalformedCase> fp8_checkpoint_cases();
std::string fp8_compressed_tensors_base_fixture();
std::string fp8_modelopt_base_fixture();

// "Loading" for the table: read_fixture(path) then load_weights(), as a replay does before its
// first propose. Throws what they throw.
void load_fixture_and_weights(const std::string& path);

}  // namespace dflash::testing
