// dflash-harness: replay fixtures on the reference and CUDA drafters, bisect a divergence, make
// synthetic fixtures, inspect files, render reports. Every exception ends here as an exit code.
#include <exception>
#include <iostream>
#include <vector>

#include "core/error.h"
#include "tools/commands.h"

int main(int argc, char** argv) {
  using namespace dflash;
  try {
    CLI::App app{"dflash-harness: checks DFlash drafters against fixtures and against each other.\n"
                 "Exit codes: 0 pass, 1 mismatch, 2 bad input or usage, 125 cannot run here."};
    app.require_subcommand(1);
    const std::vector<Command> commands = {add_replay_command(app), add_bisect_command(app),
                                           add_make_fixture_command(app), add_inspect_command(app),
                                           add_report_command(app)};
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      const int code = app.exit(e);  // prints help (code 0) or the usage error
      return code == 0 ? kExitPass : kExitBadInput;
    }
    for (const Command& command : commands) {
      if (command.app->parsed()) return command.run();
    }
    return kExitBadInput;
  } catch (const HarnessError& e) {
    const bool bug = e.kind() == ErrorKind::kInternal;
    std::cerr << "error: " << (bug ? "internal error (a bug in dflash-harness, please report it): " : "") << e.what()
              << "\n";
    return exit_code_for(e.kind());
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return kExitBadInput;
  } catch (...) {
    std::cerr << "error: an unknown exception\n";
    return kExitBadInput;
  }
}
