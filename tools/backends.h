// Which drafters a replay runs on, and how they are compared: --backend reference | cuda | both |
// plugin:PATH, or a comma list of them (docs/cli.md).
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "compare/replay.h"
#include "core/proposer.h"
#include "fixtures/fixture.h"
#include "plugin/create_args.h"

namespace dflash {

// One drafter of a replay: the CPU reference, the CUDA drafter, or a plugin (a shared library with
// include/dflash/drafter_plugin.h's ABI).
struct Backend {
  enum class Kind { kReference, kCuda, kPlugin };
  Kind kind = Kind::kReference;
  std::string plugin_path;  // kPlugin
  bool operator==(const Backend& other) const { return kind == other.kind && plugin_path == other.plugin_path; }
};

// "reference", "cuda", "plugin:PATH", "both" (= "reference,cuda"), or a comma list of those; each
// drafter at most once. kBadInput otherwise.
std::vector<Backend> parse_backends(const std::string& text);

// How plugins run: their options (--plugin-option), in a child process or in the harness's
// (--isolate, the default), and how long a call may take there (--plugin-timeout).
struct PluginSettings {
  PluginOptions options;
  bool isolate = true;
  double timeout_s = 60;
};

// The drafters of one replay and the comparisons to make.
struct DrafterSet {
  std::vector<std::unique_ptr<DraftProposer>> drafters;
  std::vector<ReplayLane> lanes;
  std::vector<CrossCheck> cross_checks;
};

// The default precision: fp8 when the CUDA drafter is among the backends, fp64 otherwise
// (docs/cli.md).
Precision resolve_precision(const std::vector<Backend>& backends, const std::optional<std::string>& precision);

// Throws kUnsupported when a backend needs the CUDA drafter and this build or machine has none, or
// the precision is w8a8 (its CUDA kernels are not built), kBadInput for fp64 or fp32 on the CUDA
// drafter (it runs bf16 and fp8), and for a plugin
// that does not load or speaks another ABI version (checked once, before any fixture; in a child
// process when isolated).
void check_backends_run_here(const std::vector<Backend>& backends, Precision precision, const PluginSettings& plugins);

// Without the reference: each backend at `precision`, compared with the fixture.
// With it: the reference in fp64 compared with the fixture; when other backends are listed, the
// reference emulating `precision` compared with each of them (the tight same-precision model), and
// in fp8 and w8a8 the bf16 reference compared with each (that mode's envelope). `both` is reference,cuda.
// The CUDA drafter runs as shipped (CudaOptions' defaults and the environment) except for
// `cuda_warmup`, the eager passes before a graph is captured. Every drafter runs at `tp_size` with
// `tp_reduce` (only the reference emulates TP > 1: make_replay_request refuses the others); a
// fixture whose geometry tp_size does not divide is refused naming its config.json
// (docs/spec/tensor-parallel.md §1).
DrafterSet make_drafters(Fixture& fixture, const std::vector<Backend>& backends, Precision precision, int cuda_warmup,
                         const PluginSettings& plugins, int tp_size = 1,
                         TpReduceDtype tp_reduce = TpReduceDtype::kFp32);

}  // namespace dflash
