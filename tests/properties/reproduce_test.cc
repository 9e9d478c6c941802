// A failing property prints its seed and RapidCheck's reproduce string, and rerunning with
// RC_PARAMS="reproduce=..." replays exactly that counterexample (the requirement: "a failure prints the
// seed and RapidCheck's reproduce string; rerunning with it reproduces the failure"). The test
// runs its own binary twice on a planted failure that is disabled in normal runs.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <regex>
#include <string>

#include "tests/properties/property_check.h"

namespace dflash::prop {
namespace {

TEST(PropertyReproduce, DISABLED_PlantedFailure) {
  check_property(200, [] {
    const int a = *rc::gen::inRange(0, 1000);
    const int b = *rc::gen::inRange(0, 1000);
    if (a + b > 1200) fail_case("planted counterexample a=" + std::to_string(a) + " b=" + std::to_string(b));
  });
}

struct ChildRun {
  int status = 0;
  std::string output;
};

ChildRun run_self(const std::string& env) {
  std::array<char, 4096> path{};
  const ssize_t n = readlink("/proc/self/exe", path.data(), path.size() - 1);
  if (n <= 0) return {-1, "readlink /proc/self/exe failed"};
  const std::string command = env + " '" + std::string(path.data(), static_cast<size_t>(n)) +
                              "' --gtest_also_run_disabled_tests --gtest_filter=PropertyReproduce.DISABLED_PlantedFailure 2>&1";
  ChildRun run;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return {-1, "popen failed"};
  std::array<char, 4096> buffer{};
  size_t got;
  while ((got = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) run.output.append(buffer.data(), got);
  run.status = pclose(pipe);
  return run;
}

TEST(PropertyReproduce, AFailurePrintsAReproduceStringThatReplaysIt) {
  const ChildRun first = run_self("RC_PARAMS=");
  ASSERT_NE(first.status, 0) << "the planted property did not fail:\n" << first.output;
  std::smatch seed, reproduce, counterexample;
  ASSERT_TRUE(std::regex_search(first.output, seed, std::regex(R"(\(seed [0-9]+)"))) << first.output;
  ASSERT_TRUE(std::regex_search(first.output, reproduce, std::regex(R"re(RC_PARAMS="(reproduce=[^"]+)")re")))
      << first.output;
  ASSERT_TRUE(std::regex_search(first.output, counterexample, std::regex(R"(planted counterexample a=[0-9]+ b=[0-9]+)")))
      << first.output;

  const ChildRun again = run_self("RC_PARAMS='" + reproduce[1].str() + "'");
  EXPECT_NE(again.status, 0) << again.output;
  EXPECT_NE(again.output.find(counterexample[0].str()), std::string::npos)
      << "replay did not report " << counterexample[0].str() << ":\n" << again.output;
}

}  // namespace
}  // namespace dflash::prop
