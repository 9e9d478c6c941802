// The subcommands of dflash-harness. Each registers its options on the top-level app and returns
// the function that runs it; the function returns the exit code (core/error.h, docs/cli.md).
#pragma once
#include <functional>

#include <CLI/CLI.hpp>

#include "core/error.h"

namespace dflash {

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
