#include "tools/run_replay.h"

#include <exception>
#include <new>

#include "core/error.h"
#include "tools/hints.h"

namespace dflash {

ReplayResult read_and_replay(const std::string& path, const ReplayRequest& request,
                             const std::function<void(const Fixture&)>& prepare) {
  // Whatever escapes one fixture becomes its error, naming it, so a run over many goes on to the
  // next (HarnessErrors already name what they are about and keep their kind; anything else is a
  // bug of the harness, an internal error).
  try {
    check_fixture_path(path);
    Fixture fixture = read_fixture(path);
    if (prepare) prepare(fixture);
    DrafterSet drafters;
    try {
      drafters = make_drafters(fixture, request.backends, request.precision, request.cuda_warmup, request.plugins,
                               request.tp_size, request.tp_reduce_dtype);
    } catch (const DrafterFault& fault) {  // a plugin that crashed or hung in create: this fixture fails
      ReplayResult result;
      result.fixture_name = fixture.name;
      result.fixture_dir = fixture.dir;
      result.expect_precision = fixture.expect_precision;
      result.num_layers = fixture.config.num_layers;
      result.total_steps = static_cast<int>(fixture.steps.size());
      result.drafter_fault = DrafterFaultRecord{-1, fault.proposer(), fault.event(), fault.during()};
      return result;
    }
    ReplayOptions options = request.options;
    options.tp_size = request.tp_size;  // a divergence names its ranks (docs/spec/tensor-parallel.md §7)
    return replay_fixture(fixture, drafters.lanes, drafters.cross_checks, options);
  } catch (const HarnessError&) {
    throw;
  } catch (const std::bad_alloc&) {
    throw bad_input(path + ": out of memory (std::bad_alloc) while reading or replaying this fixture");
  } catch (const std::exception& e) {
    throw internal_error(path + ": unexpected error while reading or replaying this fixture: " + e.what());
  } catch (...) {
    throw internal_error(path + ": an unknown exception while reading or replaying this fixture");
  }
}

}  // namespace dflash
