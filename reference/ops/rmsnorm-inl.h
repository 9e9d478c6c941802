// RMSNorm kernel, compiled once per Highway target (included from ops.cc via foreach_target.h).
// Same formula and operation order as scalar::rms_norm; only the order of the sum of squares
// differs (lanes, then the tail), which the tests bound.
#if defined(DFLASH_REFERENCE_OPS_RMSNORM_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef DFLASH_REFERENCE_OPS_RMSNORM_INL_H_
#undef DFLASH_REFERENCE_OPS_RMSNORM_INL_H_
#else
#define DFLASH_REFERENCE_OPS_RMSNORM_INL_H_
#endif

#include <cmath>
#include <cstddef>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace dflash {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <typename T>
HWY_INLINE T SumOfSquares(const T* HWY_RESTRICT x, size_t n) {
  const hn::ScalableTag<T> d;
  const size_t lanes = hn::Lanes(d);
  auto acc = hn::Zero(d);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto v = hn::LoadU(d, x + i);
    acc = hn::Add(acc, hn::Mul(v, v));
  }
  T sum = hn::GetLane(hn::SumOfLanes(d, acc));
  for (; i < n; ++i) sum += x[i] * x[i];
  return sum;
}

// out may alias x: each element is read before its own store, and no other element is read later.
template <typename T>
HWY_INLINE void RmsNorm(const T* x, const T* HWY_RESTRICT weight, size_t n, T eps, T* out) {
  const T inv = T(1) / std::sqrt(SumOfSquares(x, n) / static_cast<T>(n) + eps);
  const hn::ScalableTag<T> d;
  const size_t lanes = hn::Lanes(d);
  const auto vinv = hn::Set(d, inv);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    hn::StoreU(hn::Mul(hn::LoadU(d, weight + i), hn::Mul(hn::LoadU(d, x + i), vinv)), d, out + i);
  }
  for (; i < n; ++i) out[i] = weight[i] * (x[i] * inv);
}

}  // namespace HWY_NAMESPACE
}  // namespace dflash
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
