// Argmax kernel, compiled once per Highway target: lowest index of the largest value, NaN never
// wins, all NaN gives 0 (scalar::argmax). Two passes (the max, then the first lane equal to it),
// so the answer never depends on lane order: a value-only reduction cannot pick a later index.
#if defined(DFLASH_REFERENCE_OPS_ARGMAX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef DFLASH_REFERENCE_OPS_ARGMAX_INL_H_
#undef DFLASH_REFERENCE_OPS_ARGMAX_INL_H_
#else
#define DFLASH_REFERENCE_OPS_ARGMAX_INL_H_
#endif

#include <cstddef>
#include <limits>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace dflash {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <typename T>
HWY_INLINE size_t Argmax(const T* HWY_RESTRICT x, size_t n) {
  const hn::ScalableTag<T> d;
  const size_t lanes = hn::Lanes(d);
  const T lowest = -std::numeric_limits<T>::infinity();
  // Pass 1: the largest non-NaN value (NaN lanes become -inf; x == x is false only for NaN).
  auto vmax = hn::Set(d, lowest);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto v = hn::LoadU(d, x + i);
    vmax = hn::Max(vmax, hn::IfThenElse(hn::Eq(v, v), v, hn::Set(d, lowest)));
  }
  T max = hn::GetLane(hn::MaxOfLanes(d, vmax));
  for (; i < n; ++i) max = x[i] > max ? x[i] : max;
  // Pass 2: the first element equal to it.
  const auto target = hn::Set(d, max);
  for (i = 0; i + lanes <= n; i += lanes) {
    const intptr_t lane = hn::FindFirstTrue(d, hn::Eq(hn::LoadU(d, x + i), target));
    if (lane >= 0) return i + static_cast<size_t>(lane);
  }
  for (; i < n; ++i) {
    if (x[i] == max) return i;
  }
  return 0;
}

}  // namespace HWY_NAMESPACE
}  // namespace dflash
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
