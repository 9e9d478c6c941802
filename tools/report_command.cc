// `dflash-harness report JSON... [-o report.html]`: renders one self-contained page from replay
// reports, and exits with the exit code of the run(s) they record.
#include <fstream>
#include <iostream>
#include <memory>

#include "compare/report_html.h"
#include "compare/report_json.h"
#include "compare/run_tally.h"
#include "core/error.h"
#include "tools/commands.h"

namespace dflash {
namespace {

struct ReportArgs {
  std::vector<std::string> inputs;
  std::string output;
};

int run_report(const ReportArgs& args) {
  std::vector<nlohmann::json> documents;
  for (const std::string& path : args.inputs) documents.push_back(read_report_document(path));
  if (!args.output.empty()) {
    const std::string html = render_html_report(documents);
    std::ofstream out(args.output, std::ios::binary | std::ios::trunc);
    if (!out) throw bad_input(args.output + ": cannot open for writing");
    out << html;
    out.close();
    if (!out) throw bad_input(args.output + ": write failed");
    std::cout << "wrote " << args.output << "\n";
  }
  // The fixtures that could not run, as replay printed them, then the count line of the whole run.
  for (const nlohmann::json& doc : documents) {
    for (const nlohmann::json& error : doc["errors"]) {
      std::cout << "could not run: " << error["fixture"].get<std::string>() << ": " << error["error"].get<std::string>()
                << "\n";
    }
  }
  const RunTally tally = tally_reports(documents);
  std::cout << count_line(tally) << "\n";
  return tally.exit_code;
}

}  // namespace

Command add_report_command(CLI::App& app) {
  auto args = std::make_shared<ReportArgs>();
  CLI::App* cmd = app.add_subcommand(
      "report", "Render replay reports as one self-contained HTML page; exits with the run's exit code");
  cmd->add_option("reports", args->inputs, "JSON reports written by replay --json")->required();
  cmd->add_option("-o,--output", args->output, "The HTML file to write");
  return {cmd, [args] { return run_report(*args); }};
}

}  // namespace dflash
