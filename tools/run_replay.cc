#include "tools/run_replay.h"

namespace dflash {

ReplayResult read_and_replay(const std::string& path, const ReplayRequest& request,
                             const std::function<void(const Fixture&)>& prepare) {
  Fixture fixture = read_fixture(path);
  if (prepare) prepare(fixture);
  DrafterSet drafters = make_drafters(fixture, request.backend, request.precision);
  return replay_fixture(fixture, drafters.lanes, drafters.cross_checks, request.options);
}

}  // namespace dflash
