// `dflash-harness make-fixture OUT_DIR --seed N --geometry G`: a synthetic fixture.
#include <iostream>
#include <memory>
#include <string>

#include "fixtures/fp8_checkpoint_writer.h"
#include "fixtures/known_acceptance.h"
#include "fixtures/synthetic.h"
#include "tools/commands.h"

namespace dflash {
namespace {

struct MakeFixtureArgs {
  std::string out_dir;
  std::string context_rows;
  SyntheticOptions options;
  // kind set by --known-acceptance: fixtures/known_acceptance.h instead; empty: a synthetic fixture.
  KnownAcceptanceOptions known = [] {
    KnownAcceptanceOptions k;
    k.kind.clear();
    return k;
  }();
};

int run_make_fixture(MakeFixtureArgs& args) {
  if (!args.known.kind.empty()) {
    KnownAcceptanceOptions& k = args.known;
    k.seed = args.options.seed;
    k.geometry = args.options.geometry;
    k.max_batch = args.options.max_batch;
    k.name = args.options.name;
    std::cout << "seed " << k.seed << "\n" << std::flush;
    make_known_acceptance_fixture(args.out_dir, k);
    std::cout << "wrote a " << k.kind << " fixture (" << k.geometry << ", " << k.blocks << " blocks) to "
              << args.out_dir << " (seed " << k.seed << ")\n";
    return kExitPass;
  }
  if (!args.context_rows.empty()) args.options.context_rows = parse_context_rows(args.context_rows);
  const SyntheticOptions& o = args.options;
  std::cout << "seed " << o.seed << "\n" << std::flush;
  make_synthetic_fixture(args.out_dir, o);
  std::cout << "wrote a " << o.geometry << " fixture to " << args.out_dir << " (seed " << o.seed << ", "
            << (!o.script.empty()            ? std::string("the steps of --script")
                : o.context_rows.empty() ? std::to_string(o.steps) + " steps"
                                         : std::string("the fixed batch of --context-rows"))
            << ", expectations: " << o.expect_precision
            << (o.fp8_checkpoint.empty() ? std::string() : ", FP8 checkpoint: " + o.fp8_checkpoint) << ")\n";
  return kExitPass;
}

}  // namespace

Command add_make_fixture_command(CLI::App& app) {
  auto args = std::make_shared<MakeFixtureArgs>();
  SyntheticOptions& o = args->options;
  std::string geometries;
  for (const std::string& name : synthetic_geometry_names()) geometries += (geometries.empty() ? "" : " | ") + name;
  CLI::App* cmd = app.add_subcommand(
      "make-fixture", "Write a synthetic fixture: random bf16-valued weights and trace from a seed, expectations "
                      "from the reference drafter. Same options, same bytes.");
  cmd->add_option("out_dir", args->out_dir, "Directory to write the fixture into")->required();
  cmd->add_option("--seed", o.seed, "Seed of the weights and the trace (printed)")->capture_default_str();
  cmd->add_option("--geometry", o.geometry, geometries)->check(CLI::IsMember(synthetic_geometry_names()))
      ->capture_default_str();
  cmd->add_option("--steps", o.steps, "Steps (proposes and releases)")->capture_default_str();
  cmd->add_option("--sequences", o.sequences, "Distinct sequences joining over the trace")->capture_default_str();
  cmd->add_option("--widths", o.widths, "Requested block widths, one per propose, cycled (default: gamma)")
      ->delimiter(',');
  cmd->add_option("--gamma", o.gamma, "Head gamma (default: the geometry's block_size)");
  cmd->add_option("--ctx-cap", o.ctx_cap, "Context window in positions")->capture_default_str();
  cmd->add_option("--page-size", o.page_size, "KV cache page size in tokens")->capture_default_str();
  cmd->add_option("--max-batch", o.max_batch, "Most sequences in one propose")->capture_default_str();
  cmd->add_option("--prompt-rows", o.prompt_rows,
                  "Most context rows of a new sequence's prompt (default: min(ctx-cap + 8, 3 gamma + 16))");
  cmd->add_option("--context-rows", args->context_rows,
                  "A fixed batch instead of the random trace: new context rows per propose, ',' between "
                  "proposes, '/' between sequences (e.g. 2,1,1/7,0,0); every sequence proposes in every step "
                  "while it has entries; --steps, --sequences and --prompt-rows are then unused");
  cmd->add_option("--script", o.script,
                  "A scripted trace instead of the random one: steps separated by ';', each 'W:S+N,S+N' (a "
                  "propose at width W, sequence S bringing N new context rows, in batch order) or 'r:S,S' (a "
                  "release), e.g. '8:0+20; 8:0+3,1+30; r:0'");
  cmd->add_option("--ctx-scale", o.ctx_scale, "Context features drawn from U(-s, s)")->capture_default_str();
  cmd->add_flag("--tied-logits", o.tied_logits, "lm_head rows equal in pairs: every argmax is an exact tie");
  cmd->add_flag("--without-taps", o.without_taps,
                "Expectations without the taps: logits, draft tokens and the DFlash2 selector object only");
  cmd->add_option("--expect-precision", o.expect_precision,
                  "Precision of the reference that computes the expectations, or none for a trace only")
      ->check(CLI::IsMember({"fp64", "fp32", "bf16", "fp8", "none"}))
      ->capture_default_str();
  cmd->add_option("--fp8-checkpoint", o.fp8_checkpoint,
                  "Store the drafter as a pre-quantized FP8 checkpoint of this scheme (docs/spec/fp8-checkpoints.md); "
                  "expectations on the exactly dequantized weights")
      ->check(CLI::IsMember(fp8_checkpoint_scheme_names()));
  cmd->add_option("--name", o.name, "Fixture name (default: <geometry>-seed<seed>)");
  cmd->add_option("--known-acceptance", args->known.kind,
                  "Instead: a fixture whose acceptance is known by construction, with a target side and a pinned "
                  "acceptance (fixtures/acceptance/README.md); uses --seed, --geometry, --max-batch, --name")
      ->check(CLI::IsMember(known_acceptance_kinds()));
  cmd->add_option("--blocks", args->known.blocks, "--known-acceptance: proposes, one sequence each")
      ->capture_default_str();
  cmd->add_option("--match-rate", args->known.match_rate,
                  "--known-acceptance controlled-distance: the mean probability that the target's token is the "
                  "reference's draft token")
      ->capture_default_str();
  return {cmd, [args] { return run_make_fixture(*args); }};
}

}  // namespace dflash
