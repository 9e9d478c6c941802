// Random drafters for the GPU tests and the benchmark: the geometries and the seeded generator live
// in fixtures/ (one copy for every user); this header keeps the GPU tests' spelling of them.
#pragma once
#include "fixtures/geometries.h"
#include "fixtures/random_drafter.h"

namespace dflash {

// The GPU tests build their small geometries field by field under this name.
using RandomGeometry = DrafterGeometry;

}  // namespace dflash
