// `dflash-harness report JSON... [--json merged.json] [-o report.html]`: merges the shards of one
// run (replay --shard), renders one self-contained page, and exits with the run's exit code.
#include <fstream>
#include <iostream>
#include <memory>

#include "compare/report_html.h"
#include "compare/report_json.h"
#include "compare/report_merge.h"
#include "compare/run_tally.h"
#include "core/error.h"
#include "tools/commands.h"

namespace dflash {
namespace {

struct ReportArgs {
  std::vector<std::string> inputs;
  std::string output, json_output;
};

int run_report(const ReportArgs& args) {
  std::vector<nlohmann::json> read;
  for (const std::string& path : args.inputs) read.push_back(read_report_document(path));
  const std::vector<nlohmann::json> documents = merge_reports(read, args.inputs);
  if (!args.json_output.empty()) {
    if (documents.size() != 1) {
      throw bad_input("--json " + args.json_output + ": " + std::to_string(documents.size()) +
                      " reports that are not shards of one run cannot be merged into one document");
    }
    write_report_document(args.json_output, documents.front());
    std::cout << "wrote " << args.json_output << "\n";
  }
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
      "report", "Merge replay reports (the shards of one run) and render them as one self-contained HTML page; "
                "exits with the run's exit code");
  cmd->add_option("reports", args->inputs, "JSON reports written by replay --json")->required();
  cmd->add_option("-o,--output", args->output, "The HTML file to write");
  cmd->add_option("--json", args->json_output, "Write the merged JSON report (the shards of one run) here");
  return {cmd, [args] { return run_report(*args); }};
}

}  // namespace dflash
