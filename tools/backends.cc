#include "tools/backends.h"

#include <algorithm>

#include "core/error.h"
#include "plugin/isolated_drafter.h"
#include "plugin/plugin_drafter.h"
#include "plugin/plugin_library.h"
#include "reference/reference_drafter.h"
#if DFLASH_HAVE_CUDA
#include "cuda/drafter/cuda_drafter.h"
#endif

namespace dflash {
namespace {

// The fixture's head at `precision`, with freed pages poisoned (the debug mode the stored-state
// checks read: a stale read then shows as NaN).
HeadSettings head_for(const Fixture& fixture, Precision precision, int tp_size = 1,
                      TpReduceDtype tp_reduce = TpReduceDtype::kFp32) {
  HeadSettings head = fixture.head;
  head.precision = precision;
  head.tp_size = tp_size;
  head.tp_reduce_dtype = tp_reduce;
  head.poison_freed_pages = true;
  return head;
}

// The reference's K/V of context rows at the lane's precision, for windows as long as the lane's.
ContextKvFunction recompute_for(const Fixture& fixture, Precision precision) {
  const int64_t window = head_for(fixture, precision).resolved(fixture.config).max_window(fixture.config);
  return make_reference_context_kv(fixture.config, fixture.weights, precision, window);
}

bool has_kind(const std::vector<Backend>& backends, Backend::Kind kind) {
  return std::any_of(backends.begin(), backends.end(), [&](const Backend& b) { return b.kind == kind; });
}

std::unique_ptr<DraftProposer> make_cuda(Fixture& fixture, Precision precision, int warmup, int tp_size,
                                         TpReduceDtype tp_reduce) {
  if (warmup < 0) throw bad_input("--warmup " + std::to_string(warmup) + ": expected an integer >= 0");
#if DFLASH_HAVE_CUDA
  CudaOptions options = CudaOptions{}.with_environment();
  options.warmup = warmup;
  return make_cuda_drafter(fixture.config, std::shared_ptr<const DrafterWeights>(fixture.weights),
                           head_for(fixture, precision, tp_size, tp_reduce), options);
#else
  (void)fixture;
  (void)precision;
  (void)tp_size;
  (void)tp_reduce;
  throw unsupported("this dflash-harness was built without the CUDA drafter; --backend cuda/both cannot run here");
#endif
}

std::unique_ptr<DraftProposer> make_plugin(Fixture& fixture, const std::string& path, Precision precision,
                                           const PluginSettings& plugins, int tp_size, TpReduceDtype tp_reduce) {
  const HeadSettings head = head_for(fixture, precision, tp_size, tp_reduce).resolved(fixture.config);
  if (plugins.isolate) {
    return std::make_unique<IsolatedDrafter>(path, fixture.config, fixture.weights, head, fixture.drafter_dir,
                                             fixture.target.path, plugins.options, plugins.timeout_s);
  }
  return std::make_unique<PluginDrafter>(PluginLibrary::open(path), fixture.config, fixture.weights, head,
                                         fixture.drafter_dir, fixture.target.path, plugins.options);
}

}  // namespace

std::vector<Backend> parse_backends(const std::string& text) {
  std::vector<Backend> out;
  const auto add = [&](const Backend& b, const std::string& item) {
    if (std::find(out.begin(), out.end(), b) != out.end()) {
      throw bad_input("--backend '" + text + "': '" + item + "' is listed twice");
    }
    out.push_back(b);
  };
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = text.find(',', at);
    const std::string item = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    if (item == "reference") {
      add({Backend::Kind::kReference, ""}, item);
    } else if (item == "cuda") {
      add({Backend::Kind::kCuda, ""}, item);
    } else if (item == "both") {
      add({Backend::Kind::kReference, ""}, item);
      add({Backend::Kind::kCuda, ""}, item);
    } else if (item.rfind("plugin:", 0) == 0 && item.size() > 7) {
      add({Backend::Kind::kPlugin, item.substr(7)}, item);
    } else {
      throw bad_input("--backend '" + text + "': '" + item +
                      "' is not one of reference, cuda, both, plugin:PATH (a comma list of them is allowed)");
    }
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

Precision resolve_precision(const std::vector<Backend>& backends, const std::optional<std::string>& precision) {
  if (!precision) return has_kind(backends, Backend::Kind::kCuda) ? Precision::kFp8 : Precision::kFp64;
  Precision p;
  if (!parse_precision(*precision, &p)) {
    throw bad_input("--precision '" + *precision + "' is not one of fp64, fp32, bf16, fp8, w8a8");
  }
  return p;
}

void check_backends_run_here(const std::vector<Backend>& backends, Precision precision, const PluginSettings& plugins) {
  for (const Backend& b : backends) {
    if (b.kind != Backend::Kind::kPlugin) continue;
    if (plugins.isolate) {
      check_plugin_isolated(b.plugin_path, plugins.timeout_s);
    } else {
      PluginLibrary::open(b.plugin_path);
    }
  }
  if (!has_kind(backends, Backend::Kind::kCuda)) return;
  if (precision != Precision::kBf16 && precision != Precision::kFp8 && precision != Precision::kW8a8) {
    throw bad_input(std::string("--precision ") + precision_name(precision) +
                    ": the CUDA drafter runs bf16, fp8 or w8a8 (fp64 and fp32 are the reference's alone)");
  }
#if DFLASH_HAVE_CUDA
  std::string why;
  if (!cuda_device_available(&why)) throw unsupported("no CUDA device can run the CUDA drafter here: " + why);
#else
  throw unsupported("this dflash-harness was built without the CUDA drafter (configured with DFLASH_ENABLE_CUDA=OFF "
                    "or without nvcc); --backend cuda/both cannot run here: use --backend reference, or a build "
                    "with the CUDA drafter (ci/build with nvcc) on a machine with a GPU");
#endif
}

DrafterSet make_drafters(Fixture& fixture, const std::vector<Backend>& backends, Precision precision, int cuda_warmup,
                         const PluginSettings& plugins, int tp_size, TpReduceDtype tp_reduce) {
  // docs/spec/tensor-parallel.md §1 checks 3-6 name the config file, before any weight is read.
  check_tensor_parallel(fixture.config, tp_size, fixture.drafter_dir + "/config.json");
  fixture.load_weights();
  DrafterSet set;
  const auto add = [&](std::unique_ptr<DraftProposer> drafter, Precision p, bool with_fixture) {
    set.lanes.push_back({drafter.get(), p, with_fixture, recompute_for(fixture, p)});
    set.drafters.push_back(std::move(drafter));
    return static_cast<int>(set.lanes.size()) - 1;
  };
  const auto reference = [&](Precision p) {
    // A bf16 wire rounds to bf16: the fp64 lane beside a bf16 or fp8 drafter (which rounds nothing to
    // bf16) reduces unrounded; asked alone, the reference refuses it by name.
    const bool beside = backends.size() > 1 && (p == Precision::kFp64 || p == Precision::kFp32);
    return make_reference_drafter(fixture.config, fixture.weights,
                                  head_for(fixture, p, tp_size, beside ? TpReduceDtype::kFp32 : tp_reduce));
  };
  const auto make = [&](const Backend& b) {
    return b.kind == Backend::Kind::kCuda ? make_cuda(fixture, precision, cuda_warmup, tp_size, tp_reduce)
                                          : make_plugin(fixture, b.plugin_path, precision, plugins, tp_size, tp_reduce);
  };
  const bool with_reference = has_kind(backends, Backend::Kind::kReference);
  if (!with_reference) {
    for (const Backend& b : backends) add(make(b), precision, true);
    return set;
  }
  if (backends.size() == 1) {  // the reference alone, at `precision`
    add(reference(precision), precision, true);
    return set;
  }
  const int fp64 = add(reference(Precision::kFp64), Precision::kFp64, true);
  const int same = precision == Precision::kFp64 ? fp64 : add(reference(precision), precision, false);
  int bf16 = -1;
  for (const Backend& b : backends) {
    if (b.kind == Backend::Kind::kReference) continue;
    const int lane = add(make(b), precision, false);
    set.cross_checks.push_back({same, lane});
    if (precision != Precision::kFp8 && precision != Precision::kW8a8) continue;
    if (bf16 < 0) bf16 = add(reference(Precision::kBf16), Precision::kBf16, false);  // the fp8 / w8a8 envelope
    set.cross_checks.push_back({bf16, lane});
  }
  return set;
}

}  // namespace dflash
