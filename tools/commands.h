// The subcommands of dflash-harness. Each registers its options on the top-level app and returns
// the function that runs it; the function returns the exit code (docs/cli.md):
// 0 pass, 1 mismatch, 2 bad input or usage, 125 cannot run here.
#pragma once
#include <functional>

#include <CLI/CLI.hpp>

namespace dflash {

constexpr int kExitPass = 0;
constexpr int kExitMismatch = 1;
constexpr int kExitBadInput = 2;
constexpr int kExitCannotRun = 125;

struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

Command add_replay_command(CLI::App& app);
Command add_bisect_command(CLI::App& app);
Command add_make_fixture_command(CLI::App& app);
Command add_inspect_command(CLI::App& app);
Command add_report_command(CLI::App& app);

}  // namespace dflash
