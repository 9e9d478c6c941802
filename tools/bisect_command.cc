// `dflash-harness bisect FIXTURE --step N --seq S`: the stage-by-stage walk of one propose.
#include <iostream>
#include <memory>
#include <optional>

#include "compare/report_table.h"
#include "core/error.h"
#include "tools/backend_options.h"
#include "tools/commands.h"
#include "tools/run_replay.h"

namespace dflash {
namespace {

struct BisectArgs {
  std::string fixture;
  int step = -1;
  int seq = -1;
  BackendOptions drafters;
};

// The step must exist and propose for the sequence.
void check_step_and_sequence(const Fixture& fixture, int step, int seq) {
  const int steps = static_cast<int>(fixture.steps.size());
  if (step < 0 || step >= steps) {
    throw bad_input("--step " + std::to_string(step) + ": fixture '" + fixture.name + "' has steps 0.." +
                    std::to_string(steps - 1));
  }
  const FixtureStep& s = fixture.steps[step];
  if (s.kind == FixtureStep::Kind::kRelease) {
    throw bad_input("--step " + std::to_string(step) + " of fixture '" + fixture.name + "' releases sequences; it proposes nothing");
  }
  std::string proposed;
  for (const ProposeEntry& e : s.propose) {
    if (e.seq == seq) return;
    proposed += (proposed.empty() ? "" : ", ") + std::to_string(e.seq);
  }
  throw bad_input("--seq " + std::to_string(seq) + ": step " + std::to_string(step) + " of fixture '" + fixture.name +
                  "' proposes for sequence(s) " + proposed);
}

int run_bisect(const BisectArgs& args) {
  ReplayRequest request = make_replay_request(args.drafters);
  request.options.last_step = args.step;
  const ReplayResult result = read_and_replay(
      args.fixture, request, [&](const Fixture& f) { check_step_and_sequence(f, args.step, args.seq); });

  std::cout << "bisect " << result.fixture_name << ", step " << args.step << ", sequence " << args.seq << "\n";
  if (!print_bisect_report(std::cout, result, args.step, args.seq)) {
    std::cout << "  nothing to compare: the fixture records no expectations for this propose\n";
  }
  if (result.first_divergence && result.first_divergence->step < args.step) {
    std::cout << "  note: an earlier step already diverges: " << describe_divergence(*result.first_divergence) << "\n";
  }
  for (const SequenceResult& s : result.sequences) {
    if (s.step == args.step && s.seq == args.seq && !s.passed()) return kExitMismatch;
  }
  for (const InvariantFailure& f : result.invariant_failures) {
    if (f.step == args.step) return kExitMismatch;
  }
  if (result.drafter_fault) {
    std::cout << "  " << result.drafter_fault->proposer << ": " << result.drafter_fault->text() << "\n";
    return kExitMismatch;
  }
  return kExitPass;
}

}  // namespace

Command add_bisect_command(CLI::App& app) {
  auto args = std::make_shared<BisectArgs>();
  CLI::App* cmd = app.add_subcommand(
      "bisect", "Walk the stages of one propose (step, sequence) in forward order and report the first divergence");
  cmd->add_option("fixture", args->fixture, "Fixture directory (or its fixture.json)")->required();
  cmd->add_option("--step", args->step, "Step index (0-based) of a propose step")->required();
  cmd->add_option("--seq", args->seq, "Sequence id proposed in that step")->required();
  add_backend_options(cmd, &args->drafters);
  return {cmd, [args] { return run_bisect(*args); }};
}

}  // namespace dflash
