// The benchmarks' statistic: the median of a run's timings.
#pragma once
#include <algorithm>
#include <vector>

namespace dflash {

// The median of `v` (the upper middle element of an even count).
inline float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace dflash
