// The drafter options `replay` and `bisect` share: --backend, --precision, --warmup and the plugin
// options, registered once and turned into a ReplayRequest (checked before any fixture runs).
#pragma once
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "tools/run_replay.h"

namespace dflash {

struct BackendOptions {
  std::string backend = "reference";
  std::string precision;  // empty: the backends' default
  int warmup = 1;
  std::vector<std::string> plugin_options;  // KEY=VALUE
  bool isolate = true;  // --isolate (the default) / --no-isolate
  double plugin_timeout_s = 60;
  int tp = 1;                     // --tp: the reference emulating TP = N (docs/spec/tensor-parallel.md)
  std::string tp_reduce = "fp32";  // --tp-reduce
};

void add_backend_options(CLI::App* cmd, BackendOptions* options);

// Parses and checks the options (parse_backends, resolve_precision, check_backends_run_here):
// kBadInput naming the option.
ReplayRequest make_replay_request(const BackendOptions& options);

}  // namespace dflash
