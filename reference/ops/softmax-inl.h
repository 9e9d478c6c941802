// Softmax kernel, compiled once per Highway target. exp is Highway's contrib Exp (documented max
// error 1 ulp in float and double; arguments here are <= 0, inside its valid range). The max is
// exact; the sum's order differs from scalar::softmax, which the tests bound.
#if defined(DFLASH_REFERENCE_OPS_SOFTMAX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef DFLASH_REFERENCE_OPS_SOFTMAX_INL_H_
#undef DFLASH_REFERENCE_OPS_SOFTMAX_INL_H_
#else
#define DFLASH_REFERENCE_OPS_SOFTMAX_INL_H_
#endif

#include <cmath>
#include <cstddef>

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace dflash {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Largest value of x[0..n), n >= 1 (no NaN: the caller's inputs are finite).
template <typename T>
HWY_INLINE T MaxValue(const T* HWY_RESTRICT x, size_t n) {
  const hn::ScalableTag<T> d;
  const size_t lanes = hn::Lanes(d);
  T max = x[0];
  size_t i = 0;
  if (n >= lanes) {
    auto vmax = hn::LoadU(d, x);
    for (i = lanes; i + lanes <= n; i += lanes) vmax = hn::Max(vmax, hn::LoadU(d, x + i));
    max = hn::GetLane(hn::MaxOfLanes(d, vmax));
  }
  for (; i < n; ++i) max = x[i] > max ? x[i] : max;
  return max;
}

template <typename T>
HWY_INLINE void Softmax(T* HWY_RESTRICT x, size_t n) {
  const hn::ScalableTag<T> d;
  const size_t lanes = hn::Lanes(d);
  const T max = MaxValue(x, n);
  const auto vmax = hn::Set(d, max);
  auto vsum = hn::Zero(d);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto e = hn::Exp(d, hn::Sub(hn::LoadU(d, x + i), vmax));
    hn::StoreU(e, d, x + i);
    vsum = hn::Add(vsum, e);
  }
  T sum = hn::GetLane(hn::SumOfLanes(d, vsum));
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  const auto vdenominator = hn::Set(d, sum);
  for (i = 0; i + lanes <= n; i += lanes) hn::StoreU(hn::Div(hn::LoadU(d, x + i), vdenominator), d, x + i);
  for (; i < n; ++i) x[i] = x[i] / sum;
}

}  // namespace HWY_NAMESPACE
}  // namespace dflash
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
