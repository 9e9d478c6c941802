// `dflash-harness report JSON... -o report.html`: one self-contained page from replay reports.
#include <fstream>
#include <iostream>
#include <memory>

#include "compare/report_html.h"
#include "compare/report_json.h"
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
  size_t fixtures = 0;
  for (const std::string& path : args.inputs) {
    documents.push_back(read_report_document(path));
    fixtures += documents.back()["results"].size();
  }
  const std::string html = render_html_report(documents);
  std::ofstream out(args.output, std::ios::binary | std::ios::trunc);
  if (!out) throw bad_input(args.output + ": cannot open for writing");
  out << html;
  out.close();
  if (!out) throw bad_input(args.output + ": write failed");
  std::cout << "wrote " << args.output << " (" << fixtures << " fixture result(s) from " << args.inputs.size()
            << " report(s))\n";
  return kExitPass;
}

}  // namespace

Command add_report_command(CLI::App& app) {
  auto args = std::make_shared<ReportArgs>();
  CLI::App* cmd = app.add_subcommand(
      "report", "Render replay reports (--json output) as one self-contained HTML page with per-stage plots");
  cmd->add_option("reports", args->inputs, "JSON reports written by replay --json")->required();
  cmd->add_option("-o,--output", args->output, "The HTML file to write")->required();
  return {cmd, [args] { return run_report(*args); }};
}

}  // namespace dflash
