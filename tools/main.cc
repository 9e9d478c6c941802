// dflash-harness: replay fixtures on the reference and CUDA drafters, bisect a divergence, make
// synthetic fixtures, inspect files, render reports. Every exception ends here as an exit code,
// and every error as one line starting with "error:".
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "core/error.h"
#include "tools/commands.h"
#include "tools/error_message.h"
#include "tools/hints.h"

namespace dflash {
namespace {

std::vector<std::string> command_names(const std::vector<Command>& commands) {
  std::vector<std::string> names;
  for (const Command& command : commands) names.push_back(command.app->get_name());
  return names;
}

std::string joined(const std::vector<std::string>& names) {
  std::string text;
  for (const std::string& name : names) text += (text.empty() ? "" : ", ") + name;
  return text;
}

// The first argument names the command; refuses a missing or unknown one with the nearest name.
// Returns the exit code of the refusal, or -1 when the command is known (or only --help is asked).
int check_command_name(int argc, char** argv, const std::vector<std::string>& names) {
  if (argc < 2) {
    std::cerr << error_line("no command given; the commands are " + joined(names) +
                            " (dflash-harness --help describes them)")
              << "\n";
    return kExitBadInput;
  }
  const std::string first = argv[1];
  if (first == "-h" || first == "--help" || first == "--help-all") return -1;
  if (!first.empty() && first[0] == '-') {
    std::cerr << error_line("unknown option '" + first + "' before the command; the command comes first: "
                            "dflash-harness COMMAND [OPTIONS] (the commands are " + joined(names) + ")")
              << "\n";
    return kExitBadInput;
  }
  for (const std::string& name : names) {
    if (name == first) return -1;
  }
  std::string message = "unknown command '" + first + "'";
  if (const auto near = nearest_name(first, names)) {
    message += "; did you mean '" + *near + "'?";
  } else {
    message += "; the commands are " + joined(names);
  }
  std::cerr << error_line(message) << "\n";
  return kExitBadInput;
}

// A usage error from CLI11, as one "error:" line that says where the usage is described.
int report_parse_error(CLI::App& app, const CLI::ParseError& e, const std::vector<Command>& commands) {
  if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) {
    app.exit(e);  // --help
    return kExitPass;
  }
  std::string help = "dflash-harness --help";
  for (const Command& command : commands) {
    if (command.app->parsed()) help = "dflash-harness " + command.app->get_name() + " --help";
  }
  std::cerr << error_line(std::string(e.what()) + " (" + help + " lists the options)") << "\n";
  return kExitBadInput;
}

int run(int argc, char** argv) {
  CLI::App app{"dflash-harness: checks DFlash drafters against fixtures and against each other.\n"
               "Exit codes: 0 pass, 1 mismatch, 2 bad input or usage, 3 internal error (a bug), 125 cannot run here."};
  app.require_subcommand(1);
  const std::vector<Command> commands = {add_replay_command(app), add_bisect_command(app),
                                         add_make_fixture_command(app), add_inspect_command(app),
                                         add_report_command(app)};
  const int refused = check_command_name(argc, argv, command_names(commands));
  if (refused >= 0) return refused;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return report_parse_error(app, e, commands);
  }
  for (const Command& command : commands) {
    if (command.app->parsed()) return command.run();
  }
  throw internal_error("no command ran although the command line parsed");
}

}  // namespace
}  // namespace dflash

int main(int argc, char** argv) {
  using namespace dflash;
  try {
    return run(argc, argv);
  } catch (...) {
    const ErrorOutcome outcome = describe_exception(std::current_exception());
    std::cerr << error_line(outcome.message) << "\n";
    return outcome.exit_code;
  }
}
