#include "tests/cli/harness_runner.h"

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

namespace dflash::cli_test {
namespace {

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

std::string scratch_dir(const std::string& name) {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "dflash-cli" /
                                    (std::string(info->test_suite_name()) + "." + info->name()) / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

RunResult run_harness(const std::vector<std::string>& args) {
  const std::string dir = scratch_dir("run-output");
  const std::string out_path = dir + "/stdout.txt", err_path = dir + "/stderr.txt";
  std::string command = shell_quote(DFLASH_HARNESS_PATH);
  for (const std::string& arg : args) command += " " + shell_quote(arg);
  command += " > " + shell_quote(out_path) + " 2> " + shell_quote(err_path) + " < /dev/null";
  const int status = std::system(command.c_str());
  RunResult result;
  result.exit_code = (status != -1 && WIFEXITED(status)) ? WEXITSTATUS(status) : -1;
  result.out = read_file(out_path);
  result.err = read_file(err_path);
  result.output = result.out + result.err;
  return result;
}

}  // namespace dflash::cli_test
