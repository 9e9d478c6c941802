// One fixture read, its drafters made and its steps replayed: shared by `replay` and `bisect`.
#pragma once
#include <string>
#include <vector>

#include "compare/replay.h"
#include "tools/backends.h"

namespace dflash {

struct ReplayRequest {
  std::vector<Backend> backends = {Backend{}};  // the reference
  Precision precision = Precision::kFp64;
  PluginSettings plugins;
  // Eager passes of the CUDA drafter before it captures the graph of a (width, batch); the
  // command's --warmup, applied over DFLASH_CUDA_WARMUP so short fixtures reach graph replays.
  int cuda_warmup = 1;
  // The reference emulating TP = N (docs/spec/tensor-parallel.md), its row-parallel reduction dtype.
  int tp_size = 1;
  TpReduceDtype tp_reduce_dtype = TpReduceDtype::kFp32;
  ReplayOptions options;
};

// Reads the fixture at `path` and replays it. `prepare` (optional) sees the fixture after reading
// and before anything runs, to refuse a request that does not fit it. Every failure comes out as
// a HarnessError naming the fixture: a path that is no fixture is bad input with a hint
// (tools/hints.h), std::bad_alloc is bad input (out of memory), and any other exception
// (std::length_error, ...) an internal error with `path` and its message.
ReplayResult read_and_replay(const std::string& path, const ReplayRequest& request,
                             const std::function<void(const Fixture&)>& prepare = {});

}  // namespace dflash
