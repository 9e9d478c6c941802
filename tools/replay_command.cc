// `dflash-harness replay FIXTURE...`: the table, the first-divergence reports, the JSON document.
#include <iostream>
#include <memory>
#include <optional>

#include "compare/distribution.h"
#include "compare/report_json.h"
#include "compare/report_table.h"
#include "core/error.h"
#include "tools/commands.h"
#include "tools/progress.h"
#include "tools/run_replay.h"

namespace dflash {
namespace {

struct ReplayArgs {
  std::vector<std::string> fixtures;
  std::string backend = "reference";
  std::string precision;  // empty: the backend's default
  std::string json_path;
  int warmup = 1;
  bool verbose = false;
  std::vector<double> temperatures;  // of the distribution distances, besides 1
};

int run_replay(const ReplayArgs& args) {
  ReplayRequest request;
  request.backend = parse_backend(args.backend);
  request.precision = resolve_precision(request.backend, args.precision.empty() ? std::nullopt
                                                                                 : std::optional<std::string>(args.precision));
  check_backend_runs_here(request.backend, request.precision);
  request.cuda_warmup = args.warmup;
  distance_temperatures(args.temperatures, "--temperature");  // refused here, once, not per fixture
  request.options.temperatures = args.temperatures;

  Progress progress(std::cout, stdout_is_terminal(), args.verbose);
  std::vector<ReplayResult> results;
  std::vector<nlohmann::json> json_results, json_errors;
  bool bad_input_seen = false, cannot_run_seen = false;
  for (const std::string& path : args.fixtures) {
    request.options.on_step = [&](int done, int total) { progress.update(path, done, total); };
    try {
      results.push_back(read_and_replay(path, request));
      progress.finish();
      json_results.push_back(replay_result_to_json(results.back()));
    } catch (const std::exception& e) {
      // read_and_replay names the fixture in whatever it throws; the run goes on to the next one.
      progress.finish();
      const auto* harness_error = dynamic_cast<const HarnessError*>(&e);
      const int code = harness_error ? exit_code_for(harness_error->kind()) : kExitBadInput;
      std::cerr << "error: " << e.what() << "\n";
      json_errors.push_back(replay_error_to_json(path, e.what(), code));
      (code == kExitCannotRun ? cannot_run_seen : bad_input_seen) = true;
    }
  }

  if (!results.empty()) {
    print_drafter_settings(std::cout, results, args.verbose);
    print_replay_table(std::cout, results);
    for (const ReplayResult& r : results) {
      if (!r.passed()) print_result_report(std::cout, r);  // a pass is its table line
    }
  }
  if (!args.json_path.empty()) {
    write_report_document(args.json_path, make_report_document(json_results, json_errors));
    if (args.verbose) std::cout << "wrote " << args.json_path << "\n";
  }
  if (bad_input_seen) return kExitBadInput;
  if (cannot_run_seen) return kExitCannotRun;
  for (const ReplayResult& r : results) {
    if (!r.passed()) return kExitMismatch;
  }
  return kExitPass;
}

}  // namespace

Command add_replay_command(CLI::App& app) {
  auto args = std::make_shared<ReplayArgs>();
  CLI::App* cmd = app.add_subcommand(
      "replay", "Replay fixtures on a drafter, compare with the expectations (and drafters with each other)");
  cmd->add_option("fixtures", args->fixtures, "Fixture directories (or their fixture.json)")->required();
  cmd->add_option("--backend", args->backend,
                  "reference: the CPU reference; cuda: the CUDA drafter; both: the CUDA drafter against the "
                  "reference emulating its precision, and the fixture against the reference in fp64")
      ->check(CLI::IsMember({"reference", "cuda", "both"}))
      ->capture_default_str();
  cmd->add_option("--precision", args->precision,
                  "fp64 | fp32 | bf16 | fp8 (default: fp64 for the reference, fp8 for cuda and both)")
      ->check(CLI::IsMember({"fp64", "fp32", "bf16", "fp8"}));
  cmd->add_option("--warmup", args->warmup,
                  "CUDA drafter: eager passes of a (block width, batch size) before its graph is captured; later "
                  "proposes of that shape replay the graph (overrides DFLASH_CUDA_WARMUP)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--temperature", args->temperatures,
                  "Temperatures, besides 1, at which to measure the distribution distances of the logits "
                  "(docs/tolerances.md §10); repeat or separate with ','")
      ->delimiter(',');
  cmd->add_option("--json", args->json_path, "Also write the structured report (docs/report-format.md) here");
  cmd->add_flag("-v,--verbose", args->verbose,
                "Every setting of each drafter, and progress lines when stdout is not a terminal");
  return {cmd, [args] { return run_replay(*args); }};
}

}  // namespace dflash
