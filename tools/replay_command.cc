// `dflash-harness replay FIXTURE...`: the table, the first-divergence reports, the count line, the
// JSON and HTML reports; `--shard I/N` replays one shard of the fixtures.
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>

#include "compare/distribution.h"
#include "compare/report_html.h"
#include "compare/report_json.h"
#include "compare/report_table.h"
#include "compare/run_tally.h"
#include "core/error.h"
#include "tools/backend_options.h"
#include "tools/commands.h"
#include "tools/error_message.h"
#include "tools/progress.h"
#include "tools/run_replay.h"
#include "tools/shard.h"

namespace dflash {
namespace {

struct ReplayArgs {
  std::vector<std::string> fixtures;
  BackendOptions drafters;
  std::string json_path, html_path, shard;
  bool verbose = false;
  std::vector<double> temperatures;  // of the distribution distances, besides 1
};

void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw bad_input(path + ": cannot open for writing");
  out << text;
  out.close();
  if (!out) throw bad_input(path + ": write failed");
}

int run_replay(const ReplayArgs& args) {
  ReplayRequest request = make_replay_request(args.drafters);
  distance_temperatures(args.temperatures, "--temperature");  // refused here, once, not per fixture
  request.options.temperatures = args.temperatures;

  ReportRun run{args.drafters.backend, precision_name(request.precision), args.fixtures, 0, 0};
  std::vector<size_t> mine;  // positions in args.fixtures of the fixtures this run replays
  if (args.shard.empty()) {
    for (size_t i = 0; i < args.fixtures.size(); ++i) mine.push_back(i);
  } else {
    const ShardSpec spec = parse_shard(args.shard);
    run.shard = spec.index;
    run.shards = spec.count;
    std::vector<uint64_t> bytes;
    for (const std::string& path : args.fixtures) bytes.push_back(fixture_bytes(path));
    const std::vector<int> shards = assign_shards(args.fixtures, bytes, spec.count);
    uint64_t mine_bytes = 0, all_bytes = 0;
    for (size_t i = 0; i < args.fixtures.size(); ++i) {
      all_bytes += bytes[i];
      if (shards[i] != spec.index) continue;
      mine.push_back(i);
      mine_bytes += bytes[i];
    }
    std::cout << "shard " << spec.index << "/" << spec.count << ": " << mine.size() << " of " << args.fixtures.size()
              << " fixtures (" << mine_bytes << " of " << all_bytes << " bytes)\n";
  }

  Progress progress(std::cout, stdout_is_terminal(), args.verbose);
  std::vector<FixtureOutcome> outcomes;
  for (size_t i : mine) {
    const std::string& path = args.fixtures[i];
    FixtureOutcome outcome;
    outcome.path = path;
    request.options.on_step = [&](int done, int total) { progress.update(path, done, total); };
    try {
      outcome.result = read_and_replay(path, request);
    } catch (...) {
      // read_and_replay names the fixture in whatever it throws; the run goes on to the next one.
      const ErrorOutcome error = describe_exception(std::current_exception());
      outcome.error = error.message;
      outcome.exit_code = error.exit_code;
      progress.finish();
      std::cerr << error_line(error.message) << "\n";
    }
    progress.finish();
    outcomes.push_back(std::move(outcome));
  }

  print_drafter_settings(std::cout, outcomes, args.verbose);
  if (!outcomes.empty()) print_replay_table(std::cout, outcomes);
  for (const FixtureOutcome& outcome : outcomes) {
    if (outcome.result && !outcome.result->passed()) print_result_report(std::cout, *outcome.result);  // a pass is its table line
  }
  const nlohmann::json document = make_report_document(run, outcomes, mine);
  const RunTally tally = tally_reports({document});
  if (!args.json_path.empty()) {
    write_report_document(args.json_path, document);
    if (args.verbose) std::cout << "wrote " << args.json_path << "\n";
  }
  if (!args.html_path.empty()) {
    write_text_file(args.html_path, render_html_report({document}));
    if (args.verbose) std::cout << "wrote " << args.html_path << "\n";
  }
  std::cout << count_line(tally) << "\n";
  return tally.exit_code;
}

}  // namespace

Command add_replay_command(CLI::App& app) {
  auto args = std::make_shared<ReplayArgs>();
  CLI::App* cmd = app.add_subcommand(
      "replay", "Replay fixtures on a drafter, compare with the expectations (and drafters with each other)");
  cmd->add_option("fixtures", args->fixtures, "Fixture directories (or their fixture.json)")->required();
  add_backend_options(cmd, &args->drafters);
  cmd->add_option("--temperature", args->temperatures,
                  "Temperatures, besides 1, at which to measure the distribution distances of the logits "
                  "(docs/tolerances.md §10); repeat or separate with ','")
      ->delimiter(',');
  cmd->add_option("--json", args->json_path, "Also write the structured report (docs/report-format.md) here");
  cmd->add_option("--html", args->html_path, "Also write the HTML report (as `report` renders it) here");
  cmd->add_option("--shard", args->shard,
                  "I/N: replay only shard I (1-based) of N, a stable partition of the fixtures balanced by size; "
                  "`report` merges the shards' --json reports");
  cmd->add_flag("-v,--verbose", args->verbose,
                "Every setting of each drafter, and progress lines when stdout is not a terminal");
  return {cmd, [args] { return run_replay(*args); }};
}

}  // namespace dflash
