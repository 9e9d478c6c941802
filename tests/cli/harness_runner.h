// Runs the built dflash-harness binary (path from the build: DFLASH_HARNESS_PATH) and captures its
// exit code, its stdout and its stderr.
#pragma once
#include <string>
#include <vector>

namespace dflash::cli_test {

struct RunResult {
  int exit_code = -1;  // -1 when the process did not exit normally (a crash)
  std::string output;  // stdout, then stderr
  std::string out, err;  // each alone
};

RunResult run_harness(const std::vector<std::string>& args);

// A fresh directory under the test's temporary directory.
std::string scratch_dir(const std::string& name);

// Bytes of a file ("" when it cannot be read).
std::string read_file(const std::string& path);

}  // namespace dflash::cli_test
