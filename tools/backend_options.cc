#include "tools/backend_options.h"

#include <optional>

#include "core/error.h"
#include "core/proposer.h"

namespace dflash {

void add_backend_options(CLI::App* cmd, BackendOptions* o) {
  cmd->add_option("--backend", o->backend,
                  "reference: the CPU reference; cuda: the CUDA drafter; plugin:PATH: a drafter plugin "
                  "(docs/plugin.md); both = reference,cuda; or a comma list. With the reference listed, the others "
                  "are compared with the reference emulating their precision and the fixture with the reference "
                  "in fp64; without it, each with the fixture")
      ->capture_default_str();
  cmd->add_option("--precision", o->precision,
                  "fp64 | fp32 | bf16 | fp8 | w8a8 (default: fp8 when cuda is a backend, else fp64)")
      ->check(CLI::IsMember({"fp64", "fp32", "bf16", "fp8", "w8a8"}));
  cmd->add_option("--warmup", o->warmup,
                  "CUDA drafter: eager passes of a (block width, batch size) before its graph is captured; later "
                  "proposes of that shape replay the graph (overrides DFLASH_CUDA_WARMUP)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--plugin-option", o->plugin_options, "KEY=VALUE handed to each plugin's create(); repeatable");
  cmd->add_flag("--isolate,!--no-isolate", o->isolate,
                "Run plugins in a child process (the default): a crash or hang fails that fixture and the run goes "
                "on. --no-isolate runs them in the harness's process");
  cmd->add_option("--plugin-timeout", o->plugin_timeout_s,
                  "Seconds a plugin call may take when isolated before it is killed and reported as hung")
      ->check(CLI::Range(0.001, 86400.0))
      ->capture_default_str();
  cmd->add_option("--tp", o->tp,
                  "Tensor parallelism: the reference emulates TP = N (1, 2, 4 or 8) per docs/spec/tensor-parallel.md and the "
                  "CUDA drafter runs N fake shards on one GPU; a fixture whose geometry N does not divide is refused "
                  "by name")
      ->capture_default_str();
  cmd->add_option("--tp-reduce", o->tp_reduce,
                  "fp32 | bf16: the dtype of the row-parallel partials and their sum at TP > 1 (bf16 needs --precision "
                  "bf16 or fp8)")
      ->capture_default_str();
}

ReplayRequest make_replay_request(const BackendOptions& o) {
  ReplayRequest request;
  request.backends = parse_backends(o.backend);
  request.precision = resolve_precision(request.backends, o.precision.empty() ? std::nullopt : std::optional<std::string>(o.precision));
  request.cuda_warmup = o.warmup;
  request.plugins.isolate = o.isolate;
  request.plugins.timeout_s = o.plugin_timeout_s;
  for (const std::string& kv : o.plugin_options) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) throw bad_input("--plugin-option '" + kv + "': expected KEY=VALUE");
    request.plugins.options.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
  }
  // docs/spec/tensor-parallel.md §1 checks 1 and 2, with the contract's texts.
  HeadSettings tp;
  tp.tp_size = o.tp;
  try {
    tp.tp_reduce_dtype = parse_tp_reduce_dtype(o.tp_reduce);
  } catch (const HarnessError& e) {
    throw bad_input(std::string("--tp-reduce: ") + e.what());
  }
  try {
    tp.check_fields();
  } catch (const HarnessError& e) {
    throw bad_input(std::string("--tp: ") + e.what());
  }
  request.tp_size = tp.tp_size;
  request.tp_reduce_dtype = tp.tp_reduce_dtype;
  check_backends_run_here(request.backends, request.precision, request.plugins);
  return request;
}

}  // namespace dflash
